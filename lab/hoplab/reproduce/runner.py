"""Running a reproduction: the plan (experiment, point, repetition, protocol), one run
after the other with repeats of invalid runs, resume of an interrupted reproduction, and
the record of every run."""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import time
from pathlib import Path

from .. import spec as specmod
from ..drivers import HopDriver
from ..drivers.dtn import dtnd_binary
from ..dynroute import binary as routing_daemon
from ..errors import LabError, SpecError
from ..experiments.base import Experiment, Variant
from ..results import percentile
from ..run import run_spec
from ..spec import DYNAMIC_ROUTING
from .stats import STATS, measured
from .tables import hop_data_counts, point_key


def unavailable(v: Variant) -> str | None:
    """Why this protocol cannot run on this machine (None: it can)."""
    if v.unsupported:
        return v.unsupported
    try:
        if v.spec.get("routing") in DYNAMIC_ROUTING:
            routing_daemon()
        if v.driver in ("hop", "dtn-hop"):
            HopDriver.binary("hopd")
            HopDriver.binary("hop")
        if v.driver == "dtn-hop":
            HopDriver.binary("hop-dtn")
        if v.driver in ("dtn", "dtn-hop"):
            dtnd_binary()
    except LabError as e:
        return str(e)
    return None


def cut_off_goodput(flows: list[dict], wall_s: float | None, timed_out: bool) -> list[dict]:
    """Goodput of the transfers the run's end cut off: bytes over the time the flow had (its
    start to the end of the run), as for the papers' long-lived flows measured at a point in
    time (Hop §5.3: "goodputs of flows half an hour into the experiment"). The lab's own
    figure (bytes / time to the last byte, Hop §5.1.1) would credit a flow that starved after
    its first packets with its early rate; it is kept as goodput_last_byte_mbps."""
    out = []
    for f in flows:
        f = dict(f)
        # Background flows are cut off when the others are done, whether or not the run timed out.
        cut = timed_out or bool(f.get("background"))
        if cut and wall_s and not f.get("complete") and f.get("size") is not None:
            f["goodput_last_byte_mbps"] = f["goodput_mbps"]
            f["goodput_mbps"] = f["bytes"] * 8 / 1e6 / max(1e-3, wall_s - float(f.get("start_offset") or 0.0))
            f["cut_off"] = True
        out.append(f)
    return out


def snapshot(res: dict, at: float) -> dict:
    """A run's flows as they stood `at` seconds in (from its `progress` series), with the
    goodput the report uses for flows still running: bytes over the time each had by then.
    Returns {"at": time of the sample used, "flows": [...], "stats": {median, mean, total,
    jain_hw, ...}, "bytes": total, "empty": flows with nothing}."""
    prog = res.get("progress") or {}
    rows = [r for r in prog.get("rows", []) if r[0] <= at]
    if not rows:
        raise LabError(f"the run has no progress sample at or before {at:g} s "
                       "(runs before the lab recorded its progress series have none)")
    t = float(rows[-1][0])
    # Received bytes never fall: a sample below an earlier one is a status that was not
    # answered in time (runs before 2026-11-25 recorded it as 0), so each flow counts the
    # largest of its samples so far.
    row = [t, *(max(r[i] for r in rows) for i in range(1, len(rows[-1])))]
    labels = prog["columns"][1:]
    by_label = {f["label"]: f for f in res.get("flows", [])}
    flows = []
    for label, nbytes in zip(labels, row[1:]):
        f = dict(by_label.get(label, {"label": label}))
        had = t - float(f.get("start_offset") or 0.0)
        f["bytes"] = int(nbytes)
        f["goodput_mbps"] = nbytes * 8 / 1e6 / had if had > 0 else 0.0
        flows.append(f)
    run = {"flows": flows, "duration": t}
    stats = {k: STATS[k]([run], "") for k in ("median", "mean", "q1", "q3", "total", "jain", "jain_hw")}
    return {"at": t, "flows": flows, "stats": stats, "bytes": sum(f["bytes"] for f in flows),
            "empty": sum(1 for f in flows if f["bytes"] == 0)}


def materialize(d: dict, run_dir: Path) -> dict:
    """Write an inline topology (`_topology`) as a file the spec points to."""
    d = json.loads(json.dumps(d))
    topo = d.pop("_topology", None)
    if topo is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        p = run_dir / "topology.json"
        p.write_text(json.dumps(topo))
        d["topology"] = {"kind": "file", "file": str(p.resolve())}
    return d


