"""Workload generators that expand into flows."""

from __future__ import annotations

import math
import random

from . import routes
from .errors import SpecError
from .schema import check_keys, take
from .topology import Topology

# Hop §5.6.2 web file sizes: ~63 % below 10 KB, 25 % in 10-100 KB, the rest above 100 KB.
WEB_SIZE_MIX = ((0.63, 1_000, 10_000), (0.25, 10_000, 100_000), (0.12, 100_000, 1_000_000))
# Hop §5.6.2: web flows arrive as a Poisson process with lambda = 2 flows/s.
WEB_ARRIVAL_RATE = 2.0


def web_size(rng: random.Random) -> int:
    """One file size from the §5.6.2 mix, log-uniform inside each class."""
    u = rng.random()
    acc = 0.0
    for p, lo, hi in WEB_SIZE_MIX:
        acc += p
        if u <= acc:
            return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    _, lo, hi = WEB_SIZE_MIX[-1]
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def pairs_with_hops(t: Topology, metric: str, min_hops: int, max_hops: int | None) -> list[tuple[int, int]]:
    table = routes.next_hops(t, metric)
    out = []
    for a in range(t.n):
        for b in range(t.n):
            if a == b:
                continue
            h = routes.hop_count(table, a, b)
            if h is not None and h >= min_hops and (max_hops is None or h <= max_hops):
                out.append((a, b))
    return out


def expand(w: dict, where: str, t: Topology, seed: int) -> list[dict]:
    """The [[flow]] tables a [[workload]] table stands for (spec.parse_flow checks them)."""
    check_keys(w, {"kind", "driver", "count", "rate", "min_hops", "max_hops", "start", "metric",
                    "duration", "cc", "seed"}, where)
    kind = take(w, "kind", str, "", where)
    rng = random.Random(take(w, "seed", int, seed, where))
    driver = take(w, "driver", str, "tcp", where)
    count = take(w, "count", int, 10, where)
    metric = take(w, "metric", str, "etx", where)
    start = take(w, "start", float, 0.0, where)
    min_hops = take(w, "min_hops", int, 2 if kind == "web" else 1, where)
    max_hops = take(w, "max_hops", int, None, where)
    if count < 1:
        raise SpecError(f"{where}.count must be >= 1")
    pairs = pairs_with_hops(t, metric, min_hops, max_hops)
    if not pairs:
        raise SpecError(f"{where}: no node pairs with {min_hops}..{max_hops} hops")
    flows = []
    if kind == "web":
        lam = take(w, "rate", float, WEB_ARRIVAL_RATE, where)
        if lam <= 0:
            raise SpecError(f"{where}.rate must be > 0")
        at = start
        for i in range(count):
            at += rng.expovariate(lam)
            a, b = rng.choice(pairs)
            flows.append({"driver": driver, "src": a, "dst": b, "start": round(at, 4),
                          "size": web_size(rng), "label": f"web{i}", "cc": take(w, "cc", str, "cubic", where)})
    elif kind == "random_pairs":
        dur = take(w, "duration", float, None, where)
        for i in range(count):
            a, b = rng.choice(pairs)
            f = {"driver": driver, "src": a, "dst": b, "start": start, "label": f"rp{i}",
                 "cc": take(w, "cc", str, "cubic", where)}
            if dur is not None:
                f["duration"] = dur
            flows.append(f)
    else:
        raise SpecError(f"{where}.kind must be 'web' or 'random_pairs'")
    return flows
