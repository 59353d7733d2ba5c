"""What any protocol could deliver on a run's floor and flows: an upper bound from the
conflict graph of the links its routes use.

Two links conflict when their frames cannot both arrive if they overlap in time: they share a
node (a radio sends or receives one frame at a time), or the sender of one is in range of the
receiver of the other (the lab gives every link the same path loss, so two frames at one
receiver collide; docs/lab.md). Links that conflict pairwise (a clique of the conflict graph)
must take turns, so over any schedule the air time they need adds up to at most one second per
second. A link (a, b) that loses a share p of its frames delivers at most C (1 - p), with C the
payload rate of back-to-back full-size frames at the PHY rate (no contention, ACKs, control
frames or headers beyond one frame's). Flows keep their ETX routes, as in the lab, and every
packet crosses every link of its route: a node that overhears a packet two hops upstream and
so spares its upstream neighbour the frame (opportunistic routing; Hop's caches can do this
through a BACK that reports the packet held) is not modelled.

These constraints are necessary, not sufficient (no MAC reaches them, and a schedule meeting
every clique's constraint may not exist), so every figure here is an upper bound:
- the best mean goodput over flows, any allocation (a linear program);
- the best mean goodput with the hop-weighted Jain index (Hop §5.3.2) at least J: Jain >= J is
  the cone sqrt(n J) ||x||_2 <= sum(x) with x_i = goodput_i * hops_i, so the problem is convex;
- the max-min fair allocation (progressive filling).

Time-averaged rates over a run lie in the same region, so a run's per-flow goodputs (bytes over
the time each flow had) are points below it. A transfer that finished is credited with its
bytes over its own span, which can sit above its run-long average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import routes
from .errors import LabError
from .reproduce.stats import jain_hop_weighted
from .topology import Topology

# A full-size frame: a 1500-byte IP packet carrying 1460 bytes of TCP payload (the largest
# payload any protocol here puts in one frame), 34 bytes of 802.11 header, LLC/SNAP and FCS,
# after 802.11b's long PLCP preamble and header (192 us).
FRAME_PAYLOAD_BYTES = 1460
FRAME_BYTES = 1500 + 34
PLCP_US = 192.0


def frame_payload_rate_mbps(rate_mbps: float) -> float:
    """Payload Mbit per second of air of back-to-back full-size frames at `rate_mbps`."""
    if not rate_mbps > 0:
        raise LabError(f"the PHY rate must be positive, not {rate_mbps}")
    return FRAME_PAYLOAD_BYTES * 8 / (PLCP_US + FRAME_BYTES * 8 / rate_mbps)


@dataclass
class Bound:
    """The bound for one floor and one set of flows (rates in Mbit/s)."""
    hops: list[int]
    links: list[tuple[int, int]]
    cliques: list[list[int]]
    # Rows: cliques; columns: flows; air seconds per Mbit a flow's path spends in the clique.
    air: list[list[float]]
    max_mean: float
    max_min: list[float] = field(default_factory=list)

    @property
    def flows(self) -> int:
        return len(self.hops)

    def max_min_mean(self) -> float:
        return sum(self.max_min) / self.flows

    def mean_at_jain(self, jain: float) -> float:
        """The best mean goodput over flows with a hop-weighted Jain index of at least `jain`."""
        return best_mean_at_jain(self, jain)

    def share_of_frontier(self, goodputs: list[float]) -> float | None:
        """A measured allocation's mean over the best mean at its own hop-weighted Jain index."""
        if len(goodputs) != self.flows:
            raise LabError(f"{len(goodputs)} goodputs for {self.flows} flows")
        j = jain_hop_weighted(goodputs, self.hops)
        best = self.mean_at_jain(j)
        return (sum(goodputs) / self.flows) / best if best > 0 else None


def _conflicts(t: Topology, l1: tuple[int, int], l2: tuple[int, int]) -> bool:
    (a, b), (c, d) = l1, l2
    if {a, b} & {c, d}:
        return True
    return t.in_range(c, b) or t.in_range(a, d)


def _max_cliques(adj: list[set[int]]) -> list[list[int]]:
    """Maximal cliques (Bron-Kerbosch with pivoting)."""
    out: list[list[int]] = []

    def grow(r: set[int], p: set[int], x: set[int]) -> None:
        if not p and not x:
            out.append(sorted(r))
            return
        pivot = max(p | x, key=lambda v: len(adj[v] & p))
        for v in sorted(p - adj[pivot]):
            grow(r | {v}, p & adj[v], x & adj[v])
            p = p - {v}
            x = x | {v}

    grow(set(), set(range(len(adj))), set())
    return out


