"""Statistics of the reproduction report: the figures of a set of runs (STATS: median
goodput, fairness, VoIP quality, ...) and their bootstrap confidence intervals over
repetitions."""

from __future__ import annotations

import math
import random

from ..errors import SpecError
from ..results import percentile

BOOT_RESAMPLES = 2000
BOOT_SEED = 20090422  # fixed: the report of the same runs is always the same
CI_LEVEL = 0.95
# VoIP MOS (Hop §5.8) from the ITU-T E-model in Cole & Rosenbluth's simplification for
# G.711 with random loss: R = 94.2 - Id(d) - Ie(e), MOS from R.
EMODEL_R0 = 94.2


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


def _air_per_byte_hop(run: dict, flows: list[dict]) -> float | None:
    """Large-frame air time of the whole medium (every node's data frames, retries included)
    per byte delivered and hop crossed by the measured flows, in ns: what the medium spent
    on each byte·hop of goodput."""
    air_us = (run.get("totals") or {}).get("air_large_us")
    byte_hops = sum((f.get("bytes") or 0) * (f.get("hops") or 1) for f in flows)
    if air_us is None or byte_hops <= 0:
        return None
    return air_us * 1000.0 / byte_hops


def _resend_share(run: dict, _flows: list[dict]) -> float | None:
    """Hop's data packets sent again, as a share of all it sent (hopd's counters)."""
    d = run.get("hop_data") or {}
    if not d.get("sent"):
        return None
    return d.get("resent", 0) / d["sent"]


def _started_within(seconds: float):
    """The share of a run's flows whose first byte reached the destination within `seconds`
    of their start (issue 46's \"every flow starts\"); None where no flow records a first
    byte's time (a driver that keeps none)."""
    def fn(_run: dict, flows: list[dict]) -> float | None:
        if not flows or all("time_to_first_byte_s" not in f for f in flows):
            return None
        return sum(1 for f in flows if (f.get("time_to_first_byte_s") is not None
                                         and f["time_to_first_byte_s"] <= seconds)) / len(flows)
    return fn


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
    "started": _per_run(lambda r, fl: sum(1 for f in fl if (f.get("bytes") or 0) > 0) / len(fl) if fl else None),
    "started_10s": _per_run(_started_within(10.0)),
    "resend_share": _per_run(_resend_share),
    "air_per_byte_hop": _per_run(_air_per_byte_hop),
    "delay_median": _delay,
    "clp": _per_run(_voip("clp")),
    "mos": _per_run(_voip("mos")),
    "voip_loss": _per_run(_voip("loss")),
}
POOLED = {"median", "mean", "q1", "q3"}  # statistics of the flows pooled over runs
STAT_UNITS = {"jain": "", "jain_hw": "", "top3_share": "", "clp": "", "mos": "", "voip_loss": "",
              "delay_median": "s", "started": "", "started_10s": "", "resend_share": "", "air_per_byte_hop": "ns"}


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
