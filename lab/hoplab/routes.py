"""Static shortest-path routes (ETX or hop count) computed by the lab."""

from __future__ import annotations

import heapq
import math

from .errors import SpecError
from .topology import Topology


def etx(t: Topology, a: int, b: int) -> float:
    """Expected transmission count of link a->b: 1 / (d_f * d_r) (De Couto et al.),
    with delivery ratios from the frame loss of each direction."""
    df = 1.0 - t.links.get((a, b), 1.0)
    dr = 1.0 - t.links.get((b, a), 1.0)
    if df <= 0.0 or dr <= 0.0:
        return math.inf
    return 1.0 / (df * dr)


def link_cost(t: Topology, a: int, b: int, metric: str) -> float:
    if metric == "hops":
        return 1.0 if (a, b) in t.links and t.links[(a, b)] < 1.0 else math.inf
    if metric == "etx":
        return etx(t, a, b)
    raise SpecError(f"unknown routing metric {metric!r} (etx or hops)")


def shortest_paths(t: Topology, src: int, metric: str = "etx") -> tuple[list[float], list[int]]:
    """Dijkstra from src; returns (cost, predecessor) lists (-1: none). Ties break on
    the lower node index so routes are deterministic."""
    dist = [math.inf] * t.n
    prev = [-1] * t.n
    dist[src] = 0.0
    heap = [(0.0, src)]
    while heap:
        d, a = heapq.heappop(heap)
        if d > dist[a]:
            continue
        for b in t.neighbours(a):
            c = link_cost(t, a, b, metric)
            if math.isinf(c):
                continue
            nd = d + c
            if nd < dist[b] - 1e-12 or (abs(nd - dist[b]) <= 1e-12 and a < prev[b]):
                dist[b] = nd
                prev[b] = a
                heapq.heappush(heap, (nd, b))
    return dist, prev


def path(t: Topology, src: int, dst: int, metric: str = "etx") -> list[int] | None:
    _, prev = shortest_paths(t, src, metric)
    if src != dst and prev[dst] < 0:
        return None
    p = [dst]
    while p[-1] != src:
        p.append(prev[p[-1]])
    return list(reversed(p))


def next_hops(t: Topology, metric: str = "etx") -> dict[int, dict[int, int]]:
    """table[a][d] = next hop from a towards d (only reachable d != a). Each next hop
    is the first hop of a's own shortest path to d."""
    table: dict[int, dict[int, int]] = {}
    for a in range(t.n):
        _, prev = shortest_paths(t, a, metric)
        row: dict[int, int] = {}
        for d in range(t.n):
            if d == a or prev[d] < 0:
                continue
            h = d
            while prev[h] != a:
                h = prev[h]
            row[d] = h
        table[a] = row
    return table


def hop_count(table: dict[int, dict[int, int]], src: int, dst: int) -> int | None:
    """Hops along the installed routes, or None if they do not reach dst."""
    hops, a = 0, src
    while a != dst:
        if dst not in table.get(a, {}) or hops > len(table):
            return None
        a = table[a][dst]
        hops += 1
    return hops