def bound(t: Topology, flows: list[tuple[int, int]], rate_mbps: float, metric: str = "etx",
          paths: list[list[int]] | None = None) -> Bound:
    """The bound for flows (src, dst) on floor `t` over their `metric` routes, or over the
    node `paths` given (one per flow, from its source to its destination)."""
    if not flows:
        raise LabError("no flows to bound")
    if paths is not None:
        if len(paths) != len(flows) or any(len(p) < 2 or (p[0], p[-1]) != f or any(
                (p[i], p[i + 1]) not in t.links for i in range(len(p) - 1)) for p, f in zip(paths, flows)):
            raise LabError("each flow needs a path of links from its source to its destination")
        return _bound_over(t, [list(p) for p in paths], rate_mbps)
    table = routes.next_hops(t, metric)
    paths = []
    for s, d in flows:
        # The path the lab's nodes forward along: each node's own next hop toward d.
        p = [s]
        while p[-1] != d and len(p) <= t.n:
            nxt = table.get(p[-1], {}).get(d)
            if nxt is None:
                raise LabError(f"no route from {s} to {d} on {t.name}")
            p.append(nxt)
        if len(p) < 2 or p[-1] != d:
            raise LabError(f"no loop-free route from {s} to {d} on {t.name}")
        paths.append(p)
    return _bound_over(t, paths, rate_mbps)


def _bound_over(t: Topology, paths: list[list[int]], rate_mbps: float) -> Bound:
    from scipy.optimize import linprog

    c = frame_payload_rate_mbps(rate_mbps)
    links = sorted({(p[i], p[i + 1]) for p in paths for i in range(len(p) - 1)})
    for lk in links:
        if t.links[lk] >= 1.0:
            raise LabError(f"route over link {lk[0]} -> {lk[1]}, which loses every frame")
    adj = [set() for _ in links]
    for i in range(len(links)):
        for j in range(i + 1, len(links)):
            if _conflicts(t, links[i], links[j]):
                adj[i].add(j)
                adj[j].add(i)
    cliques = _max_cliques(adj)
    index = {lk: i for i, lk in enumerate(links)}
    air = []
    for k in cliques:
        members = set(k)
        row = []
        for p in paths:
            row.append(sum(1.0 / (c * (1.0 - t.links[(p[i], p[i + 1])]))
                           for i in range(len(p) - 1) if index[(p[i], p[i + 1])] in members))
        air.append(row)
    n = len(paths)
    lp = linprog([-1.0] * n, A_ub=air, b_ub=[1.0] * len(air), bounds=[(0, None)] * n, method="highs")
    if not lp.success:
        raise LabError(f"the bound's linear program failed: {lp.message}")
    b = Bound(hops=[len(p) - 1 for p in paths], links=links, cliques=cliques, air=air,
              max_mean=-lp.fun / n)
    b.max_min = max_min_fair(air, n)
    return b


def max_min_fair(air: list[list[float]], n: int) -> list[float]:
    """Progressive filling: raise every unfrozen flow's rate together until a clique fills,
    freeze the flows that cannot go higher, repeat."""
    from scipy.optimize import linprog

    fixed: list[float | None] = [None] * n
    while any(v is None for v in fixed):
        free = [i for i in range(n) if fixed[i] is None]
        # Variables: the n rates, then the common level s of the free flows.
        a_ub = [row + [0.0] for row in air]
        a_eq, b_eq = [], []
        for i in range(n):
            r = [0.0] * (n + 1)
            r[i] = 1.0
            if fixed[i] is None:
                r[n] = -1.0
            a_eq.append(r)
            b_eq.append(0.0 if fixed[i] is None else fixed[i])
        lp = linprog([0.0] * n + [-1.0], A_ub=a_ub, b_ub=[1.0] * len(air), A_eq=a_eq, b_eq=b_eq,
                     bounds=[(0, None)] * (n + 1), method="highs")
        if not lp.success:
            raise LabError(f"max-min fair filling failed: {lp.message}")
        level = lp.x[n]
        frozen = 0
        for i in free:
            # Can flow i rise above the level with the other free flows held at it?
            a_eq2, b_eq2 = [], []
            for j in range(n):
                if j == i:
                    continue
                r = [0.0] * n
                r[j] = 1.0
                a_eq2.append(r)
                b_eq2.append(level if fixed[j] is None else fixed[j])
            obj = [0.0] * n
            obj[i] = -1.0
            up = linprog(obj, A_ub=air, b_ub=[1.0] * len(air), A_eq=a_eq2 or None, b_eq=b_eq2 or None,
                         bounds=[(0, None)] * n, method="highs")
            if not up.success or -up.fun <= level * (1 + 1e-7) + 1e-12:
                fixed[i] = level
                frozen += 1
        if frozen == 0:  # numerical corner: freeze all rather than loop
            for i in free:
                fixed[i] = level
    return [float(v) for v in fixed]


