"""Experiment registry for `hoplab reproduce`: the papers' evaluations as generated specs
(what an experiment is: experiments/base.py).

The papers' own figures live in `paper.toml` beside this file (one row per figure, with its
section/table reference); `hoplab.reproduce` joins them with the measurements.
"""

from __future__ import annotations

from . import atp, dtn_hop, hop_paper, hxh
from .base import Experiment


def registry() -> dict[str, Experiment]:
    out: dict[str, Experiment] = {}
    for mod in (hop_paper, hxh, atp, dtn_hop):
        for e in mod.experiments():
            if e.id in out:
                raise ValueError(f"duplicate experiment id {e.id}")
            out[e.id] = e
    return out
