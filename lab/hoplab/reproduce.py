"""`hoplab reproduce`: run the papers' experiments (hoplab.experiments) and write a report.

For every experiment, point (x value) and repetition the compared protocols run back to back
with the same spec apart from the protocol. Every row of experiments/paper.toml is then
measured from the valid runs:

- a statistic of one protocol (e.g. the median goodput over all measured flows of all its
  valid runs), or the ratio of one statistic between two protocols;
- its 95 % confidence interval by the bootstrap percentile method over repetitions: runs
  are resampled with replacement (the flows of one run stay together), for ratios the
  pairs of runs of the same repetition are resampled together; BOOT_RESAMPLES resamples
  with a fixed seed, so the report is deterministic. With fewer than 2 repetitions there is
  no interval; with few repetitions the interval is optimistic (it cannot be wider than the
  spread of the runs);
- the paper's figure and ours / paper.

Runs the lab marks invalid (lag bound exceeded) or that failed are left out of every figure
and counted per experiment and protocol. Rows whose protocol cannot run here say "not run"
and why.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from . import mediumserver
from .errors import LabError, SpecError
from .fmt import figure
from .experiments import registry
from .experiments.base import RUN_OVERHEAD_S, Experiment, Variant
from .results import percentile
from .spec import DYNAMIC_ROUTING

PAPER_TABLE = Path(__file__).parent / "experiments" / "paper.toml"
BOOT_RESAMPLES = 2000
BOOT_SEED = 20090422  # fixed: the report of the same runs is always the same
CI_LEVEL = 0.95

# VoIP MOS (Hop §5.8) from the ITU-T E-model in Cole & Rosenbluth's simplification for
# G.711 with random loss: R = 94.2 - Id(d) - Ie(e), MOS from R.
EMODEL_R0 = 94.2


# ---- statistics ---------------------------------------------------------------------------------

def jain(xs: list[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2); 1.0 when every flow got nothing."""
    if not xs:
        return None
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if sq > 0 else 1.0


def top_share(xs: list[float], k: int) -> float | None:
    """The share of the total the `k` largest values hold; None without a positive total."""
    total = sum(xs)
    if total <= 0:
        return None
    return sum(sorted(xs, reverse=True)[:k]) / total


def jain_hop_weighted(xs: list[float], hops: list[int]) -> float | None:
    """Hop §5.3.2: JFI = (sum x_i h_i)^2 / (n sum (x_i h_i)^2)."""
    return jain([x * h for x, h in zip(xs, hops)])


def mos(loss: float | None, delay_ms: float | None) -> float | None:
    if loss is None:
        return None
    d = delay_ms or 0.0
    i_d = 0.024 * d + (0.11 * (d - 177.3) if d > 177.3 else 0.0)
    i_e = 30.0 * math.log(1.0 + 15.0 * loss)
    r = max(0.0, min(100.0, EMODEL_R0 - i_d - i_e))
    return 1.0 + 0.035 * r + 7e-6 * r * (r - 60.0) * (100.0 - r)


def measured(run: dict, prefix: str) -> list[dict]:
    return [f for f in run["flows"] if str(f.get("label", "")).startswith(prefix)]


def _pooled(fn):
    def stat(runs: list[dict], prefix: str) -> float | None:
        xs = [f["goodput_mbps"] for r in runs for f in measured(r, prefix)]
        return fn(xs) if xs else None
    return stat


def _per_run(fn):
    def stat(runs: list[dict], prefix: str) -> float | None:
        vals = [v for v in (fn(r, measured(r, prefix)) for r in runs) if v is not None]
        return sum(vals) / len(vals) if vals else None
    return stat


def _delay(runs: list[dict], prefix: str) -> float | None:
    """Median completion time of the measured flows; a flow that did not complete counts
    as the time it had (from its start to the end of the run), a lower bound."""
    xs = []
    for r in runs:
        for f in measured(r, prefix):
            if f.get("completion_s") is not None:
                xs.append(f["completion_s"])
            else:
                xs.append(max(0.0, float(r.get("duration", 0.0)) - float(f.get("start_offset") or 0.0)))
    return percentile(xs, 50) if xs else None


def _voip(key):
    def per(run, _flows):
        v = [f for f in run["flows"] if f.get("driver") == "voip"]
        if not v:
            return None
        f = v[0]
        if key == "mos":
            return mos(f.get("voip_loss"), f.get("delay_ms_p50"))
        return f.get(f"voip_{key}")
    return per


