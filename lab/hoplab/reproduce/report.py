"""The report of a reproduction: report.json (every row, table and count) and report.md
written from it, with one plot per experiment."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from ..experiments.base import Experiment
from ..fmt import figure
from .paper import Row
from .runner import HOPELESS_BEHIND_S
from .stats import BOOT_RESAMPLES, CI_LEVEL, bootstrap_ci, measured, stat_fn
from .tables import (HOP_PAYLOAD_BYTES, airtime_table, bound_table, bundle_table, counters_table,
                     hop_data_table, hop_time_table, path_length_table, point_key, row_result, run_accounting)


def _json_safe(o):
    if isinstance(o, float) and (math.isinf(o) or math.isnan(o)):
        return None
    if isinstance(o, dict):
        return {k: _json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_json_safe(v) for v in o]
    return o


def plot_experiment(e: Experiment, runs: list[dict], out: Path) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    valid = [r for r in runs if r["status"] == "valid"]
    if not valid:
        return None
    variants = [v.name for v in e.variants if any(r["variant"] == v.name for r in valid)]
    points = sorted({point_key(r["point"]) for r in valid}, key=lambda s: (len(s), s))
    fig, ax = plt.subplots(figsize=(6.4, 4))
    stat = "delay_median" if e.id.startswith("hop-5.6") else "median"
    fn = stat_fn(stat)
    if len(points) > 1:
        for v in variants:
            xs, ys, lo, hi = [], [], [], []
            for p in points:
                groups = [[r] for r in valid if r["variant"] == v and point_key(r["point"]) == p]
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
              "bundles": bundle_table(runs, e.measure),
              "by_path_length": path_length_table(runs, e.measure) if e.by_path_length else [],
              "bound": bound_table(runs, out, e.measure) if e.by_path_length else [],
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


def headline_table(rep: dict) -> list[str]:
    """The report's opening table (Markdown lines): every row the papers give a figure for
    (a value or a range), experiment by experiment; no lines when no row has one. The
    report and the results page (`results_page`) both show it."""
    glance = [(e, r) for e in rep["experiments"] for r in e["rows"]
              if r["paper"] is not None or r["paper_range"]]
    if not glance:
        return []
    lines = ["| experiment | figure | ours [95 % CI] (n) | paper | ours/paper |", "|---|---|---|---|---|"]
    for e, r in glance:
        ours, paper, rel, what = _row_cells(e, r)
        lines.append(f"| {e['id']} | {what} | {ours} | {paper} | {rel} |")
    return lines


GENERATED = "Generated from"
"""The first words of a results page: a file that starts otherwise was written by hand and
is not replaced (`hoplab results-page --out`)."""


def results_page(rep: dict, source: str) -> str:
    """A Markdown page with the report's opening table (`headline_table`), for the
    documentation: its first line names the report.json it was generated from."""
    m = rep["meta"]
    lines = [f"{GENERATED} {source} by `hoplab results-page`; regenerate it rather than edit it.", "",
             "# Results: the papers' figures beside ours", "",
             f"Reproduction ({m.get('preset', '?')} preset) of {m.get('date', '?')} at commit "
             f"{m.get('commit', '?')}. Ours: the median (or the named statistic) over the valid runs with its "
             f"95 % confidence interval ({rep.get('ci_method', '?')}) and the number of runs; *ours/paper* is "
             "our figure divided by the paper's. The report beside the JSON has every other row, the runs "
             "and the medium's evidence.", ""]
    table = headline_table(rep)
    lines += table if table else ["No row of this report has a figure of the papers."]
    return "\n".join(lines) + "\n"


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
    table = headline_table(rep)
    if table:
        lines += ["## The papers' figures at a glance", "",
                  "Every row below that the papers give a figure for, in the order of the sections that "
                  "follow (each section has the rows without a paper figure too, the runs and the medium's "
                  "evidence).", ""] + table + [""]
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
        lines += _bundles_md(e.get("bundles") or {})
        lines += _path_length_md(e.get("by_path_length") or [], e.get("point_name"))
        lines += _bound_md(e.get("bound") or [], e.get("point_name"))
        for n in e["notes"]:
            lines.append(f"\n- {n}")
        if e.get("plot"):
            lines += ["", f"![{e['id']}]({e['plot']})"]
        lines.append("")
    return "\n".join(lines)


def _bundles_md(table: dict[str, dict]) -> list[str]:
    if not table:
        return []
    lines = ["", "Bundles of the DTN variants, summed over valid runs: delivered to the destination's endpoint, "
             "and the duplicates and damaged bundles its client dropped; for dtn7 over Hop the hop-dtn bridges' "
             "counters at the flows' ends: bundles dtnd handed to the bridge, Hop transfers the destination "
             "acknowledged and that failed, failed bundles given back to dtnd, lifetimes that ended, bundles dtnd "
             "handed over again while their first copy was carried, bundles the destination's bridge handed to its "
             "dtnd, and copies from Hop it dropped as handed over before:", "",
             "| protocol | runs | bundles delivered | duplicates | damaged | dtnd to bridge | Hop transfers done "
             "| failed | given back | expired | again from dtnd | bridge to dtnd | again from Hop |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for v, b in table.items():
        c = b.get("bridge")
        cells = ["—"] * 8 if c is None else [str(c[k]) for k in (
            "from_dtnd", "hop_complete", "hop_failed", "handed_back", "expired", "duplicates_from_dtnd", "to_dtnd",
            "duplicates_from_hop")]
        lines.append(f"| {v} | {b['runs']} | {b['bundles']} | {b['dup_bundles']} | {b['bad_bundles']} | "
                     + " | ".join(cells) + " |")
    return lines


def _bound_md(rows: list[dict], point_name: str | None) -> list[str]:
    """The conflict-graph bound per draw (docs/lab.md, "The conflict-graph bound"), with the
    median share of it each protocol reached and, beside TCP, whether the best mean at the
    Jain index asked for reaches 1.25 times TCP's (Hop Table 1's mean gain)."""
    from ..bound import markdown

    if not rows:
        return []
    ok = [r for r in rows if "error" not in r]
    jain = ok[0]["jain"] if ok else 0.78

    def label(r):
        at = "" if r["point"] == "-" else f"{point_name or 'point'} {r['point']}, "
        return f"{at}draw {r['rep']}"

    lines = ["", "What any protocol could reach on these draws: an upper bound from the conflict graph of the "
             "routes' links (links sharing a node, or one's sender in range of the other's receiver, take turns; "
             "a link delivers at most the full-frame payload rate times its delivery ratio; docs/lab.md, \"The "
             "conflict-graph bound\"), in kbit/s: the best mean goodput over flows, the best with a hop-weighted "
             f"Jain index of at least {jain:g}, the max-min fair allocation, and each protocol's mean, Jain index "
             "and share of the best mean at its own index:", ""]
    lines += markdown([(label(r), r) for r in ok], jain)
    for r in rows:
        if "error" in r:
            lines.append(f"| {label(r)} | — | not bounded: {r['error']} | | | |")
    if ok:
        shares = {}
        for r in ok:
            for v, m in r["variants"].items():
                if m["share"] is not None:
                    shares.setdefault(v, []).append(m["share"])
        med = "; ".join(f"{v} {100 * statistics.median(s):.0f} %" for v, s in sorted(shares.items()))
        lines += ["", f"Median share of the best mean at the protocol's own Jain index, over draws: {med}."]
        beside = [r for r in ok if (r["variants"].get("tcp") or {}).get("mean")]
        if beside:
            short = [r for r in beside if r["best_at_jain"] < 1.25 * r["variants"]["tcp"]["mean"]]
            names = "; ".join(label(r) for r in short)
            lines.append(f"Best mean with Jain >= {jain:g} against 1.25 x TCP's measured mean on the same draw: "
                         f"below it on {len(short)} of {len(beside)} draws"
                         + (f" ({names}): there no protocol, with any scheduler, "
                            f"has both a hop-weighted Jain index of {jain:g} and 1.25 times TCP's mean."
                            if short else "."))
    return lines


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