def prune_raw(run_dir: Path) -> None:
    """Delete the bulky transfer files of a finished run (source files and received copies);
    logs and result JSON stay."""
    raw = run_dir / "raw"
    for p in list(raw.glob("hop-send-*.bin")):
        p.unlink(missing_ok=True)
    # hop-dtn's copies of the bundles it carries, failed or unresolved (its counters stay).
    copies = [p for sub in ("outgoing", "failed", "rejected", "unresolved") for p in raw.glob(f"hopdtn-*/{sub}")]
    for p in list(raw.glob("hop-recv-*")) + list(raw.glob("hopd-*/store")) + copies:
        shutil.rmtree(p, ignore_errors=True)


def plan(exps: list[Experiment], quick: bool, reps: int | None, points: list[str] | None = None,
         variants: set[str] | None = None, diagnostics: bool = False) -> list[tuple]:
    """(experiment, point, repetition, variant) in running order: for each point and
    repetition, the compared protocols back to back. `points` keeps only those points
    (compared as text, e.g. "2" or "16KB"), `variants` only the variants of those names;
    diagnostic variants run when named there or with `diagnostics`."""
    out = []
    for e in exps:
        sc = e.scale(quick)
        if sc is None:
            continue
        for p in sc.points:
            if points is not None and point_key(p) not in points:
                continue
            for rep in range(reps or sc.reps):
                for v in e.variants:
                    if e.runs_variant(v, quick, variants, diagnostics):
                        out.append((e, p, rep, v))
    return out


# An invalid run whose medium was saturated (its event loop on the CPU, `lag.cause`) for more
# than this long is not repeated: on the project's machine one such repeat in 23 was valid
# (none of 20 after 7.3-122 s behind, 2026-11-25; one of three, 30 TCP flows after 44 s
# behind, 2026-11-28), while repeats after at most 3.9 s were valid in 16 of 24 cases
# (docs/reproduce.md). A starved run (the loop waited for the CPU)
# is always repeated: that is the machine's load, not the run's.
HOPELESS_BEHIND_S = 5.0


def worth_repeating(rec: dict) -> bool:
    """Whether an invalid run should get another attempt (see HOPELESS_BEHIND_S)."""
    if rec.get("status") != "invalid":
        return False
    behind = rec.get("behind_s")
    return not (rec.get("lag_cause") == "saturated" and behind is not None and behind > HOPELESS_BEHIND_S)


def _run_id(r: dict) -> tuple:
    return (r["experiment"], r["variant"], point_key(r["point"]), r["rep"])


def run_all(exps: list[Experiment], quick: bool, reps: int | None, out: Path, progress=print,
            points: list[str] | None = None, retry_invalid: int = 0,
            previous: list[dict] | None = None, variants: set[str] | None = None,
            medium: dict | None = None, diagnostics: bool = False) -> list[dict]:
    """Run the plan (`medium`: settings that override every run's medium); a run the lab marks invalid is repeated up to `retry_invalid` times
    (every attempt is recorded; the invalid ones are excluded and counted in the report).
    `previous` are the records of an interrupted run of the same plan (--resume): a run
    that has a valid record there, or has used up its attempts, is kept and not run again."""
    records = []
    reasons: dict = {}
    done: dict[tuple, list[dict]] = {}
    for r in previous or []:
        done.setdefault(_run_id(r), []).append(r)
    todo = plan(exps, quick, reps, points, variants, diagnostics)
    later = {(e.id, v.name, point_key(p), rep) for e, p, rep, v in todo}  # plan items not reached yet
    # Records of runs outside this plan (e.g. other experiments than --only's) stay in runs.json.
    outside = [r for r in previous or [] if _run_id(r) not in later]
    t_start = time.time()
    for i, (e, p, rep, v) in enumerate(todo):
        later.discard((e.id, v.name, point_key(p), rep))
        before = [r for r in done.get((e.id, v.name, point_key(p), rep), []) if r["status"] in ("valid", "invalid")]
        records += before
        if (any(r["status"] == "valid" for r in before) or len(before) > retry_invalid
                or (before and not worth_repeating(before[-1]))):
            # Finished before: kept, even if its protocol could not run here now (a resume
            # from another checkout, a tool since removed): its record and files are there.
            continue
        why = reasons.setdefault((e.id, v.name), unavailable(v))
        if why:
            records.append({"experiment": e.id, "variant": v.name, "point": p, "rep": rep, "attempt": 0,
                            "status": "not run", "reason": why})
            continue
        for attempt in range(len(before), retry_invalid + 1):
            progress(f"reproduce [{i + 1}/{len(todo)}, {(time.time() - t_start) / 60:.1f} min]: "
                     f"{e.id} {e.point_name or 'point'}={point_key(p)} rep {rep} {v.name}"
                     + (f" (repeat {attempt}: the previous attempt was invalid)" if attempt else ""))
            rec = run_one(e, v, p, rep, attempt, quick, out, progress, medium=medium)
            rec["retry_invalid"] = retry_invalid  # the repeat limit, for `--report-only`
            records.append(rec)
            # With the kept records of the items not reached yet and of runs outside the plan,
            # so that interrupting a resumed reproduction, or resuming part of one, loses none.
            kept = [r for k in later for r in done.get(k, [])]
            (out / "runs.json").write_text(json.dumps(records + kept + outside, indent=1, default=str))
            if rec["status"] != "invalid":
                break
            if not worth_repeating(rec) and attempt < retry_invalid:
                progress(f"  not repeated: saturated for {rec['behind_s']:.1f} s "
                         f"(more than {HOPELESS_BEHIND_S:g} s: a repeat lags again)")
                break
    return records