STATS = {
    "median": _pooled(lambda xs: percentile(xs, 50)),
    "mean": _pooled(lambda xs: sum(xs) / len(xs)),
    "q1": _pooled(lambda xs: percentile(xs, 25)),
    "q3": _pooled(lambda xs: percentile(xs, 75)),
    "total": _per_run(lambda r, fl: sum(f["goodput_mbps"] for f in fl) if fl else None),
    "jain": _per_run(lambda r, fl: jain([f["goodput_mbps"] for f in fl])),
    "jain_hw": _per_run(lambda r, fl: jain_hop_weighted([f["goodput_mbps"] for f in fl],
                                                        [f.get("hops") or 1 for f in fl])),
    # Hop §5.3.1: "the top three TCP flows get around 90% of the total goodput"
    "top3_share": _per_run(lambda r, fl: top_share([f["goodput_mbps"] for f in fl], 3)),
    "delay_median": _delay,
    "clp": _per_run(_voip("clp")),
    "mos": _per_run(_voip("mos")),
    "voip_loss": _per_run(_voip("loss")),
}
POOLED = {"median", "mean", "q1", "q3"}  # statistics of the flows pooled over runs
STAT_UNITS = {"jain": "", "jain_hw": "", "top3_share": "", "clp": "", "mos": "", "voip_loss": "",
              "delay_median": "s"}


def stat_fn(name: str):
    if name.startswith("flow:"):
        label = name[5:]
        return _per_run(lambda r, fl: next((f["goodput_mbps"] for f in r["flows"] if f["label"] == label), None))
    if name not in STATS:
        raise SpecError(f"unknown statistic {name!r}; known: {sorted(STATS)} and flow:<label>")
    return STATS[name]


