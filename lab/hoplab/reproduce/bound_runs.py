"""`hoplab bound` on runs on disk: a run's results.json, or every draw of a reproduction's
output directory with the goodputs its report uses (hoplab.bound has the bound itself)."""

from __future__ import annotations

import json
from pathlib import Path

from ..bound import draw_bound, markdown
from ..errors import LabError
from .runner import cut_off_goodput


def _draws(path, measure: str = "m") -> list[tuple[str, list[tuple[str, list[dict]]], dict]]:
    """(label, [(variant, flows)], results of one run) for a run's results.json or for every
    draw of a reproduction directory (its runs.json: the goodputs the report uses; the flows
    whose label starts with `measure` when any does, as the report measures them)."""

    def pick(flows: list[dict]) -> list[dict]:
        m = [f for f in flows if str(f.get("label", "")).startswith(measure)]
        return m or flows

    p = Path(path)
    if p.is_dir() and (p / "runs.json").exists():
        groups: dict[tuple, list] = {}
        for r in json.loads((p / "runs.json").read_text()):
            if r.get("status") != "valid" or len(pick(r.get("flows") or [])) < 2:
                continue
            groups.setdefault((r["experiment"], str(r.get("point")), r["rep"]), []).append(r)
        out = []
        for (exp, point, rep), rs in sorted(groups.items()):
            try:
                res = json.loads((p / rs[0]["dir"] / "results.json").read_text())
            except (OSError, ValueError) as e:
                raise LabError(f"cannot read the results of {exp} {point} draw {rep}: {e}") from e
            out.append((f"{exp} {point} draw {rep}", [(r["variant"], pick(r["flows"])) for r in rs], res))
        if not out:
            raise LabError(f"{p}/runs.json has no valid run with two flows or more")
        return out
    f = p / "results.json" if p.is_dir() else p
    try:
        res = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise LabError(f"cannot read {f}: {e}") from e
    flows = pick(cut_off_goodput(res.get("flows") or [], res.get("wall_seconds"), bool(res.get("timed_out"))))
    if len(flows) < 2:
        raise LabError(f"{f} has fewer than two flows: nothing to share")
    return [(res.get("name") or f.parent.name, [(res.get("name") or "run", flows)], res)]


def bound_table_for(path, jain: float = 0.78) -> list[str]:
    """`hoplab bound`: the Markdown table for a run or a reproduction directory."""
    return markdown([(label, draw_bound(res, variants, jain)) for label, variants, res in _draws(path)], jain)
