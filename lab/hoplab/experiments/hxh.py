"""HxH paper (WICON 2008) §4.1 dumbbell and §4.6 grid, hosted on the lab's 802.11b medium."""

from __future__ import annotations

from .base import BASE_SEED, Experiment, Scale, Variant, diagnostic, hopd_transport, tcp

# HxH §4: the simulations use RTS/CTS for every frame; ns-2's default retry limit.
HXH_MEDIUM = {"retry_limit": 7, "rts_cts": True}
# HxH §4.1: the four flows start ten seconds apart; Table 1 covers the last 30 s.
STAGGER_S = 10.0
# HxH §4: "We use a packet size of 1000 bytes", for every protocol compared. HxH and ATP carry
# 1000 payload bytes per packet (hop_proto's PACKET_PAYLOAD_BYTES); TCP gets the same with
# TCP_MAXSEG 1012 (1000 bytes plus the 12-byte timestamp option Linux puts in each segment).
PAPER_TCP_MSS = 1012


def variants(reference: bool = False) -> list[Variant]:
    """HxH, ATP and NewReno with the paper's packet size; with `reference`, also NewReno
    with the kernel's own segments (1448 payload bytes on the lab's 1500-byte MTU) and HxH
    acknowledging every packet (§3.4's explicit variant, without overhearing)."""
    # HxH §3.2: passive feedback from overheard forwards (hopd `overhear`; the medium passes
    # the frames for other nodes to the taps, as a radio receiver hears them).
    hxh = hopd_transport("hxh", "HxH (hopd), passive feedback", "hxh")
    hxh.flow["options"]["overhear"] = True
    atp = hopd_transport("atp", "ATP, default (hopd)", "atp")
    reno = tcp("tcp-reno", "TCP NewReno (kernel reno), 1000-byte segments as in the paper", cc="reno")
    reno.flow["options"] = {"mss": PAPER_TCP_MSS}
    out = [hxh, atp, reno]
    if reference:
        out.append(diagnostic(tcp("tcp-reno-1448", "TCP NewReno (kernel reno), the kernel's 1448-byte segments",
                                  cc="reno")))
        out.append(diagnostic(hopd_transport("hxh-explicit", "HxH (hopd), a per-hop ack for every packet", "hxh")))
    for v in out:
        v.medium = dict(HXH_MEDIUM)
    hxh.medium["overhear"] = True
    return out


def dumbbell() -> dict:
    """Sources 0-3 (in range of each other) -> 4 -> 5 -> 6 -> 7 -> 8 -> sinks 9-12: the four
    flows share the four-hop bottleneck 4..8 (HxH Fig. 3)."""
    links = []
    for s in range(4):
        links.append({"a": s, "b": 4, "loss": 0.0})
        links += [{"a": s, "b": o, "loss": 0.0} for o in range(s + 1, 4)]
    links += [{"a": i, "b": i + 1, "loss": 0.0} for i in range(4, 8)]
    for k in range(9, 13):
        links.append({"a": 8, "b": k, "loss": 0.0})
        links += [{"a": k, "b": o, "loss": 0.0} for o in range(k + 1, 13)]
    return {"nodes": 13, "links": links}


def two_hop_sense(t: dict) -> list[list[int]]:
    """Every pair of nodes two hops apart: each senses the other's carrier."""
    nb: dict[int, set[int]] = {}
    for link in t["links"]:
        nb.setdefault(link["a"], set()).add(link["b"])
        nb.setdefault(link["b"], set()).add(link["a"])
    return [list(p) for p in sorted({(min(a, c), max(a, c)) for a in nb for b in nb[a] for c in nb[b]
                                     if c != a and c not in nb[a]})]


def build_dumbbell(e, v, point, rep, p):
    t = dumbbell()
    if p.get("sensed"):
        t["sense"] = two_hop_sense(t)
    d = {"name": e.id, "duration": p["duration"], "seed": BASE_SEED + rep, "routing": "hops", "_topology": t}
    d["flow"] = [{"label": f"m{i + 1}", "src": i, "dst": 9 + i, "size": p["size"], "start": i * p["stagger"]}
                 for i in range(4)]
    return d


def build_grid(e, v, point, rep, p):
    d = {"name": "hxh-grid", "duration": p["duration"], "seed": BASE_SEED + rep, "routing": "hops",
         "topology": {"kind": "grid", "rows": 6, "cols": 6}}
    # HxH §4.6: flows 1-6 top to bottom (columns), 7-12 left to right (rows).
    flows = [{"label": f"m{c + 1}", "src": c, "dst": 30 + c, "size": p["size"]} for c in range(6)]
    flows += [{"label": f"m{r + 7}", "src": 6 * r, "dst": 6 * r + 5, "size": p["size"]} for r in range(6)]
    d["flow"] = flows
    return d


def experiments() -> list[Experiment]:
    return [
        Experiment(
            "hxh-dumbbell", "Four flows through a 4-hop bottleneck", "hxh", "HxH §4.1, Fig. 4, Table 1",
            variants(reference=True), build_dumbbell,
            full=Scale(reps=2, points=[None], params={"duration": 70.0, "stagger": STAGGER_S, "size": "40MB"}),
            run_seconds=lambda p, x: p["duration"],
            notes=["802.11b 11 Mbit/s with RTS/CTS (the paper: an 802.11g-like 54 Mbit/s ns-2 channel, 1000-byte "
                   "packets, AODV): absolute rates differ, ratios and fairness are comparable.",
                   "Every protocol sends 1000-byte packets, as in the paper (TCP: TCP_MAXSEG 1012); "
                   "`tcp-reno-1448` is NewReno with the kernel's own 1448-byte segments, for reference.",
                   "HxH learns from overheard forwards (§3.2 passive feedback: hopd `overhear`, the medium "
                   "passes frames for other nodes to the taps); `hxh-explicit` acknowledges every packet "
                   "instead (§3.4's explicit variant), for reference.",
                   "Per-flow goodput over each flow's whole life, not only the last 30 s."]),
        Experiment(
            "hxh-dumbbell-sensed", "The dumbbell with two-hop carrier sensing", "hxh",
            "HxH §4.1, Table 1 (hosting: ns-2's carrier-sense range)",
            [v for v in variants(reference=True) if v.name in ("hxh", "hxh-explicit", "tcp-reno")],
            build_dumbbell,
            full=Scale(reps=2, points=[None],
                       params={"duration": 70.0, "stagger": STAGGER_S, "size": "40MB", "sensed": True}),
            run_seconds=lambda p, x: p["duration"],
            notes=["The dumbbell of hxh-dumbbell with every pair of nodes two hops apart sensing each other's "
                   "carrier (busy air and interference, never decoded). ns-2, where the paper ran, senses a "
                   "carrier to 550 m by default against a 250 m reception range, so nodes two hops apart on a "
                   "chain of the paper's kind hear each other's carrier; the lab's default medium makes every "
                   "pair without a link deaf. The paper does not give the spacing, so both are reported."]),
        Experiment(
            "hxh-grid", "6x6 grid, 12 crossing flows", "hxh", "HxH §4.6, Fig. 10",
            variants(), build_grid,
            full=Scale(reps=1, points=[None], params={"duration": 60.0, "size": "40MB"}),
            run_seconds=lambda p, x: p["duration"]),
    ]