def _quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values (for the bootstrap percentiles)."""
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    a, b = sorted_xs[lo], sorted_xs[hi]
    if a == b:  # also keeps inf - inf out
        return a
    return a + (b - a) * (pos - lo)


def bootstrap_ci(groups: list, fn, resamples: int = BOOT_RESAMPLES, seed: int = BOOT_SEED,
                 level: float = CI_LEVEL) -> tuple[float, float] | None:
    """Percentile bootstrap over `groups` (one item per repetition): fn(list of groups) -> value.
    None with fewer than 2 groups or when no resample gives a value."""
    if len(groups) < 2:
        return None
    rng = random.Random(seed)
    vals = []
    for _ in range(resamples):
        v = fn([groups[rng.randrange(len(groups))] for _ in groups])
        if v is not None:
            vals.append(v)
    if not vals:
        return None
    vals.sort()
    a = (1.0 - level) / 2.0
    return _quantile(vals, a), _quantile(vals, 1.0 - a)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    if b == 0:
        return math.inf if a > 0 else None
    return a / b


# ---- the paper's figures ------------------------------------------------------------------------

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


# ---- availability -------------------------------------------------------------------------------

def unavailable(v: Variant) -> str | None:
    """Why this protocol cannot run on this machine (None: it can)."""
    if v.unsupported:
        return v.unsupported
    try:
        if v.spec.get("routing") in DYNAMIC_ROUTING:
            from .dynroute import binary as routing_daemon

            routing_daemon()
        if v.driver == "hop":
            from .drivers import HopDriver

            HopDriver.binary("hopd")
            HopDriver.binary("hop")
        elif v.driver == "dtn":
            from .drivers.dtn import dtnd_binary

            dtnd_binary()
    except LabError as e:
        return str(e)
    return None


# ---- aggregation --------------------------------------------------------------------------------

def _key(p) -> str:
    return "-" if p is None else str(p)


def row_result(row: Row, exp: Experiment, runs: list[dict], reasons: dict[str, str]) -> dict:
    """One report row from the run records of its experiment (records: variant, point, rep,
    status, and for valid runs the results' flows)."""
    out = {"experiment": row.experiment, "what": row.what, "ref": row.ref, "stat": row.stat,
           "variant": row.variant, "versus": row.versus, "point": row.point, "unit": row.unit,
           "paper": row.value, "paper_range": list(row.range) if row.range else None,
           "ours": None, "ci": None, "n": 0, "ours_over_paper": None, "status": "ok", "note": None}
    why = [reasons[v] for v in filter(None, (row.variant, row.versus)) if v in reasons]
    if why:
        out.update(status="not run", note="; ".join(why))
        return out
    fn = stat_fn(row.stat)
    sel = [r for r in runs if r["status"] == "valid" and (row.point is None or _key(r["point"]) == _key(row.point))]
    by_rep: dict[tuple, dict[str, dict]] = {}
    for r in sel:
        by_rep.setdefault((_key(r["point"]), r["rep"]), {})[r["variant"]] = r
    if row.versus is None:
        groups = [[g[row.variant]] for g in by_rep.values() if row.variant in g]

        def value(gs):
            return fn([r for g in gs for r in g], exp.measure)
    else:
        groups = [[g[row.variant], g[row.versus]] for g in by_rep.values()
                  if row.variant in g and row.versus in g]

        def value(gs):
            return ratio(fn([g[0] for g in gs], exp.measure), fn([g[1] for g in gs], exp.measure))
    out["n"] = len(groups)
    if not groups:
        here = [r for r in runs if r["variant"] in (row.variant, row.versus)
                and (row.point is None or _key(r["point"]) == _key(row.point))]
        out.update(status="no valid runs", note="every run excluded" if here else "none in this selection")
        return out
    v = value(groups)
    out["ours"] = v
    if v is None:
        if row.versus is not None:
            a, b = (fn([g[i] for g in groups], exp.measure) for i in (0, 1))
            out["note"] = "undefined: both figures are 0" if a == 0 and b == 0 else "undefined: a figure is missing"
        else:
            out["note"] = "undefined: no measured flow"
    elif math.isinf(v):
        # JSON has no infinity (report.json carries null): say it in words.
        out["note"] = "infinite: the second figure is 0"
    out["ci"] = bootstrap_ci(groups, value)
    if len(groups) == 1 and row.stat in POOLED:
        # One repetition: resample its measured flows instead (paired by flow for a ratio:
        # flow i of both protocols has the same endpoints and start).
        sides = [measured(r, exp.measure) for r in groups[0]]
        if len({len(fl) for fl in sides}) == 1 and len(sides[0]) >= 2:
            per_flow = [[{**r, "flows": [fl[i]]} for r, fl in zip(groups[0], sides)] for i in range(len(sides[0]))]
            out["ci"] = bootstrap_ci(per_flow, value)
            out["ci_over"] = "flows"
            out["n_flows"] = len(per_flow)
    if v is not None and row.value is not None:
        out["ours_over_paper"] = ratio(v, row.value)
    if v is not None and row.range is not None:
        out["note"] = ("within the paper's range" if row.range[0] <= v <= row.range[1]
                       else ("below" if v < row.range[0] else "above") + " the paper's range")
    return out


def counters_table(runs: list[dict]) -> dict[str, dict]:
    """Per variant, the medians over valid runs of medium counters that explain a result:
    failed attempts per frame, receiver PHY drops, frames dropped after the last retry."""
    out: dict[str, dict] = {}
    for v in sorted({r["variant"] for r in runs}):
        rs = [r for r in runs if r["variant"] == v and r["status"] == "valid" and r.get("totals")]
        if not rs:
            continue
        per = {"failed_per_frame": [r["totals"]["retries"] / max(1, r["totals"]["mac_tx"]) for r in rs],
               "mac_tx": [r["totals"]["mac_tx"] for r in rs],
               "phy_rx_collision": [r["totals"]["phy_rx_collision"] for r in rs],
               "final_failures": [r["totals"]["final_failures"] for r in rs],
               # frames the MAC queue dropped unsent (full, or past its lifetime); recorded since
               # 2026-11-25
               "mac_queue_drops": [r["totals"]["queue_full"] + r["totals"]["queue_expired"] for r in rs
                                   if "queue_expired" in r["totals"]],
               "lag_max_ms": [r.get("lag_max_ms") or 0.0 for r in rs],
               # how close to real time's limit the valid runs came (recorded since 2026-11-25)
               "loop_busy": [r["loop_busy"] for r in rs if r.get("loop_busy") is not None]}
        out[v] = {k: percentile(x, 50) for k, x in per.items()}
    return out


def airtime_table(runs: list[dict], prefix: str) -> dict[str, dict]:
    """Per variant, medians over valid runs of where the nodes' air time went: how much of
    the time a node's PHY was busy (sensing, receiving or sending), what its own
    transmissions carried, and how many delivered bits crossed one hop per second of payload
    frames on the air. Runs recorded before the medium counted airtime (2026-11-26) are left
    out."""
    out: dict[str, dict] = {}
    for v in sorted({r["variant"] for r in runs}):
        rs = [r for r in runs if r["variant"] == v and r["status"] == "valid" and r.get("nodes")
              and (r.get("totals") or {}).get("state_idle_us")]
        if not rs:
            continue
        per: dict[str, list[float]] = {k: [] for k in ("busy", "tx", "large", "small", "mac", "retry",
                                                        "bit_hops_per_air_s", "queued_data")}
        for r in rs:
            t = r["totals"]
            node_us = sum(t[k] for k in ("state_idle_us", "state_cca_us", "state_tx_us", "state_rx_us"))
            per["busy"].append(1.0 - t["state_idle_us"] / node_us)
            per["tx"].append(t["state_tx_us"] / node_us)
            # time a MAC held data frames (best effort or background), recorded since 2026-11-27
            if "queued_data_us" in t:
                per["queued_data"].append(t["queued_data_us"] / node_us)
            for k in ("large", "small", "mac", "retry"):
                per[k].append(t[f"air_{k}_us"] / node_us)
            # Bits delivered over the whole run times their path's hops, divided by the large
            # frames' air time over the same run, all nodes together.
            bits = _bytes_x_hops(measured(r, prefix))
            bit_hops = None if bits is None else bits * 8 / 1e6
            if t["air_large_us"] > 0 and bit_hops is not None:
                per["bit_hops_per_air_s"].append(bit_hops / (t["air_large_us"] / 1e6))
        out[v] = {k: percentile(x, 50) for k, x in per.items() if x}
        out[v]["runs"] = len(rs)
    return out


def _bytes_x_hops(flows: list[dict]) -> float | None:
    """Bytes delivered times their path's hops, summed over `flows`; None when a flow's path
    length is unknown (routes chosen at run time, e.g. by Babel), rather than a guess."""
    total = 0.0
    for f in flows:
        if not f.get("hops"):
            return None
        total += float(f.get("bytes") or 0) * f["hops"]
    return total


# hop-proto's DEFAULT_PACKET_PAYLOAD_BYTES: the payload of a full Hop DATA packet.
HOP_PAYLOAD_BYTES = 1380
# Hop's time-in-state counters (`time_<state>_ms`, hop-proto's SendState), in their order.
HOP_TIME_STATES = ("ready", "feed", "round", "silent", "held", "idle")


def hop_data_counts(run_dir: Path) -> dict | None:
    """Hop's DATA packets over a run, summed over the `hop status` every hopd gave at the
    run's end (drivers.HopDriver.collect): packets sent (first copies and resends), resent,
    received by the node they were addressed to (duplicates included), and received twice.
    `nodes` is how many hopds answered. `time_ms` sums the hopds' time-in-state counters
    (what each node's sending side was doing, docs/hopd.md "Metrics"; zero before 2026-11-27).
    None when no hopd ran Hop."""
    tot = {"sent": 0, "resent": 0, "received": 0, "duplicates": 0, "nodes": 0,
           "time_ms": {k: 0 for k in HOP_TIME_STATES}}
    for fn in sorted((run_dir / "raw").glob("hopd-*/status.json")):
        try:
            st = json.loads(fn.read_text())
        except (OSError, ValueError):
            continue
        for name, t in (st.get("node") or {}).get("transports") or []:
            if name != "hop":
                continue
            tot["sent"] += int((t.get("sent_by_type") or {}).get("data", 0))
            tot["received"] += int((t.get("received_by_type") or {}).get("data", 0))
            tot["resent"] += int(t.get("data_retransmissions", 0))
            tot["duplicates"] += int((t.get("extra") or {}).get("data_duplicates", 0))
            for k in HOP_TIME_STATES:
                tot["time_ms"][k] += int((t.get("extra") or {}).get(f"time_{k}_ms", 0))
            tot["nodes"] += 1
    return tot if tot["nodes"] else None


def hop_data_table(runs: list[dict], prefix: str) -> dict[str, dict]:
    """Per Hop variant, medians over valid runs of where its DATA packets went: how many were
    sent, the share that reached the node they were addressed to, the share that were
    resends, and the delivered packet-hops per packet sent (bytes delivered over the whole
    run times their path's hops, in full packets of `HOP_PAYLOAD_BYTES`). Packets of blocks
    still on their way at the run's end count as sent and not delivered."""
    out: dict[str, dict] = {}
    for v in sorted({r["variant"] for r in runs}):
        rs = [r for r in runs if r["variant"] == v and r["status"] == "valid"
              and (r.get("hop_data") or {}).get("sent")]
        if not rs:
            continue
        per: dict[str, list[float]] = {k: [] for k in ("sent", "reached", "resent", "duplicates", "delivered")}
        for r in rs:
            h = r["hop_data"]
            per["sent"].append(h["sent"])
            per["reached"].append(h["received"] / h["sent"])
            per["resent"].append(h["resent"] / h["sent"])
            per["duplicates"].append(h["duplicates"] / h["sent"])
            byte_hops = _bytes_x_hops(measured(r, prefix))
            if byte_hops is not None:
                per["delivered"].append(byte_hops / HOP_PAYLOAD_BYTES / h["sent"])
        out[v] = {k: percentile(x, 50) for k, x in per.items() if x}
        out[v]["runs"] = len(rs)
        out[v]["nodes_answering"] = min(r["hop_data"]["nodes"] for r in rs)
    return out


def hop_time_table(runs: list[dict]) -> dict[str, dict]:
    """Per Hop variant, medians over valid runs of what the nodes' sending sides did, all
    hopds together: the share of the nodes' time with something to send (`busy`), and of
    that time the shares with packets ready for the link, waiting for packets from upstream,
    waiting for a round's BACK, facing a silent next hop, and held back (hop-proto's
    SendState). Runs whose hopds had no such counters are left out."""
    out: dict[str, dict] = {}
    busy_states = HOP_TIME_STATES[:-1]
    for v in sorted({r["variant"] for r in runs}):
        per: dict[str, list[float]] = {k: [] for k in ("busy",) + busy_states}
        for r in runs:
            t = ((r.get("hop_data") or {}).get("time_ms")) if r["variant"] == v and r["status"] == "valid" else None
            if not t:
                continue
            busy = sum(t.get(k, 0) for k in busy_states)
            total = busy + t.get("idle", 0)
            if busy <= 0:
                continue
            per["busy"].append(busy / total)
            for k in busy_states:
                per[k].append(t.get(k, 0) / busy)
        if per["busy"]:
            out[v] = {k: percentile(x, 50) for k, x in per.items()}
            out[v]["runs"] = len(per["busy"])
    return out


PATH_TABLE_MIN_FLOWS = 6  # a run with fewer measured flows gets no table of goodput by path length


def path_length_table(runs: list[dict], measure: str = "") -> list[dict]:
    """Goodput by path length, per point and protocol: where a mean over flows comes from.

    A mean over flows weighs a 2-hop flow like a 7-hop one, although each packet of the
    7-hop flow takes at least seven transmissions; two protocols with the same mean can do
    very different work. Per point (x value) with flows of at least two path lengths, per
    protocol: the flows of each length and their mean goodput, pooled over its valid runs,
    and per run the sum of goodput x hops (the transport's delivered work, Mbit/s x hops).
    A protocol without a valid run at that point is shown from its invalid runs, marked
    indicative, so the table still says where each one's bytes went."""
    out = []
    points = sorted({_key(r["point"]) for r in runs if r.get("flows")}, key=_point_order)
    for pt in points:
        at = [r for r in runs if _key(r["point"]) == pt and r.get("flows")
              and r["status"] in ("valid", "invalid")]
        bulk = {id(r): [f for f in measured(r, measure) if f.get("hops")] for r in at}
        hops = sorted({f["hops"] for fl in bulk.values() for f in fl})
        if len(hops) < 2 or max(len(fl) for fl in bulk.values()) < PATH_TABLE_MIN_FLOWS:
            continue
        rows = {}
        for v in sorted({r["variant"] for r in at}):
            rs = [r for r in at if r["variant"] == v and r["status"] == "valid"]
            source = "valid"
            if not rs:
                rs, source = [r for r in at if r["variant"] == v], "invalid"
            by_h = {}
            for h in hops:
                gs = [f["goodput_mbps"] for r in rs for f in bulk[id(r)] if f["hops"] == h]
                if gs:
                    by_h[h] = {"flows": len(gs), "mean_mbps": sum(gs) / len(gs)}
            work = [sum(f["goodput_mbps"] * f["hops"] for f in bulk[id(r)]) for r in rs]
            total = [sum(f["goodput_mbps"] for f in bulk[id(r)]) for r in rs]
            rows[v] = {"runs": len(rs), "source": source, "by_hops": by_h,
                       "total_mbps": sum(total) / len(total), "hop_mbps": sum(work) / len(work)}
        out.append({"point": pt, "hops": hops, "variants": rows})
    return out


def _point_order(k: str):
    try:
        return (0, float(k), k)
    except ValueError:
        return (1, 0.0, k)


def run_accounting(runs: list[dict]) -> dict[str, dict]:
    acc: dict[str, dict] = {}
    for r in runs:
        a = acc.setdefault(r["variant"], {"valid": 0, "invalid": 0, "error": 0, "not run": 0})
        a[r["status"]] = a.get(r["status"], 0) + 1
    return acc


# ---- running ------------------------------------------------------------------------------------

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
    for p in list(raw.glob("hop-recv-*")) + list(raw.glob("hopd-*/store")):
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
            if points is not None and _key(p) not in points:
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
    return (r["experiment"], r["variant"], _key(r["point"]), r["rep"])


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
    later = {(e.id, v.name, _key(p), rep) for e, p, rep, v in todo}  # plan items not reached yet
    # Records of runs outside this plan (e.g. other experiments than --only's) stay in runs.json.
    outside = [r for r in previous or [] if _run_id(r) not in later]
    t_start = time.time()
    for i, (e, p, rep, v) in enumerate(todo):
        later.discard((e.id, v.name, _key(p), rep))
        before = [r for r in done.get((e.id, v.name, _key(p), rep), []) if r["status"] in ("valid", "invalid")]
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
                     f"{e.id} {e.point_name or 'point'}={_key(p)} rep {rep} {v.name}"
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
    from . import spec as specmod
    from .run import run_spec

    rec = {"experiment": e.id, "variant": v.name, "point": p, "rep": rep, "attempt": attempt, "status": None,
           "commit": git_commit(), "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    run_dir = out / "runs" / e.id / f"p{_key(p)}" / f"r{rep}" / (v.name + (f"-repeat{attempt}" if attempt else ""))
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


# ---- report ---------------------------------------------------------------------------------------

def _json_safe(o):
    if isinstance(o, float) and (math.isinf(o) or math.isnan(o)):
        return None
    if isinstance(o, dict):
        return {k: _json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_json_safe(v) for v in o]
    return o


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


def git_commit() -> str:
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parents[2])
        head = r.stdout.strip() or "?"
        d = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, cwd=Path(__file__).resolve().parents[2])
        return head + ("+changes" if d.stdout.strip() else "")
    except OSError:
        return "?"


