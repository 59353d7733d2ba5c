"""`hoplab compare OLD NEW`: two reproduction reports row by row.

Rows of `report.json` are matched by experiment, figure and point. For each row the table
gives the paper's figure, both reports' figures with their 95 % intervals and run counts, the
ratio new / old, and whether the two intervals overlap ("apart" is the first hint that a
change moved a figure by more than the run-to-run spread; with few repetitions the
intervals are optimistic, so "overlap" is the weaker statement). Rows that only one report
has, or that one report could not measure, are listed with the other report's reason.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import LabError
from .fmt import figure


def load_report(path: Path) -> dict:
    """A report.json, given directly or as the reproduction directory that holds it."""
    p = path / "report.json" if path.is_dir() else path
    try:
        rep = json.loads(p.read_text())
    except OSError as e:
        raise LabError(f"cannot read {p}: {e.strerror or e}") from e
    except ValueError as e:
        raise LabError(f"{p} is not a report.json: {e}") from e
    if not isinstance(rep, dict) or not isinstance(rep.get("experiments"), list):
        raise LabError(f"{p} is not a report.json of hoplab reproduce (no experiments list)")
    return rep


def _rows(rep: dict) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for e in rep["experiments"]:
        for r in e.get("rows", []):
            key = (e["id"], r["what"], None if r.get("point") is None else str(r["point"]))
            out[key] = r
    return out


def _cell(r: dict | None) -> str:
    if r is None:
        return "not in report"
    if r.get("status") != "ok":
        return f"{r.get('status', '?')}" + (f": {r['note']}" if r.get("note") else "")
    if r.get("ours") is None:
        return f"— ({r.get('note') or 'undefined'}; n={r.get('n')})"
    unit = r.get("unit", "")
    s = figure(r["ours"], unit) + ("×" if unit == "x" else "")
    ci = r.get("ci")
    if ci and ci[0] is not None and ci[1] is not None:
        s += f" [{figure(ci[0], unit)}, {figure(ci[1], unit)}]"
    if r.get("ci_over") == "flows":
        return s + " (n=1 run, interval over its flows)"
    return s + f" (n={r.get('n')})"


def _paper(r: dict) -> str:
    unit = r.get("unit", "")
    if r.get("paper") is not None:
        return figure(r["paper"], unit) + ("×" if unit == "x" else "")
    if r.get("paper_range"):
        lo, hi = r["paper_range"]
        return f"{lo:g}–{hi:g}×"
    return "figure only"


def overlap(a: dict, b: dict) -> str:
    """"overlap", "apart", or "—" when either row has no interval."""
    ca, cb = a.get("ci"), b.get("ci")
    if not ca or not cb or None in ca or None in cb:
        return "—"
    return "overlap" if ca[0] <= cb[1] and cb[0] <= ca[1] else "apart"


def compare(old: dict, new: dict, only_apart: bool = False) -> list[dict]:
    ro, rn = _rows(old), _rows(new)
    keys = list(ro) + [k for k in rn if k not in ro]
    out = []
    for k in keys:
        a, b = ro.get(k), rn.get(k)
        both = (a is not None and b is not None and a.get("status") == "ok" and b.get("status") == "ok"
                and a.get("ours") is not None and b.get("ours") is not None)
        change = None
        if both and a["ours"] != 0:
            change = b["ours"] / a["ours"]
        ov = overlap(a, b) if both else "—"
        if only_apart and ov != "apart":
            continue
        out.append({"experiment": k[0], "what": k[1], "point": k[2], "paper": _paper(b or a),
                    "old": _cell(a), "new": _cell(b), "new_over_old": change, "intervals": ov})
    return out


def markdown(old: dict, new: dict, rows: list[dict], old_name: str, new_name: str) -> str:
    def meta(rep: dict) -> str:
        m = rep.get("meta", {})
        return f"{m.get('date', '?')}, commit {m.get('commit', '?')}, machine {m.get('machine', '?')}"

    lines = [f"Old: {old_name} ({meta(old)}).", f"New: {new_name} ({meta(new)}).", "",
             "| experiment | figure | paper | old [95 % CI] | new [95 % CI] | new / old | intervals |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        what = r["what"] if r["point"] is None or r["point"] in r["what"] else f"{r['what']} ({r['point']})"
        ch = "—" if r["new_over_old"] is None else f"{figure(r['new_over_old'])}×"
        lines.append(f"| {r['experiment']} | {what} | {r['paper']} | {r['old']} | {r['new']} | {ch} "
                     f"| {r['intervals']} |")
    apart = sum(1 for r in rows if r["intervals"] == "apart")
    lines += ["", f"{len(rows)} rows; {apart} with intervals apart."]
    return "\n".join(lines)


def main(a) -> int:
    old, new = load_report(Path(a.old)), load_report(Path(a.new))
    rows = compare(old, new, only_apart=a.apart)
    print(markdown(old, new, rows, a.old, a.new))
    return 0
