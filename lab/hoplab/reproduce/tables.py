"""The report's tables from the run records of one experiment: a paper row measured over
the valid runs (`row_result`), and the evidence beside it (medium counters, air time,
Hop's packet and time counters, goodput by path length, run accounting)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..experiments.base import Experiment
from ..results import percentile
from .paper import Row
from .stats import POOLED, bootstrap_ci, measured, ratio, stat_fn


def point_key(p) -> str:
    """A point as the report and the run directories name it ("-" for none)."""
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
    sel = [r for r in runs if r["status"] == "valid" and (row.point is None or point_key(r["point"]) == point_key(row.point))]
    by_rep: dict[tuple, dict[str, dict]] = {}
    for r in sel:
        by_rep.setdefault((point_key(r["point"]), r["rep"]), {})[r["variant"]] = r
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
                and (row.point is None or point_key(r["point"]) == point_key(row.point))]
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


# hop-dtn's counters (its counters.json, docs/lab.md "dtn-hop"), in the order the report shows them.
BRIDGE_COUNTERS = ("from_dtnd", "to_hop", "hop_complete", "hop_failed", "handed_back", "kept_failed", "expired",
                   "duplicates_from_dtnd", "to_dtnd", "duplicates_from_hop", "not_bundles", "outcome_unknown")


def bundle_table(runs: list[dict], prefix: str) -> dict[str, dict]:
    """Per DTN variant (measured flows that count bundles: the `dtn` and `dtn-hop` drivers),
    sums over its valid runs: bundles the measured flows delivered to their endpoints, and the
    duplicate and damaged ones their receivers dropped; for dtn7 over Hop also the bridges'
    counters (`BRIDGE_COUNTERS`) of the flows' end nodes, each node of a run once. Sums, not
    medians: one duplicate in one run must show."""
    out: dict[str, dict] = {}
    for v in sorted({r["variant"] for r in runs}):
        rs = [r for r in runs if r["variant"] == v and r["status"] == "valid"
              and any("bundles" in f for f in measured(r, prefix))]
        if not rs:
            continue
        row: dict = {"runs": len(rs), "bundles": 0, "dup_bundles": 0, "bad_bundles": 0}
        bridge = {k: 0 for k in BRIDGE_COUNTERS}
        bridged = False
        for r in rs:
            flows = measured(r, prefix)
            for k in ("bundles", "dup_bundles", "bad_bundles"):
                row[k] += sum(int(f.get(k) or 0) for f in flows)
            nodes: dict[str, dict] = {}
            for f in flows:
                nodes.update(f.get("bridge") or {})
            for c in nodes.values():
                bridged = True
                for k in BRIDGE_COUNTERS:
                    bridge[k] += int(c.get(k) or 0)
        if bridged:
            row["bridge"] = bridge
        out[v] = row
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
    points = sorted({point_key(r["point"]) for r in runs if r.get("flows")}, key=_point_order)
    for pt in points:
        at = [r for r in runs if point_key(r["point"]) == pt and r.get("flows")
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


def bound_table(runs: list[dict], out: Path, measure: str, jain: float = 0.78) -> list[dict]:
    """Per draw (point and repetition with valid runs of two measured flows or more), the
    conflict-graph bound of its floor and flows (hoplab.bound, docs/lab.md) beside what each
    protocol measured. A draw whose results cannot be read or bounded carries the reason."""
    from ..bound import draw_bound
    from ..errors import LabError

    draws: dict[tuple, list[dict]] = {}
    for r in runs:
        if r["status"] == "valid" and len(measured(r, measure)) >= 2:
            draws.setdefault((point_key(r["point"]), r["rep"]), []).append(r)
    rows = []
    for (pt, rep), rs in sorted(draws.items(), key=lambda kv: (_point_order(kv[0][0]), kv[0][1])):
        row = {"point": pt, "rep": rep}
        try:
            res = json.loads((out / rs[0]["dir"] / "results.json").read_text())
            row.update(draw_bound(res, [(r["variant"], measured(r, measure)) for r in rs], jain))
        except (OSError, ValueError, KeyError, LabError) as e:
            row["error"] = str(e)
        rows.append(row)
    return rows


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