def plot_experiment(e: Experiment, runs: list[dict], out: Path) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    valid = [r for r in runs if r["status"] == "valid"]
    if not valid:
        return None
    variants = [v.name for v in e.variants if any(r["variant"] == v.name for r in valid)]
    points = sorted({_key(r["point"]) for r in valid}, key=lambda s: (len(s), s))
    fig, ax = plt.subplots(figsize=(6.4, 4))
    stat = "delay_median" if e.id.startswith("hop-5.6") else "median"
    fn = stat_fn(stat)
    if len(points) > 1:
        for v in variants:
            xs, ys, lo, hi = [], [], [], []
            for p in points:
                groups = [[r] for r in valid if r["variant"] == v and _key(r["point"]) == p]
                val = fn([g[0] for g in groups], e.measure) if groups else None
                if val is None:
                    continue
                ci = bootstrap_ci(groups, lambda gs: fn([g[0] for g in gs], e.measure))
                xs.append(p)
                ys.append(val)
                lo.append(val - ci[0] if ci else 0.0)
                hi.append(ci[1] - val if ci else 0.0)
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=v)
        ax.set_xlabel(e.point_name or "point")
    else:
        data = []
        for v in variants:
            rs = [r for r in valid if r["variant"] == v]
            if stat == "delay_median":
                data.append([f["completion_s"] or 0.0 for r in rs for f in measured(r, e.measure)])
            else:
                data.append([f["goodput_mbps"] for r in rs for f in measured(r, e.measure)])
        ax.boxplot(data, whis=(0, 100))
        ax.plot(range(1, len(data) + 1), [sum(d) / len(d) if d else 0 for d in data], "o", label="mean")
        ax.set_xticks(range(1, len(variants) + 1), variants, rotation=15, fontsize=8)
    ax.set_ylabel("completion time (s), median" if stat == "delay_median" else "goodput (Mbit/s), median over flows"
                  if len(points) > 1 else "goodput (Mbit/s) per flow")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{e.id}: {e.title}", fontsize=9)
    fig.tight_layout()
    name = f"plots/{e.id}.png"
    (out / "plots").mkdir(parents=True, exist_ok=True)
    fig.savefig(out / name, dpi=90)
    plt.close(fig)
    return name


