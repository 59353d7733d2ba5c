"""Results: JSON with every number, goodput plots (CDF, box), Markdown summary."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .fmt import fixed

COUNTER_KEYS = ("mac_tx", "phy_tx", "phy_rx_ok", "phy_rx_drop", "phy_rx_collision", "imposed_loss",
                "retries", "final_failures", "rts_failed", "queue_full", "queue_expired",
                # recorded since 2026-11-26 (medium_cpp.h: airtime and PHY state times, microseconds)
                "air_large_us", "air_small_us", "air_mac_us", "air_retry_us",
                "state_idle_us", "state_cca_us", "state_tx_us", "state_rx_us",
                # recorded since 2026-11-27: time the MAC held a frame (any category; data)
                "queued_us", "queued_data_us")


def percentile(xs: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in [0, 100])."""
    if not xs:
        return None
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))
    return s[k]


# A real-time event loop that is behind never sleeps. If its thread was on the CPU nearly
# all the time it was behind, the medium needed more than the one core it can use; if not,
# it was runnable but waiting for the CPU (other processes, the hypervisor's steal).
SATURATED_BUSY = 0.9


def loop_busy(lag_ms: list[float], real_s: list[float], cpu_s: list[float], bound_ms: float) -> dict | None:
    """CPU share of the medium's event loop (thread CPU time over real time) for the whole
    measured window and for the probe intervals that ended more than half the bound behind."""
    n = min(len(lag_ms), len(real_s), len(cpu_s))
    if n < 2 or any(c < 0 for c in cpu_s[:n]):
        return None
    whole_real = real_s[n - 1] - real_s[0]
    behind_real = behind_cpu = 0.0
    for i in range(1, n):
        if lag_ms[i] > bound_ms / 2:
            behind_real += real_s[i] - real_s[i - 1]
            behind_cpu += cpu_s[i] - cpu_s[i - 1]
    return {
        "busy": (cpu_s[n - 1] - cpu_s[0]) / whole_real if whole_real > 0 else None,
        "behind_s": behind_real,
        "busy_while_behind": behind_cpu / behind_real if behind_real > 0 else None,
    }


def lag_stats(samples: list[float], bound_ms: float, real_s: list[float] | None = None,
              cpu_s: list[float] | None = None) -> dict:
    """Lag percentiles and validity; with the probes' real and CPU times, also how busy the
    event loop was and, for an invalid run, whether it was short of CPU (`saturated`) or
    waited for it (`starved`)."""
    if not samples:
        return {"samples": 0, "max_ms": None, "valid": False, "bound_ms": bound_ms,
                "reason": "no lag samples (medium did not report)"}
    mx = max(samples)
    busy = loop_busy(samples, real_s or [], cpu_s or [], bound_ms)
    reason = cause = None
    if mx > bound_ms:
        reason = f"max lag {mx:.1f} ms exceeds bound {bound_ms:g} ms"
        share = busy and busy["busy_while_behind"]
        if share is not None:
            cause = "saturated" if share >= SATURATED_BUSY else "starved"
            reason += (f"; the medium's event loop had the CPU {100 * share:.0f} % of the "
                       f"{busy['behind_s']:.1f} s it was behind ({cause})")
    return {
        "samples": len(samples),
        "max_ms": mx,
        "p50_ms": percentile(samples, 50),
        "p90_ms": percentile(samples, 90),
        "p99_ms": percentile(samples, 99),
        "p999_ms": percentile(samples, 99.9),
        "mean_ms": sum(samples) / len(samples),
        "bound_ms": bound_ms,
        "valid": mx <= bound_ms,
        "reason": reason,
        "loop": busy,
        "cause": cause,
    }


def medium_totals(counters: list[dict]) -> dict:
    return {k: sum(int(c.get(k, 0)) for c in counters) for k in COUNTER_KEYS}


def assemble(spec, run: dict) -> dict:
    med = run.get("medium", {})
    lag = lag_stats(med.get("lag_ms", []), spec.lag_bound_ms, med.get("probe_real_s"), med.get("probe_cpu_s"))
    counters = med.get("counters", [])
    return {
        "name": spec.name,
        "valid": lag["valid"],
        "invalid_reason": lag["reason"],
        "lag": lag,
        "wall_seconds": run.get("wall_seconds"),
        "timed_out": run.get("timed_out"),
        "host_steal_seconds": run.get("host_steal_seconds"),
        "medium_forked": run.get("medium_forked", False),
        "medium": {
            "standard": spec.medium.standard, "rate_mbps": spec.medium.rate_mbps,
            "auto_rate": spec.medium.auto_rate, "retry_limit": spec.medium.retry_limit,
            "rts_cts": spec.medium.rts_cts, "rts_threshold": spec.medium.rts_threshold,
            "txop_us": spec.medium.txop_us,
            "broadcast_rate_mbps": spec.medium.broadcast_rate_mbps,
            "totals": medium_totals(counters), "per_node": counters,
            "sim_seconds": med.get("sim_seconds"), "control_log": med.get("control_log", []),
            "taps": med.get("taps"),
            "link_status": med.get("link_status") if spec.reports_link_status() else None,
        },
        "topology": spec.topology.to_dict(),
        "routing": spec.routing,
        "routing_dynamics": run.get("routing_dynamics"),
        "flows": run.get("flows", []),
        "progress": run.get("progress"),
        "events": run.get("events", []),
        "spec": spec.source,
    }


def by_group(flows: list[dict]) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = {}
    for f in flows:
        key = f["driver"] + (f"-{f['cc']}" if f.get("cc") else "")
        groups.setdefault(key, []).append(f["goodput_mbps"])
    return groups


