"""Number formatting shared by the Markdown the lab writes (a run's summary, the
reproduction report, the comparison of two reports)."""

from __future__ import annotations

import math


def figure(v, unit: str = "") -> str:
    """A figure of the reproduction report: three significant digits below 10, one decimal
    below 100, none above; "—" for no value, "∞" for an infinite one. Rates (unit "Mbit/s")
    carry their unit, in kbit/s below 0.1 Mbit/s: a row's interval may span both."""
    if v is None:
        return "—"
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    if unit == "Mbit/s":
        if abs(v) < 0.1:
            return f"{v * 1000:.1f} kbit/s"
        return figure(v) + " Mbit/s"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"


def fixed(v, nd: int = 2) -> str:
    """A value of a run's summary: floats with `nd` decimals, other values as they are, "-"
    for no value."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)