def aggregate(records: list[dict], exps: list[Experiment], rows: list[Row], out: Path, meta: dict,
              plots: bool = True) -> dict:
    report = {"meta": meta, "ci_method": f"bootstrap percentile over repetitions, {BOOT_RESAMPLES} resamples, "
              f"{int(CI_LEVEL * 100)} %", "experiments": []}
    for e in exps:
        runs = [r for r in records if r["experiment"] == e.id]
        if not runs:
            continue
        reasons = {}
        for r in runs:
            if r["status"] == "not run":
                reasons[r["variant"]] = r.get("reason") or "not run"
        for v in e.variants:
            if v.unsupported:
                reasons[v.name] = v.unsupported
            elif not any(r["variant"] == v.name for r in runs):
                reasons[v.name] = ("diagnostic, not in the preset (`--diagnostics`)" if v.diagnostic
                                   else "not in this preset")
        er = {"id": e.id, "title": e.title, "ref": e.ref, "notes": e.notes, "point_name": e.point_name,
              "variants": {v.name: v.title for v in e.variants},
              "runs": run_accounting(runs),
              "invalid": [{"variant": r["variant"], "point": r["point"], "rep": r["rep"],
                           "attempt": r.get("attempt", 0), "status": r["status"], "reason": r.get("reason"),
                           "cause": r.get("lag_cause")}
                          for r in runs if r["status"] in ("invalid", "error")],
              "counters": counters_table(runs),
              "airtime": airtime_table(runs, e.measure),
              "hop_data": hop_data_table(runs, e.measure),
              "hop_time": hop_time_table(runs),
              "by_path_length": path_length_table(runs, e.measure) if e.by_path_length else [],
              "wall_s": round(sum(r.get("wall_s", 0.0) for r in runs), 1),
              "rows": [row_result(row, e, runs, reasons) for row in rows if row.experiment == e.id]}
        if plots:
            er["plot"] = plot_experiment(e, runs, out)
        report["experiments"].append(er)
    (out / "report.json").write_text(json.dumps(_json_safe(report), indent=1, default=str))
    (out / "report.md").write_text(markdown(report))
    return report