def plot(res: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = by_group(res["flows"])
    files = []
    title = res["name"] + ("" if res["valid"] else "  [INVALID: lag bound exceeded]")
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, xs in sorted(groups.items()):
        s = sorted(xs)
        ys = [(i + 1) / len(s) for i in range(len(s))]
        ax.step([0.0] + s, [0.0] + ys, where="post", label=f"{name} (n={len(s)})")
    ax.set_xlabel("goodput (Mbit/s)")
    ax.set_ylabel("fraction of flows")
    ax.set_ylim(0, 1.02)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(out / f"goodput_cdf.{ext}")
        files.append(f"goodput_cdf.{ext}")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    names = sorted(groups)
    data = [groups[n] for n in names]
    ax.boxplot(data, whis=(0, 100))
    ax.set_xticks(range(1, len(names) + 1), names)
    ax.plot(range(1, len(names) + 1), [sum(d) / len(d) for d in data], "o", label="mean")
    ax.set_ylabel("goodput (Mbit/s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(out / f"goodput_box.{ext}")
        files.append(f"goodput_box.{ext}")
    plt.close(fig)
    if len(res["flows"]) <= 12:
        fig, ax = plt.subplots(figsize=(6, 4))
        labels = [f["label"] for f in res["flows"]]
        vals = [f["goodput_mbps"] for f in res["flows"]]
        bars = ax.bar(range(len(vals)), vals, color="tab:blue")
        for b, f in zip(bars, res["flows"]):
            txt = f"{f['goodput_mbps']:.2f} Mbit/s"
            if f.get("completion_s"):
                txt += f"\n{f['completion_s']:.1f} s"
            ax.annotate(txt, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                        va="bottom", fontsize=8)
        ax.set_xticks(range(len(vals)), labels, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("goodput (Mbit/s)")
        ax.set_ylim(0, max(vals + [0.1]) * 1.25)
        ax.grid(alpha=0.3, axis="y")
        ax.set_title(title, fontsize=10)
        fig.tight_layout()
        for ext in ("png", "svg"):
            fig.savefig(out / f"goodput_flows.{ext}")
            files.append(f"goodput_flows.{ext}")
        plt.close(fig)
    return files


def markdown(res: dict) -> str:
    lag = res["lag"]
    lines = [f"# {res['name']}", ""]
    if res["valid"]:
        lines.append(f"Valid run: max lag {fixed(lag['max_ms'], 1)} ms "
                     f"(p99 {fixed(lag.get('p99_ms'), 1)} ms, bound {lag['bound_ms']:g} ms).")
    else:
        lines.append(f"**INVALID RUN**: {res['invalid_reason']}. Numbers below are not trustworthy.")
    loop = lag.get("loop") or {}
    if loop.get("busy") is not None:
        lines.append(f"The medium's event loop had the CPU {100 * loop['busy']:.0f} % of the measured time"
                     + (f", {100 * loop['busy_while_behind']:.0f} % of the {loop['behind_s']:.1f} s it was "
                        f"more than {lag['bound_ms'] / 2:g} ms behind" if loop.get("busy_while_behind") is not None
                        else "") + ".")
    if res.get("host_steal_seconds") is not None:
        lines.append(f"CPU time taken by the hypervisor during the run (steal): "
                     f"{res['host_steal_seconds']:.2f} s.")
    m = res["medium"]
    lines += ["", f"Medium: 802.11{m['standard']} "
              + ("auto-rate (Minstrel)" if m["auto_rate"] else f"{m['rate_mbps']:g} Mbit/s")
              + f", retry limit {m['retry_limit']}, RTS/CTS "
              + ("on" if m["rts_cts"] else f"above {m['rts_threshold']} bytes" if m.get("rts_threshold") is not None
                 else "off")
              + (f", TXOP {m['txop_us']}" if m["txop_us"] else ""), ""]
    lines += ["| flow | driver | src→dst | hops | bytes | goodput (Mbit/s) | completion (s) | notes |",
              "|---|---|---|---|---|---|---|---|"]
    for f in res["flows"]:
        notes = []
        if f.get("loss") is not None:
            notes.append(f"loss {f['loss'] * 100:.1f}%")
        if f.get("delay_ms_p50") is not None:
            notes.append(f"delay p50 {f['delay_ms_p50']:.1f} ms p95 {f['delay_ms_p95']:.1f} ms")
        if f.get("voip_clp") is not None:
            notes.append(f"CLP {f['voip_clp']:.2f}")
        if f.get("sender_error"):
            notes.append(str(f["sender_error"]))
        drv = f["driver"] + (f"/{f['cc']}" if f.get("cc") else "")
        lines.append(f"| {f['label']} | {drv} | {f['src']}→{f['dst']} | {fixed(f['hops'])} | {f['bytes']} | "
                     f"{fixed(f['goodput_mbps'])} | {fixed(f['completion_s'])} | {'; '.join(notes)} |")
    groups = by_group(res["flows"])
    if any(len(v) > 1 for v in groups.values()):
        lines += ["", "| group | flows | median | mean | Q1 | Q3 |", "|---|---|---|---|---|---|"]
        for g, xs in sorted(groups.items()):
            lines.append(f"| {g} | {len(xs)} | {fixed(percentile(xs, 50))} | {fixed(sum(xs) / len(xs))} | "
                         f"{fixed(percentile(xs, 25))} | {fixed(percentile(xs, 75))} |")
    tot = m["totals"]
    lines += ["", "Medium counters (all nodes): " + ", ".join(f"{k} {v}" for k, v in tot.items()), ""]
    return "\n".join(lines)


def write(res: dict, out: Path) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "summary.md").write_text(markdown(res))
    files = ["results.json", "summary.md"]
    if res["flows"]:
        files += plot(res, out)
    return files