def best_mean_at_jain(b: Bound, jain: float, tolerance: float = 1e-3) -> float:
    """max mean(r) subject to the cliques and sqrt(n J) ||h r|| <= sum(h r), from above.

    The cone is the intersection of the half-spaces sqrt(n J) u.x <= sum(x) over unit vectors
    u, so a linear program over some of them relaxes the problem and its optimum is an upper
    bound. Each round adds the half-space the last optimum violates most (Kelley's cutting
    planes; the tangent where the segment below leaves the cone, as in the supporting
    hyperplane method) and stops when that bound is within `tolerance` (relative) of a feasible mean: the
    last optimum pulled toward equal goodput x hops (Jain 1) until it is inside the cone. The
    figure returned is the upper end, so the bound stays a bound."""
    import numpy as np
    from scipy.optimize import linprog

    if not 0.0 <= jain <= 1.0:
        raise LabError(f"a Jain index lies in [0, 1], not {jain}")
    n = b.flows
    if jain <= 1.0 / n:  # every allocation qualifies
        return b.max_mean
    a = np.array(b.air)
    h = np.array(b.hops, dtype=float)
    k = math.sqrt(n * jain)

    def inside(r) -> bool:
        x = h * r
        return k * np.linalg.norm(x) <= x.sum() * (1 + 1e-12)

    # Equal goodput x hops (Jain 1), scaled onto the cliques: feasible.
    r0 = 1.0 / h
    r0 = r0 / float((a @ r0).max())
    lower = float(r0.mean())
    cuts: list[np.ndarray] = []
    upper = b.max_mean
    for _ in range(5000):
        a_ub = np.vstack([a] + cuts) if cuts else a
        b_ub = np.concatenate([np.ones(len(a)), np.zeros(len(cuts))])
        lp = linprog(-np.ones(n) / n, A_ub=a_ub, b_ub=b_ub, bounds=[(0, None)] * n, method="highs")
        if not lp.success:
            raise LabError(f"the bound at Jain >= {jain:g}: linear program failed: {lp.message}")
        upper = -lp.fun
        r = np.clip(lp.x, 0, None)
        if inside(r):
            return upper
        lo, hi = 0.0, 1.0  # r0 + t (r - r0): t = 0 inside, t = 1 outside
        for _ in range(60):
            mid = (lo + hi) / 2
            if inside(r0 + mid * (r - r0)):
                lo = mid
            else:
                hi = mid
        edge = r0 + lo * (r - r0)
        lower = max(lower, float(edge.mean()))
        if upper - lower <= tolerance * upper:
            return upper
        # The cone's tangent half-space where the segment leaves it cuts the optimum off.
        x = h * edge
        u = x / np.linalg.norm(x)
        cuts.append(k * u * h - h)
    raise LabError(f"the bound at Jain >= {jain:g} did not close within 5000 cuts "
                   f"({1000 * lower:.1f}-{1000 * upper:.1f} kbit/s)")


def _goodputs(flows: list[dict]) -> list[float]:
    return [float(f.get("goodput_mbps") or 0.0) for f in flows]


def draw_bound(results: dict, variants: list[tuple[str, list[dict]]], jain: float = 0.78) -> dict:
    """The bound for one draw (a run's results.json: floor, routing, PHY rate) and the flows
    each protocol measured on it (the same endpoints, in the same order). Rates in Mbit/s."""
    from .topology import from_dict

    if not variants or len(variants[0][1]) < 2:
        raise LabError("a draw needs two flows or more to share the air")
    topo = results.get("topology")
    if not topo:
        raise LabError("the run's results hold no topology")
    t = from_dict(topo, topo.get("name", "floor"))
    pairs = [(int(f["src"]), int(f["dst"])) for f in variants[0][1]]
    for v, fl in variants:
        if [(int(f["src"]), int(f["dst"])) for f in fl] != pairs:
            raise LabError(f"{v} ran other flows than {variants[0][0]} on this draw")
    rate = float((results.get("medium") or {}).get("rate_mbps") or 11.0)
    b = bound(t, pairs, rate, results.get("routing") or "etx")
    return summary(b, [(v, _goodputs(fl)) for v, fl in variants], jain)


def summary(b: Bound, variants: list[tuple[str, list[float]]], jain: float = 0.78) -> dict:
    """The bound's figures and, per protocol (name, goodputs in flow order), its mean, its
    hop-weighted Jain index and its share of the best mean at that index."""
    out = {"flows": b.flows, "best_any": b.max_mean, "jain": jain, "best_at_jain": b.mean_at_jain(jain),
           "max_min": b.max_min_mean(), "max_min_jain": jain_hop_weighted(b.max_min, b.hops), "variants": {}}
    for v, g in sorted(variants, key=lambda x: x[0]):
        out["variants"][v] = {"mean": sum(g) / len(g), "jain": jain_hop_weighted(g, b.hops),
                              "share": b.share_of_frontier(g)}
    return out


def markdown(draws: list[tuple[str, dict]], jain: float) -> list[str]:
    """The per-draw table in kbit/s, shared by `hoplab bound` and the reproduction report."""
    lines = [f"| draw | flows | best mean, any | best mean, Jain >= {jain:g} | max-min fair mean (Jain) "
             "| protocol: mean (Jain, share of the best at that Jain) |",
             "|---|---|---|---|---|---|"]
    for label, d in draws:
        cells = []
        for v, m in d["variants"].items():
            share = "—" if m["share"] is None else f"{100 * m['share']:.0f} %"
            cells.append(f"{v} {1000 * m['mean']:.1f} ({m['jain']:.2f}, {share})")
        lines.append(f"| {label} | {d['flows']} | {1000 * d['best_any']:.1f} | {1000 * d['best_at_jain']:.1f} "
                     f"| {1000 * d['max_min']:.1f} ({d['max_min_jain']:.2f}) | {'; '.join(cells)} |")
    return lines