def _row_cells(e: dict, r: dict) -> tuple[str, str, str, str]:
    """A report row's cells: ours (with interval and n), the paper's, ours/paper, and the
    figure's name with its point."""
    unit = r["unit"]
    u = "" if unit in ("", "x") else f" {unit}" if unit != "Mbit/s" else ""
    if r["status"] != "ok":
        ours = f"{r['status']}: {r['note']}"
    elif r["ours"] is None:
        ours = f"— ({r['note'] or 'undefined'}; n={r['n']})"
    else:
        ci = r["ci"]
        ours = figure(r["ours"], unit) + ("×" if unit == "x" else u)
        ours += f" [{figure(ci[0], unit)}, {figure(ci[1], unit)}]" if ci else " [no CI]"
        ours += (f" (n=1 run, CI over its {r['n_flows']} flows)" if r.get("ci_over") == "flows"
                 else f" (n={r['n']})")
    if r["paper"] is not None:
        paper = figure(r["paper"], unit) + ("×" if unit == "x" else u)
    elif r["paper_range"]:
        paper = f"{r['paper_range'][0]:g}–{r['paper_range'][1]:g}×"
    else:
        paper = "figure only"
    rel = figure(r["ours_over_paper"]) if r["ours_over_paper"] is not None else (
        r["note"] if r["status"] == "ok" and r["note"] and r["ours"] is not None
        and not math.isinf(r["ours"]) else "—")
    what = r["what"]
    if r["point"] is not None and str(r["point"]) not in what:
        what += f" ({e.get('point_name') or 'point'} {r['point']})"
    return ours, paper, rel, what


