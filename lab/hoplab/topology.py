"""Topologies: nodes and directed links with frame loss rates.

A link (a, b) means b hears a: a's frames reach b (subject to the link's loss
rate) and a and b sense each other's carrier. Pairs without a link are out of
range of each other, so they are hidden terminals when they share a neighbour.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SpecError

# Hop §5.5: "7-to-1 topology ... Among the seven transmitters, six pairs were hidden terminals".
AP_SENDERS = 7
AP_HIDDEN_PAIRS = 6
# Hop §5 testbed: 20 nodes, 56 unique links, mean link loss 25 %, median 1 % (§5.1.1).
MESH_NODES = 20
MESH_LINKS = 56


@dataclass
class Topology:
    n: int
    links: dict[tuple[int, int], float] = field(default_factory=dict)  # directed (a, b) -> loss
    name: str = "custom"
    positions: list[tuple[float, float]] | None = None
    # Node pairs out of range that still sense each other's carrier (undirected, a < b): their
    # frames are heard as busy air and as interference, never decoded (see with_sense_range).
    sense: set[tuple[int, int]] = field(default_factory=set)

    def add(self, a: int, b: int, loss_ab: float = 0.0, loss_ba: float | None = None) -> None:
        for x in (a, b):
            if not 0 <= x < self.n:
                raise SpecError(f"link endpoint {x} outside 0..{self.n - 1}")
        if a == b:
            raise SpecError(f"self link at node {a}")
        for loss in (loss_ab, loss_ba if loss_ba is not None else loss_ab):
            if not 0.0 <= loss <= 1.0:
                raise SpecError(f"loss rate {loss} outside [0, 1]")
        self.links[(a, b)] = loss_ab
        self.links[(b, a)] = loss_ab if loss_ba is None else loss_ba

    def neighbours(self, a: int) -> list[int]:
        return sorted(b for (x, b) in self.links if x == a)

    def undirected(self) -> list[tuple[int, int]]:
        return sorted({(min(a, b), max(a, b)) for (a, b) in self.links})

    def in_range(self, a: int, b: int) -> bool:
        return (a, b) in self.links

    def to_dict(self) -> dict:
        d = {
            "name": self.name,
            "nodes": self.n,
            "links": [{"a": a, "b": b, "loss": loss} for (a, b), loss in sorted(self.links.items())],
        }
        if self.sense:
            d["sense"] = [list(p) for p in sorted(self.sense)]
        return d

    def hidden_pairs(self) -> list[tuple[int, int]]:
        """Pairs (a < b) that share a neighbour but neither hear nor sense each other."""
        nb = {a: set(self.neighbours(a)) for a in range(self.n)}
        return [(a, c) for a in range(self.n) for c in range(a + 1, self.n)
                if c not in nb[a] and (a, c) not in self.sense and nb[a] & nb[c]]


def chain(n: int, loss: float = 0.0) -> Topology:
    if n < 2:
        raise SpecError("a chain needs at least 2 nodes")
    t = Topology(n, name=f"chain-{n}")
    for i in range(n - 1):
        t.add(i, i + 1, loss)
    return t


def grid(rows: int, cols: int, loss: float = 0.0) -> Topology:
    if rows < 1 or cols < 1 or rows * cols < 2:
        raise SpecError("a grid needs at least 2 nodes")
    t = Topology(rows * cols, name=f"grid-{rows}x{cols}")
    for r in range(rows):
        for c in range(cols):
            i = r * cols + c
            if c + 1 < cols:
                t.add(i, i + 1, loss)
            if r + 1 < rows:
                t.add(i, i + cols, loss)
    return t


def star(senders: int = AP_SENDERS, hidden_pairs: int = AP_HIDDEN_PAIRS, loss: float = 0.0) -> Topology:
    """Node 0 is the AP; nodes 1..senders sit on a circle around it and all reach it.
    The `hidden_pairs` sender pairs farthest apart on the circle cannot hear each
    other (hidden terminals); all other sender pairs are in range."""
    pairs = [(a, b) for a in range(1, senders + 1) for b in range(a + 1, senders + 1)]
    if not 0 <= hidden_pairs <= len(pairs):
        raise SpecError(f"hidden_pairs must be in 0..{len(pairs)}")
    t = Topology(senders + 1, name=f"star-{senders}-hidden{hidden_pairs}")
    for s in range(1, senders + 1):
        t.add(s, 0, loss)

    def circ(p: tuple[int, int]) -> int:
        d = p[1] - p[0]
        return min(d, senders - d)

    hidden = set(sorted(pairs, key=lambda p: (-circ(p), p))[:hidden_pairs])
    for a, b in pairs:
        if (a, b) not in hidden:
            t.add(a, b, loss)
    return t


def _loss_from_rank(q: float, rng: random.Random) -> float:
    """Indoor-like loss for a link whose length is the q-quantile of all link
    lengths: near zero for most links, rising steeply for the longest quarter."""
    z = (q - 0.76) / 0.06 + rng.gauss(0.0, 0.7)
    return round(0.95 / (1.0 + math.exp(-z)), 4)


def mesh(n: int = MESH_NODES, links: int = MESH_LINKS, seed: int = 1) -> Topology:
    """Seeded random indoor mesh: nodes on a floor (a 3:1 rectangle), the `links`
    shortest node pairs become links (connected graph guaranteed), loss rising with
    distance so the median is small and the mean large, like the Hop testbed (§5.1.1)."""
    if n < 2:
        raise SpecError("a mesh needs at least 2 nodes")
    if not n - 1 <= links <= n * (n - 1) // 2:
        raise SpecError(f"links must be in {n - 1}..{n * (n - 1) // 2}")
    rng = random.Random(seed)
    for _attempt in range(1000):
        pos = [(rng.uniform(0, 3.0), rng.uniform(0, 1.0)) for _ in range(n)]
        pairs = sorted(
            ((math.dist(pos[a], pos[b]), a, b) for a in range(n) for b in range(a + 1, n))
        )
        chosen = pairs[:links]
        t = Topology(n, name=f"mesh-{n}-s{seed}", positions=pos)
        for k, (_d, a, b) in enumerate(chosen):
            q = k / max(1, links - 1)
            t.add(a, b, _loss_from_rank(q, rng), _loss_from_rank(q, rng))
        if is_connected(t):
            return t
    raise SpecError("could not draw a connected mesh; use more links")


def with_sense_range(t: Topology, ratio: float) -> Topology:
    """Carrier sensing beyond the links: every pair without a link closer than `ratio` times
    the longest link senses the other's frames (busy air, interference) without decoding
    them. Real radios sense a carrier farther than they can decode a frame; the default
    topology (no sense pairs) makes every pair without a link deaf to each other, the most
    hidden terminals a floor can have. Needs node positions (mesh)."""
    if t.positions is None:
        raise SpecError("sense_range needs node positions (topology kind 'mesh')")
    if not ratio >= 1.0:
        raise SpecError(f"sense_range must be at least 1 (a multiple of the longest link), not {ratio}")
    pos = t.positions
    reach = ratio * max(math.dist(pos[a], pos[b]) for a, b in t.undirected())
    t.sense = {(a, b) for a in range(t.n) for b in range(a + 1, t.n)
               if not t.in_range(a, b) and math.dist(pos[a], pos[b]) <= reach}
    t.name = f"{t.name}-sense{ratio:g}"
    return t


def is_connected(t: Topology) -> bool:
    seen = {0}
    stack = [0]
    while stack:
        a = stack.pop()
        for b in t.neighbours(a):
            if b not in seen:
                seen.add(b)
                stack.append(b)
    return len(seen) == t.n


def from_file(path: Path) -> Topology:
    """JSON or TOML: {"nodes": N, "links": [{"a":0,"b":1,"loss":0.1,"loss_back":0.2}, ...]}."""
    text = path.read_text()
    if path.suffix == ".toml":
        import tomllib

        data = tomllib.loads(text)
    else:
        data = json.loads(text)
    return from_dict(data, name=path.stem)


def from_dict(data: dict, name: str = "custom") -> Topology:
    """The inverse of Topology.to_dict: nodes, links and sense pairs."""
    try:
        t = Topology(int(data["nodes"]), name=data.get("name", name))
        links = data.get("links", [])
        listed = {(int(link["a"]), int(link["b"])) for link in links}
        for link in links:
            a, b, loss = int(link["a"]), int(link["b"]), float(link.get("loss", 0.0))
            if "loss_back" in link:
                back = float(link["loss_back"])
            elif (b, a) in listed:
                # to_dict's form: one entry per direction, so this entry sets a -> b only
                # (b -> a keeps its own entry's loss, whichever comes first).
                back = t.links.get((b, a), loss)
            else:
                back = None
            t.add(a, b, loss, back)
        for a, b in (sorted((int(p[0]), int(p[1]))) for p in data.get("sense", [])):
            if not 0 <= a < b < t.n or t.in_range(a, b):
                raise SpecError(f"bad topology: sense pair {a}, {b} must be two nodes without a link")
            t.sense.add((a, b))
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise SpecError(f"bad topology: {e}") from e
    return t
