"""The papers' figures (experiments/paper.toml): one Row per figure, checked against the
registered experiments."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError
from ..experiments.base import Experiment
from .stats import STAT_UNITS, stat_fn

PAPER_TABLE = Path(__file__).resolve().parents[1] / "experiments" / "paper.toml"


@dataclass
class Row:
    experiment: str
    what: str
    stat: str
    variant: str
    ref: str
    versus: str | None = None
    point: object = None
    value: float | None = None
    range: tuple[float, float] | None = None
    unit: str = "x"


def load_paper(path: Path = PAPER_TABLE) -> list[Row]:
    try:
        d = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SpecError(f"{path}: {e}") from e
    rows = []
    allowed = {"experiment", "what", "stat", "variant", "versus", "point", "value", "range", "unit", "ref"}
    for i, r in enumerate(d.get("row", [])):
        extra = set(r) - allowed
        missing = {"experiment", "what", "stat", "variant", "ref"} - set(r)
        if extra or missing:
            raise SpecError(f"{path}: row {i}: unknown keys {sorted(extra)}, missing {sorted(missing)}")
        rng = r.get("range")
        if rng is not None and (len(rng) != 2 or rng[0] > rng[1]):
            raise SpecError(f"{path}: row {i}: range must be [lo, hi]")
        if "value" in r and rng is not None:
            raise SpecError(f"{path}: row {i}: give value or range, not both")
        stat_fn(r["stat"])
        unit = r.get("unit", "x" if "versus" in r else STAT_UNITS.get(r["stat"], "Mbit/s"))
        # One figure of the paper may be compared with several experiments (the same setup on
        # other topologies): `experiment` is then a list.
        exps = r["experiment"] if isinstance(r["experiment"], list) else [r["experiment"]]
        if not exps or not all(isinstance(x, str) for x in exps):
            raise SpecError(f"{path}: row {i}: experiment must be an id or a non-empty list of ids")
        for exp in exps:
            rows.append(Row(experiment=exp, what=r["what"], stat=r["stat"], variant=r["variant"],
                            ref=r["ref"], versus=r.get("versus"), point=r.get("point"),
                            value=float(r["value"]) if "value" in r else None,
                            range=(float(rng[0]), float(rng[1])) if rng else None, unit=unit))
    return rows


def check_rows(rows: list[Row], reg: dict[str, Experiment]) -> None:
    """Every row names a registered experiment, its variants and one of its points."""
    for r in rows:
        e = reg.get(r.experiment)
        if e is None:
            raise SpecError(f"paper row {r.what!r}: unknown experiment {r.experiment}")
        for v in filter(None, (r.variant, r.versus)):
            e.variant(v)
        if r.point is not None and r.point not in e.full.points:
            raise SpecError(f"paper row {r.what!r}: point {r.point!r} not among {e.full.points}")