def retry_limit(records: list[dict]) -> int:
    """The repeat limit of invalid runs the records were made with: as recorded, or (records
    from before it was) at least the highest repeat among them."""
    return max((r.get("retry_invalid", r.get("attempt") or 0) for r in records), default=0)


def run_one(e: Experiment, v: Variant, p, rep: int, attempt: int, quick: bool, out: Path, progress,
            medium: dict | None = None) -> dict:
    rec = {"experiment": e.id, "variant": v.name, "point": p, "rep": rep, "attempt": attempt, "status": None,
           "commit": git_commit(), "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    run_dir = out / "runs" / e.id / f"p{point_key(p)}" / f"r{rep}" / (v.name + (f"-repeat{attempt}" if attempt else ""))
    rec["dir"] = str(run_dir.relative_to(out))
    # What an interrupted attempt left here (a resumed reproduction runs it again) must not
    # mix with this one's: its daemons' stores would hand the new daemons its flows.
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.time()
    try:
        d = e.spec(v, p, rep, quick)
        d.setdefault("medium", {}).update(medium or {})
        d = materialize(d, run_dir)
        sp = specmod.from_dict(d, run_dir)
        res = run_spec(sp, run_dir, progress=lambda s: s.startswith("waiting") and progress("  " + s))
        rec.update(status="valid" if res["valid"] else "invalid", reason=res.get("invalid_reason"),
                   flows=cut_off_goodput(res["flows"], res.get("wall_seconds"), bool(res.get("timed_out"))),
                   totals=res["medium"]["totals"], nodes=len(res["medium"].get("per_node") or []),
                   lag_max_ms=res["lag"]["max_ms"],
                   duration=sp.duration, steal_s=res.get("host_steal_seconds"),
                   lag_cause=res["lag"].get("cause"), loop_busy=(res["lag"].get("loop") or {}).get("busy"),
                   behind_s=(res["lag"].get("loop") or {}).get("behind_s"),
                   hop_data=hop_data_counts(run_dir))
    except (LabError, SpecError, ValueError) as ex:
        rec.update(status="error", reason=str(ex))
        progress(f"  error: {ex}")
    rec["wall_s"] = round(time.time() - t0, 1)
    rec["ended"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if rec.get("flows") is not None:
        gp = [f["goodput_mbps"] for f in measured(rec, e.measure)]
        progress(f"  {rec['status']} ({rec['wall_s']:.0f} s): {len(gp)} measured flows, goodput median "
                 f"{percentile(gp, 50) or 0.0:.3f} Mbit/s"
                 + (f"; {rec['reason']}" if rec["status"] != "valid" else ""))
    prune_raw(run_dir)
    return rec


def machine() -> str:
    cpu = "?"
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                cpu = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{socket.gethostname()}: {os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}"


REPO = Path(__file__).resolve().parents[3]  # <repository>/lab/hoplab/reproduce/runner.py


def git_commit() -> str:
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           cwd=REPO)
        head = r.stdout.strip() or "?"
        d = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, cwd=REPO)
        return head + ("+changes" if d.stdout.strip() else "")
    except OSError:
        return "?"
