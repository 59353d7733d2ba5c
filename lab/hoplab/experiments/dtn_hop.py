"""dtn7 over Hop (the `dtn-hop` driver: dtnd at a flow's two ends, the hop-dtn bridge between
each dtnd and its hopd, Hop across the relays) beside dtn7 over TCPCLv4 at every node of the
path (`dtn`) and Hop alone, in settings of the Hop paper's §5. Not in the papers, so the
experiments are opt-in (`hoplab reproduce --only ID`) and their report rows have no paper
figure."""

from __future__ import annotations

import copy

from ..dtnclient import BUNDLE_BYTES
from ..schema import parse_size
from .base import DTN, DTN_RETRY, Experiment, Scale, Variant, dtn_hop, hop
from .hop_paper import FILE_FULL, base, build_52, build_57, chain_transfer_time, flows_time

# Bundles that fit one Hop block: dtnd adds about 90 bytes to a bundle's payload (its primary
# and extension blocks: a bundle of the `dtn` driver's 1 MiB payload reached hopd as 1 048 666
# bytes), so such a bundle crosses Hop as a full 1 MiB block and a block of 90 bytes, one more
# BSYN/BACK round per hop and bundle. Both DTN variants send bundles of this size, so they
# carry the same bundles.
BUNDLE = BUNDLE_BYTES - 1024


def with_bundle(v: Variant) -> Variant:
    v = copy.deepcopy(v)
    v.flow.setdefault("options", {})["bundle"] = BUNDLE
    v.title += f", bundles of {BUNDLE} bytes"
    return v


# ---- a lossy chain -----------------------------------------------------------------------------

LOSSY_HOPS = 4
LOSSY_LOSS = 0.25


def build_lossy(e, v, loss, rep, p):
    d = base(f"dtnhop-lossy-{loss:g}", p["cutoff"], rep)
    d["topology"] = {"kind": "chain", "nodes": LOSSY_HOPS + 1, "loss": loss}
    d["flow"] = [{"label": "m", "src": 0, "dst": LOSSY_HOPS, "size": p["size"]}]
    return d


def lossy_time(p, loss) -> float:
    # About 0.75 Mbit/s over four hops losing a quarter of their frames, bounded by the cut-off.
    return min(p["cutoff"], parse_size(p["size"]) * 8 / 0.75e6 + 5)


WHAT = ("`dtn-hop` is dtn7's dtnd at the flow's two ends only, each with the hop-dtn bridge as its "
        "convergence layer (dtnd's external convergence layer, `--ecla`) and hopd on every node as the Hop "
        "variant runs it: Hop carries each bundle as one transfer across the relays. `dtn` is dtnd on every "
        "node of the path, bundles forwarded hop by hop over TCPCLv4. Both DTN variants post the same bundles "
        "to the source's dtnd and count them at the destination's endpoint (hoplab.dtnclient), so goodput "
        "(unique payload bytes over the time from the first post to the last bundle) and duplicate bundles "
        "are measured alike; the report's bundle table has the bridges' counters.")
BUNDLE_NOTE = (f"Both DTN variants send bundles of {BUNDLE} bytes (payload with the clients' header), not the "
               "`dtn` driver's 1 MiB: with dtnd's own blocks a bundle then fits one 1 MiB Hop block instead of "
               "spilling about 90 bytes into a second.")


def experiments() -> list[Experiment]:
    return [
        Experiment(
            "dtn-hop-5.2", "One multi-hop bundle transfer: dtn7 over Hop, over TCPCL, and Hop alone", "hop",
            "Hop §5.2 setting (dtn7 over Hop is not in the paper)",
            [hop(), with_bundle(DTN), with_bundle(dtn_hop())], build_52, point_name="hops",
            full=Scale(reps=1, points=[2, 4, 7], params={"size": FILE_FULL, "cutoff": 90.0,
                                                         "flows_of": "hop-5.2"}),
            quick=Scale(reps=1, points=[2], params={"size": "300KB", "cutoff": 20.0, "flows_of": "hop-5.2"}),
            run_seconds=chain_transfer_time, opt_in=True,
            notes=[WHAT,
                   "`hop-5.2`'s mesh, pairs (the same seeded draw, first repetition) and transfer: 2 MB cut off "
                   "at 90 s, at 2, 4 and 7 hops, one run per hop count (quick: 300 KB at 2 hops).",
                   BUNDLE_NOTE]),
        Experiment(
            "dtn-hop-5.7", "Partitioned 7-hop path: dtn7 over Hop, over TCPCL, and Hop alone", "hop",
            "Hop §5.7 setting (dtn7 over Hop is not in the paper)",
            [hop("hop-h100", "Hop, H = 100", backpressure_limit=100), with_bundle(DTN_RETRY),
             with_bundle(dtn_hop("dtn-hop", "DTN (dtn7 0.21) over Hop (hop-dtn bridge, hopd), H = 100",
                                 janitor="10s", backpressure_limit=100))],
            build_57,
            full=Scale(reps=1, points=[None], params={"duration": 180.0, "period": 60.0}), run_seconds=flows_time,
            opt_in=True,
            notes=[WHAT,
                   "`hop-5.7`'s path and schedule: nodes 2 and 4 go down alternately for 60 s each for 180 s, "
                   "never an end-to-end path. dtnd runs only at nodes 0 and 7 in `dtn-hop`: the relays hold "
                   "the bundles as Hop blocks (H = 100, as `hop-h100`), where `dtn` stores them in each "
                   "relay's dtnd and retries a failed forwarding every 10 s (its janitor).",
                   "`dtn-hop`'s dtnd has the same 10 s janitor. It matters only for a bundle dtnd could not "
                   "hand to the bridge: dtnd hands each bundle over once, the bridge's peers being announced "
                   "every second, and forgets it; a copy handed over again would show as a duplicate from "
                   "dtnd in the bridge's counters.",
                   BUNDLE_NOTE]),
        Experiment(
            "dtn-hop-lossy", f"A {LOSSY_HOPS}-hop chain losing {LOSSY_LOSS:.0%} and {2 * LOSSY_LOSS:.0%} of the frames on every link: "
            "dtn7 over Hop, over TCPCL, and Hop alone", "hop",
            "not in the paper (lossy links as Hop §5.1, over several hops)",
            [hop(), with_bundle(DTN), with_bundle(dtn_hop())], build_lossy, point_name="loss",
            full=Scale(reps=2, points=[LOSSY_LOSS, 2 * LOSSY_LOSS], params={"size": FILE_FULL, "cutoff": 90.0}),
            quick=Scale(reps=1, points=[LOSSY_LOSS], params={"size": "300KB", "cutoff": 30.0}),
            run_seconds=lossy_time, opt_in=True,
            notes=[WHAT,
                   f"A chain of {LOSSY_HOPS + 1} nodes whose links each lose {LOSSY_LOSS:.0%} (and, second "
                   f"point, {2 * LOSSY_LOSS:.0%}) of the data frames in each direction (the medium's per-link loss; MAC acknowledgements are not lost). "
                   "TCPCL's frames get the medium's 18 retries (max-ARQ), so `dtn` sees the loss as air "
                   "time; Hop's data go as link broadcasts, never retried, and each hop resends what its "
                   "next hop's BACK reports missing. One 2 MB transfer cut off at 90 s, two repetitions per point "
                   "(quick: 300 KB, 30 s). The lab had no lossy-chain experiment: this setting is ours.",
                   BUNDLE_NOTE]),
    ]