def markdown(rep: dict) -> str:
    m = rep["meta"]
    lines = [f"# Reproduction of the Hop, HxH and ATP evaluations ({m['preset']})", "",
             f"Date {m['date']}, machine {m['machine']}, commit {m['commit']}, "
             f"wall time {m.get('wall_min', 0):.1f} min. Command: `{m['command']}`.", "",
             "Figures are medians (or the named statistic) over the valid runs, with 95 % confidence "
             f"intervals ({rep['ci_method']}; no interval with one repetition). Ratios compare runs of the "
             "same repetition (same topology, flows and seed, run back to back). *ours/paper* is our "
             "figure divided by the paper's. Runs the lab marked invalid (real-time lag above its bound) "
             "or that failed are excluded and counted below each table"
             + (f"; an invalid run was repeated up to {m['retry_invalid']} time(s), every attempt counted, "
                f"unless its medium's event loop had been saturated for more than {HOPELESS_BEHIND_S:g} s "
                "(one such repeat in 23 was valid on this machine)"
                if m.get("retry_invalid") else "") + ".", ""]
    tot = {"valid": 0, "invalid": 0, "error": 0, "not run": 0}
    for e in rep["experiments"]:
        for a in e["runs"].values():
            for k in tot:
                tot[k] += a.get(k, 0)
    causes = {"saturated": 0, "starved": 0}
    for e in rep["experiments"]:
        for inv in e["invalid"]:
            if inv.get("cause") in causes:
                causes[inv["cause"]] += 1
    why = ""
    if any(causes.values()):
        why = (f" (of them, {causes['saturated']} with the medium's event loop on the CPU at least 90 % of "
               f"the time it was behind, {causes['starved']} with the loop waiting for the CPU)")
    lines += [f"Runs: {tot['valid']} valid, {tot['invalid']} invalid{why} (excluded), {tot['error']} failed "
              f"(excluded), {tot['not run']} not run.", ""]
    glance = [(e, r) for e in rep["experiments"] for r in e["rows"]
              if r["paper"] is not None or r["paper_range"]]
    if glance:
        lines += ["## The papers' figures at a glance", "",
                  "Every row below that the papers give a figure for, in the order of the sections that "
                  "follow (each section has the rows without a paper figure too, the runs and the medium's "
                  "evidence).", "",
                  "| experiment | figure | ours [95 % CI] (n) | paper | ours/paper |", "|---|---|---|---|---|"]
        for e, r in glance:
            ours, paper, rel, what = _row_cells(e, r)
            lines.append(f"| {e['id']} | {what} | {ours} | {paper} | {rel} |")
        lines.append("")
    for e in rep["experiments"]:
        lines += [f"## {e['id']}: {e['title']}", "", f"Paper: {e['ref']}. Protocols: "
                  + "; ".join(f"`{k}` = {v}" for k, v in e["variants"].items()) + ".", ""]
        lines += ["| figure | ref | ours [95 % CI] (n) | paper | ours/paper |", "|---|---|---|---|---|"]
        for r in e["rows"]:
            ours, paper, rel, what = _row_cells(e, r)
            lines.append(f"| {what} | {r['ref']} | {ours} | {paper} | {rel} |")
        acc = ", ".join(f"{v}: {a['valid']} valid" + (f", {a['invalid']} invalid" if a.get("invalid") else "")
                        + (f", {a['error']} failed" if a.get("error") else "")
                        + (f", {a['not run']} not run" if a.get("not run") else "")
                        for v, a in e["runs"].items())
        lines += ["", f"Runs ({e['wall_s'] / 60:.1f} min): {acc}."]
        for inv in e["invalid"]:
            lines.append(f"- excluded: {inv['variant']} point {inv['point']} rep {inv['rep']} attempt "
                         f"{inv['attempt']}: {inv['status']} ({inv['reason']})")
        if e["counters"]:
            lines += ["", "Medium counters, medians over valid runs (evidence for the figures):", "",
                      "| protocol | MAC frames | failed attempts / frame | PHY drops while receiving | "
                      "frames lost after last retry | frames dropped unsent by the MAC queue | max lag (ms) | "
                      "medium's event loop on the CPU |",
                      "|---|---|---|---|---|---|---|---|"]
            for v, c in e["counters"].items():
                busy = "—" if c.get("loop_busy") is None else f"{100 * c['loop_busy']:.0f} %"
                qd = "—" if c.get("mac_queue_drops") is None else f"{c['mac_queue_drops']:.0f}"
                lines.append(f"| {v} | {c['mac_tx']:.0f} | {c['failed_per_frame']:.3f} | {c['phy_rx_collision']:.0f} "
                             f"| {c['final_failures']:.0f} | {qd} | {c['lag_max_ms']:.1f} | {busy} |")
        if e.get("airtime"):
            lines += ["", "Air time, medians over valid runs: share of each node's time (all nodes together) its "
                      "PHY was busy (sensing, receiving or sending) and sending, what its transmissions carried "
                      "(data frames of 400 bytes or more; smaller data frames such as BSYN/BACK, TCP ACKs and "
                      "routing; MAC ACK/RTS/CTS; data frames the MAC sent again), the time its MAC held data "
                      "frames to send (best-effort and background queues: waiting for the air or on it), and "
                      "the bits delivered times their path's hops per second of large frames on the air, both "
                      "over the whole run (a 1500-byte frame at 11 Mbit/s carries 8.8 Mbit of TCP payload per "
                      "second of air):", "",
                      "| protocol | runs | PHY busy | sending | large data frames | small data frames | MAC control "
                      "| MAC retries | MAC holds data | delivered Mbit x hops per air-second of large frames |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            for v, a in e["airtime"].items():
                eff = a.get("bit_hops_per_air_s")
                qd = a.get("queued_data")
                lines.append(f"| {v} | {a['runs']} | {100 * a['busy']:.1f} % | {100 * a['tx']:.1f} % "
                             f"| {100 * a['large']:.1f} % | {100 * a['small']:.1f} % | {100 * a['mac']:.1f} % "
                             f"| {100 * a['retry']:.1f} % | {'—' if qd is None else f'{100 * qd:.1f} %'} "
                             f"| {'—' if eff is None else f'{eff:.2f}'} |")
        if e.get("hop_data"):
            lines += ["", "Hop's DATA packets, medians over valid runs, from every hopd's counters at the run's "
                      "end: packets sent (first copies and resends), the share that reached the node they "
                      "were addressed to, the share that were resends and that arrived twice, and the "
                      f"delivered packet-hops (bytes delivered x hops / {HOP_PAYLOAD_BYTES}) per packet sent; "
                      "packets of blocks still on their way at the end count as sent, not delivered:", "",
                      "| protocol | runs | packets sent | reached the next hop | resends | arrived twice "
                      "| delivered packet-hops per packet sent |",
                      "|---|---|---|---|---|---|---|"]
            for v, h in e["hop_data"].items():
                dl = h.get("delivered")
                lines.append(f"| {v} | {h['runs']} | {h['sent']:.0f} | {100 * h['reached']:.1f} % "
                             f"| {100 * h['resent']:.1f} % | {100 * h['duplicates']:.1f} % "
                             f"| {'—' if dl is None else f'{dl:.2f}'} |")
        if e.get("hop_time"):
            lines += ["", "What Hop's nodes were doing, medians over valid runs, from every hopd's time-in-state "
                      "counters (docs/hopd.md, \"Metrics\"): the share of the nodes' time with blocks or bytes to "
                      "send, and of that time the shares with packets ready for the link (the node sent as "
                      "fast as its link took them), waiting for more of a block still arriving from upstream "
                      "(a relay's pipelining threshold, §3.1), waiting for the BACK of a round's first BSYN, "
                      "facing a "
                      "silent next hop (BSYNs repeated unanswered: it withheld them, §3.3 and §3.5, or they "
                      "were lost) and held back:", "",
                      "| protocol | runs | time with something to send | ready | fed from upstream | round "
                      "| next hop silent | held |",
                      "|---|---|---|---|---|---|---|---|"]
            for v, h in e["hop_time"].items():
                lines.append(f"| {v} | {h['runs']} | {100 * h['busy']:.1f} % | {100 * h['ready']:.1f} % "
                             f"| {100 * h['feed']:.1f} % | {100 * h['round']:.1f} % | {100 * h['silent']:.1f} % "
                             f"| {100 * h['held']:.1f} % |")
        lines += _path_length_md(e.get("by_path_length") or [], e.get("point_name"))
        for n in e["notes"]:
            lines.append(f"\n- {n}")
        if e.get("plot"):
            lines += ["", f"![{e['id']}]({e['plot']})"]
        lines.append("")
    return "\n".join(lines)


def _path_length_md(tables: list[dict], point_name: str | None) -> list[str]:
    lines = []
    for t in tables:
        at = "" if t["point"] == "-" else f" ({point_name or 'point'} {t['point']})"
        lines += ["", f"Goodput by path length{at}: mean per flow in kbit/s (flows), pooled over runs; "
                  "per run the sum over flows, and of goodput x hops:", "",
                  "| protocol | runs | " + " | ".join(f"{h} hops" for h in t["hops"])
                  + " | sum, Mbit/s | sum x hops, Mbit/s |",
                  "|---|---|" + "---|" * len(t["hops"]) + "---|---|"]
        for v, c in t["variants"].items():
            cells = [f"{1000 * c['by_hops'][h]['mean_mbps']:.1f} ({c['by_hops'][h]['flows']})"
                     if h in c["by_hops"] else "—" for h in t["hops"]]
            runs = f"{c['runs']}" + (" invalid, indicative" if c["source"] == "invalid" else "")
            lines.append(f"| {v} | {runs} | " + " | ".join(cells)
                         + f" | {c['total_mbps']:.2f} | {c['hop_mbps']:.2f} |")
    return lines


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
    from . import spec as specmod
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
