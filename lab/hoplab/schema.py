"""Checking the tables of a TOML spec: types, unknown keys, sizes and rates.

Every error is a SpecError that names where in the spec it is (`where`, e.g. "flow[2]").
"""

from __future__ import annotations

import re

from .errors import SpecError

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kKmMgG]?)(i?)[bB]?\s*$")


def parse_size(v) -> int:
    """'10MB' -> 10_000_000, '64KiB' -> 65536, 1500 -> 1500."""
    if isinstance(v, bool):
        raise SpecError(f"bad size {v!r}")
    if isinstance(v, (int, float)):
        if v < 0:
            raise SpecError(f"negative size {v}")
        return int(v)
    m = _SIZE.match(str(v))
    if not m:
        raise SpecError(f"bad size {v!r}")
    num, unit, binary = float(m.group(1)), m.group(2).lower(), m.group(3)
    base = 1024 if binary else 1000
    mult = {"": 1, "k": base, "m": base**2, "g": base**3}[unit]
    return int(num * mult)


def parse_rate(v) -> float:
    """'8kbit' / '2Mbit' / 8000 -> bits per second."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    m = re.match(r"^\s*([0-9]*\.?[0-9]+)\s*([kKmMgG]?)(bit|bps|b)?(/s)?\s*$", str(v))
    if not m:
        raise SpecError(f"bad rate {v!r}")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()]


def take(d: dict, key: str, typ, default, where: str):
    if key not in d:
        return default
    v = d[key]
    if typ is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, typ) or (typ in (int, float) and isinstance(v, bool)):
        raise SpecError(f"{where}.{key}: expected {typ.__name__}, got {v!r}")
    return v


def check_keys(d: dict, allowed: set[str], where: str) -> None:
    extra = set(d) - allowed
    if extra:
        raise SpecError(f"{where}: unknown keys {sorted(extra)}")
