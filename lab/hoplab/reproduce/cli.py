"""`hoplab reproduce`: the command (options parsed by hoplab.cli), from the selection of
experiments to the report."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .. import mediumserver, spec as specmod
from ..errors import LabError, SpecError
from ..experiments import registry
from ..experiments.base import RUN_OVERHEAD_S, Experiment
from .paper import check_rows, load_paper
from .report import aggregate
from .runner import git_commit, machine, retry_limit, run_all
from .tables import hop_data_counts


def estimate(exps: list[Experiment], quick: bool, reps: int | None,
             points: list[str] | None = None, variants: set[str] | None = None,
             diagnostics: bool = False) -> tuple[int, float, list[str]]:
    lines, runs, secs = [], 0, 0.0
    for e in exps:
        n, s = e.estimate(quick, reps, points, variants, diagnostics)
        if n:
            lines.append(f"  {e.id:<14} {n:3d} runs  ~{s / 60:5.1f} min  {e.title}")
        runs += n
        secs += s
    return runs, secs, lines


def parse_medium_overrides(items: list[str]) -> dict:
    """`KEY=VALUE` settings of the medium table (values in TOML/JSON syntax, e.g.
    link_status=true, retry_limit=3), checked against the spec's medium keys."""
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        k = k.strip()
        if not sep or not k:
            raise SpecError(f"--medium {it!r}: write KEY=VALUE, e.g. --medium link_status=true")
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v.strip()  # a bare word: a string (e.g. standard=g)
    if out:
        # Unknown keys and bad types fail here, before any run.
        specmod.from_dict({"medium": out, "topology": {"kind": "chain", "nodes": 2},
                           "flow": [{"src": 0, "dst": 1, "size": "1KB"}]})
    return out


def main(a) -> int:
    reg = registry()
    rows = load_paper()
    check_rows(rows, reg)
    quick = bool(a.quick)
    if a.only:
        ids = [x.strip() for x in a.only.split(",") if x.strip()]
        bad = [x for x in ids if x not in reg]
        if bad:
            raise SpecError(f"unknown experiment(s) {bad}; known: {sorted(reg)}")
        exps = [reg[x] for x in ids]
    else:
        exps = [e for e in reg.values() if e.scale(quick) is not None and not e.opt_in]
    exps = [e for e in exps if e.scale(quick) is not None]
    if not exps:
        raise SpecError("no experiment has a " + ("quick" if quick else "full") + " preset in this selection")
    if a.reps is not None and a.reps < 1:
        raise SpecError("--reps must be >= 1")
    if getattr(a, "resume", False) and not a.out:
        raise SpecError("--resume needs --out DIR (the directory of the reproduction to continue)")
    if a.retry_invalid is not None and a.retry_invalid < 0:
        raise SpecError("--retry-invalid must be >= 0")
    points = [x.strip() for x in a.points.split(",")] if getattr(a, "points", None) else None
    variants = None
    if getattr(a, "variants", None):
        variants = {x.strip() for x in a.variants.split(",") if x.strip()}
        known = {v.name for e in exps for v in e.variants}
        if variants - known:
            raise SpecError(f"unknown variant(s) {sorted(variants - known)} in this selection; known: {sorted(known)}")
    medium = parse_medium_overrides(getattr(a, "medium", None) or [])
    diagnostics = bool(getattr(a, "diagnostics", False))
    n, secs, lines = estimate(exps, quick, a.reps, points, variants, diagnostics)
    if not a.report_only:
        print(f"hoplab reproduce ({'quick' if quick else 'full'}): {n} runs, estimated {secs / 60:.0f} min "
              f"(~{RUN_OVERHEAD_S:.0f} s set-up per run plus its flows; each repeat of an invalid run adds one run)")
        print("\n".join(lines))
        chosen = {e.id for e in exps}
        extra = [e for e in reg.values() if e.opt_in and e.id not in chosen and e.scale(quick) is not None]
        if a.list and extra:
            print("not in the preset, run with --only ID:")
            print("\n".join(estimate(extra, quick, a.reps, points, variants)[2]))
        if a.list and not diagnostics and variants is None:
            dn, dsecs, _ = estimate(exps, quick, a.reps, points, None, True)
            if dn > n:
                print(f"with --diagnostics (our variants that explain figures): {dn - n} more runs, "
                      f"~{(dsecs - secs) / 60:.0f} min more")
    if a.list:
        return 0
    out = Path(a.out) if a.out else Path("results") / "reproduce" / (
        time.strftime("%Y%m%d-%H%M%S") + ("-quick" if quick else "-full"))
    if not a.report_only:
        out.mkdir(parents=True, exist_ok=True)
    meta = {"preset": "quick" if quick else "full", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine(), "commit": git_commit(), "command": "hoplab reproduce " + " ".join(sys.argv[2:]),
            "estimate_min": round(secs / 60, 1)}
    if a.report_only:
        try:
            records = json.loads((out / "runs.json").read_text())
        except (OSError, ValueError) as e:
            raise LabError(f"cannot read {out / 'runs.json'}: {e}") from e
        ids = {e.id for e in exps}
        records = [r for r in records if r["experiment"] in ids]
        for r in records:
            # Runs recorded before their Hop counters were summed: from the hopd statuses kept
            # in the run's directory.
            if "hop_data" not in r and r.get("dir") and r["status"] in ("valid", "invalid"):
                r["hop_data"] = hop_data_counts(out / r["dir"])
        meta["wall_min"] = sum(r.get("wall_s", 0.0) for r in records) / 60
        meta["retry_invalid"] = retry_limit(records)
    else:
        t0 = time.time()
        retry = a.retry_invalid if a.retry_invalid is not None else (0 if quick else 1)
        meta["retry_invalid"] = retry
        previous = None
        if getattr(a, "resume", False):
            try:
                previous = json.loads((out / "runs.json").read_text())
            except (OSError, ValueError) as e:
                raise LabError(f"--resume: cannot read {out / 'runs.json'}: {e}") from e
            print(f"resuming: {sum(1 for r in previous if r['status'] == 'valid')} valid runs kept from "
                  f"{out / 'runs.json'}")
        with mediumserver.serving():
            records = run_all(exps, quick, a.reps, out, points=points, retry_invalid=retry, previous=previous,
                              variants=variants, medium=medium, diagnostics=diagnostics)
        meta["wall_min"] = sum(r.get("wall_s", 0.0) for r in records) / 60
    ran = [r for r in records if r.get("started")]
    if ran:  # a resumed reproduction may span several runs of the command (and commits): say so
        # from the first run's start to the last run's end (older records have no end)
        first, last = min(r["started"] for r in ran), max(r.get("ended") or r["started"] for r in ran)
        meta["date"] = first if first == last else f"{first} to {last}"
        meta["commit"] = ", ".join(sorted({r.get("commit", "?") for r in ran}))
    aggregate(records, exps, rows, out, meta)
    bad = sum(1 for r in records if r["status"] in ("invalid", "error"))
    failed = sum(1 for r in records if r["status"] == "error")
    print(f"hoplab reproduce: {len(records)} runs ({bad} invalid or failed, excluded) in "
          f"{meta['wall_min']:.1f} min -> {out / 'report.md'}, {out / 'report.json'}")
    # Invalid runs (lag) depend on the machine's load and are reported; a failed run means
    # the pipeline is broken.
    return 1 if failed else 0
