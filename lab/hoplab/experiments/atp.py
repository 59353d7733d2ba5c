"""ATP experimental evaluation: single flow over 1-6 hops (§IV-A) and the stack topology
(§IV-D, Table II), hosted on the lab's 802.11g medium at the paper's bit rates."""

from __future__ import annotations

from .base import BASE_SEED, Experiment, Scale, Variant, hopd_transport, tcp

# ATP §IV-A: Testbed A at 24 Mbit/s; §IV-C/D: Testbed B (the stack) at 6 Mbit/s.
CHAIN_RATE_MBPS = 24.0
STACK_RATE_MBPS = 6.0
# ATP §IV-D: the three flows start 3 s apart.
STACK_STAGGER_S = 3.0


def variants() -> list[Variant]:
    vs = [hopd_transport("atp", "ATP, default", "atp"),
          hopd_transport("atp-aggressive", "ATP, aggressive", "atp-aggressive"),
          hopd_transport("atp-adaptive", "ATP, adaptive", "atp-adaptive"),
          # The paper's TCP Tahoe was its own user-space implementation; the kernel offers Reno.
          tcp("tcp-reno", "TCP Reno (kernel; the paper: Tahoe)", cc="reno")]
    for v in vs:
        v.medium = {"retry_limit": 7}
    return vs


def build_chain(e, v, hops, rep, p):
    return {"name": f"atp-chain-{hops}h", "duration": p["cutoff"], "seed": BASE_SEED + rep,
            "medium": {"standard": "g", "rate_mbps": CHAIN_RATE_MBPS},
            "topology": {"kind": "chain", "nodes": hops + 1},
            "flow": [{"label": "m", "src": 0, "dst": hops, "size": p["size"]}]}


def build_stack(e, v, point, rep, p):
    # Three parallel 3-hop chains (grid rows); neighbouring rows hear each other, the outer
    # rows do not: flows 1 and 2 on the outer rows, flow 3 in the middle (the one Table II
    # shows starved by Tahoe).
    return {"name": "atp-stack", "duration": p["duration"], "seed": BASE_SEED + rep, "routing": "hops",
            "medium": {"standard": "g", "rate_mbps": STACK_RATE_MBPS},
            "topology": {"kind": "grid", "rows": 3, "cols": 4},
            "flow": [{"label": "m1", "src": 0, "dst": 3, "size": p["size"], "start": 0.0},
                     {"label": "m2", "src": 8, "dst": 11, "size": p["size"], "start": STACK_STAGGER_S},
                     {"label": "m3", "src": 4, "dst": 7, "size": p["size"], "start": 2 * STACK_STAGGER_S}]}


def experiments() -> list[Experiment]:
    return [
        Experiment(
            "atp-chain", "Single flow over 1-6 hops", "atp", "ATP §IV-A, Fig. 5",
            variants(), build_chain, point_name="hops",
            full=Scale(reps=1, points=[1, 2, 4, 6], params={"size": "3MB", "cutoff": 60.0}),
            run_seconds=lambda p, x: min(p["cutoff"], 10.0 + 4.0 * x)),
        Experiment(
            "atp-stack", "Three-flow stack", "atp", "ATP §IV-D, Fig. 13, Table II",
            variants(), build_stack,
            full=Scale(reps=2, points=[None], params={"duration": 60.0, "size": "40MB"}),
            run_seconds=lambda p, x: p["duration"],
            notes=["The stack is three parallel 3-hop chains (the paper's Fig. 12 placement is not in the text).",
                   "Per-flow goodput over each flow's life, not only while all three are active."]),
    ]
