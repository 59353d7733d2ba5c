"""Error types of the lab."""


class LabError(Exception):
    """A problem the user can act on (bad spec, missing tool, failed setup)."""


class SpecError(LabError):
    """The experiment specification is invalid."""
