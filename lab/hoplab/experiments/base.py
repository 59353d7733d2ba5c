"""What an experiment of `hoplab reproduce` is: an `Experiment` names the compared protocols
(`Variant`s), the points of its x axis (hop count, loss rate, number of flows, ...) and a
builder that returns the spec of one run for (variant, point, repetition). All variants of
one (point, repetition) get the same topology, flows and seed, and run back to back (Hop §5:
"the compared protocols are run in sequence, and each sequence is repeated"). Flows whose
label starts with `measure` are the measured ones; others (e.g. the VoIP call of §5.8) are
background.

Also the settings every experiment shares (BEST_MEDIUM, seeds, the per-run overhead) and the
variants of the compared protocols (`hop`, `tcp`, ...). The experiments themselves are in
hop_paper, hxh, atp and dtn_hop; the package's __init__ lists them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable

from ..spec import DEFAULT_STANDARD, default_rate

# Hop §5.1.1: the maximum 802.11 retry limit of the Atheros card ("max-ARQ"); Table 1: all
# protocols get max-ARQ and txop.
MAX_ARQ = 18
# Hop §4: txop of the background queue set to 8160 us (the MadWifi maximum).
TXOP_US = 8160
# Medium of every compared protocol unless the experiment varies it (Hop Table 1 caption).
BEST_MEDIUM = {"retry_limit": MAX_ARQ, "txop_us": {"be": TXOP_US, "bk": TXOP_US}}
# Seeds: repetition r of every experiment uses seed BASE_SEED + r for all its variants.
BASE_SEED = 1
# Per-run cost outside the flows: medium start (forked from a medium server that loaded
# ns-3 once, see hoplab.mediumserver), namespaces, daemons, teardown. Measured on the
# project machine: 8-9 s for a run on the 20-node mesh (~28 s when each run loads ns-3).
RUN_OVERHEAD_S = 10.0


@dataclass
class Variant:
    """One compared protocol: flow fields merged into every measured flow, medium keys
    merged into the spec's [medium], `spec` keys set at the spec's top level (routing).
    `unsupported` = why it cannot be hosted at all. A `diagnostic` variant is one of ours run
    beside the papers' protocols to explain a figure (a mechanism switched off, another
    setting): the presets leave it out unless asked (`--diagnostics`, or named in `--variants`)."""

    name: str
    title: str
    flow: dict
    medium: dict = field(default_factory=lambda: copy.deepcopy(BEST_MEDIUM))
    unsupported: str | None = None
    spec: dict = field(default_factory=dict)  # top-level spec keys, e.g. {"routing": "babel"}
    diagnostic: bool = False

    @property
    def driver(self) -> str:
        return self.flow.get("driver", "tcp")


@dataclass
class Scale:
    """Sizes and repetitions of one preset (full or quick)."""

    reps: int
    points: list
    variants: list[str] | None = None  # None: all
    params: dict = field(default_factory=dict)


@dataclass
class Experiment:
    id: str
    title: str
    paper: str  # "hop", "hxh", "atp"
    ref: str  # section / figure / table
    variants: list[Variant]
    build: Callable[["Experiment", Variant, object, int, dict], dict]
    full: Scale
    quick: Scale | None = None
    point_name: str = ""
    measure: str = "m"  # label prefix of the measured flows
    run_seconds: Callable[[dict, object], float] | None = None  # flow time of one run
    notes: list[str] = field(default_factory=list)
    # Run only when named (`--only`): experiments too long for the full preset's budget.
    opt_in: bool = False
    # Long-lived flows of many path lengths: the report adds their goodput by path length.
    by_path_length: bool = False

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)

    def scale(self, quick: bool) -> Scale | None:
        return self.quick if quick else self.full

    def runs_variant(self, v: Variant, quick: bool, variants: set[str] | None = None,
                     diagnostics: bool = False) -> bool:
        """Whether the preset runs `v`: the preset's variants (all but the diagnostic ones, or
        with `diagnostics` all), or, when `variants` names some, those of them in the preset."""
        sc = self.scale(quick)
        if sc is None or (sc.variants is not None and v.name not in sc.variants):
            return False
        if variants is not None:
            return v.name in variants
        return diagnostics or not v.diagnostic

    def spec(self, variant: Variant, point, rep: int, quick: bool) -> dict:
        """The spec dict of one run: the builder's base spec with the variant applied."""
        sc = self.scale(quick)
        params = sc.params if sc else {}
        d = self.build(self, variant, point, rep, params)
        return apply_variant(d, variant, self.measure)

    def estimate(self, quick: bool, reps: int | None = None, points: list[str] | None = None,
                 variants: set[str] | None = None, diagnostics: bool = False) -> tuple[int, float]:
        """(runs, seconds) of this experiment in a preset (optionally only some points and
        variants)."""
        sc = self.scale(quick)
        if sc is None:
            return 0, 0.0
        n_var = len([v for v in self.variants
                     if self.runs_variant(v, quick, variants, diagnostics) and not v.unsupported])
        total = 0.0
        runs = 0
        for p in sc.points:
            if points is not None and ("-" if p is None else str(p)) not in points:
                continue
            per = self.run_seconds(sc.params, p) if self.run_seconds else 60.0
            r = reps or sc.reps
            runs += r * n_var
            total += r * n_var * (per + RUN_OVERHEAD_S)
        return runs, total


def apply_variant(d: dict, v: Variant, measure: str = "m") -> dict:
    d = copy.deepcopy(d)
    for k, val in v.spec.items():
        d[k] = copy.deepcopy(val)
    med = d.setdefault("medium", {})
    for k, val in v.medium.items():
        med[k] = copy.deepcopy(val)
    for f in d.get("flow", []):
        if f.get("driver") is None:  # flows the builder left to the compared protocol
            for k, val in v.flow.items():
                if k == "options":
                    f.setdefault("options", {}).update(copy.deepcopy(val))
                else:
                    f[k] = copy.deepcopy(val)
    for w in d.get("workload", []):
        if w.get("driver") is None:
            w["driver"] = v.driver
            if "cc" in v.flow:
                w["cc"] = v.flow["cc"]
    if "broadcast_rate_mbps" not in med and any(
            f.get("options", {}).get("link_mode") == "broadcast" for f in d.get("flow", [])):
        # Broadcast data frames at the data rate, not the 802.11 default of the lowest basic rate.
        med["broadcast_rate_mbps"] = med.get("rate_mbps", default_rate(med.get("standard", DEFAULT_STANDARD)))
    d["name"] = f"{d.get('name', 'run')}-{v.name}"
    return d


# ---- variants shared by the experiments ------------------------------------------------------

# Hop §4: "Link-layer ARQ is disabled for all data frames sent via Hop but enabled for control
# packets (BSYN, BACK, etc)". The emulated MAC, like a stock driver, has one retry limit for
# every unicast frame, so Hop's data datagrams go as link-layer broadcasts (hopd's broadcast
# link mode: never retried, overheard by every neighbour) at the data rate, while BSYN/BACK stay
# unicast with the medium's retries. "unicast" gives Hop's data the same ARQ as TCP's.
HOP_LINK_MODE = "broadcast"


def hop(name: str = "hop", title: str = "Hop (hopd)", link_mode: str = HOP_LINK_MODE,
        control_dscp: int | None = None, **hopcfg) -> Variant:
    flow: dict = {"driver": "hop", "options": {"link_mode": link_mode}}
    if control_dscp is not None:
        flow["options"]["control_dscp"] = control_dscp
    if hopcfg:
        flow["options"]["hop"] = hopcfg
    return Variant(name, title, flow)


# Hop §4.1 as written: data frames unicast to the next hop with link ARQ off, BSYN/BACK with
# it on. The medium gives the data's access category (background, DSCP CS1) a single attempt
# per frame and keeps the retry limit for the others (medium `no_arq_acs`). Unlike the
# broadcast link mode, each data frame is acknowledged by the next hop, so a lost frame ends a
# txop burst, and neighbours do not overhear the data.
def hop_unicast_noarq(name: str = "hop-unicast",
                      title: str = "Hop, data unicast with link ARQ off (Hop §4.1)", **hopcfg) -> Variant:
    v = hop(name, title, link_mode="unicast", **hopcfg)
    v.medium["no_arq_acs"] = ["bk"]
    return diagnostic(v)


def diagnostic(v: Variant) -> Variant:
    """`v` marked as run beside the papers' protocols to explain a figure (see Variant)."""
    v.diagnostic = True
    return v


def hopd_transport(name: str, title: str, transport: str) -> Variant:
    return Variant(name, title, {"driver": "hop", "options": {"transport": transport}})


def tcp(name: str = "tcp", title: str = "TCP CUBIC (max-ARQ, txop)", cc: str = "cubic", **medium) -> Variant:
    m = copy.deepcopy(BEST_MEDIUM)
    m.update(medium)
    return Variant(name, title, {"driver": "tcp", "cc": cc}, m)


HBHTCP = Variant("hbhtcp", "hop-by-hop TCP", {"driver": "hbhtcp", "cc": "cubic"})
DTN = Variant("dtn", "DTN (dtn7 0.21, bundles over TCPCLv4)", {"driver": "dtn"})
# Disruption experiments: dtnd retries a bundle whose forwarding failed (next hop down) only
# through its janitor, off by default (hoplab.drivers.dtn.JANITOR). DTN2, the paper's DTN, retries a
# failed link after 5 s, doubling (its min_retry_interval); a fixed 10 s janitor is the
# closest dtnd setting over §5.7's 60 s phases. Without it dtnd delivered nothing in §5.7.
DTN_RETRY = Variant("dtn", "DTN (dtn7 0.21, bundles over TCPCLv4, retry every 10 s)",
                    {"driver": "dtn", "options": {"janitor": "10s"}})


def dtn_hop(name: str = "dtn-hop", title: str = "DTN (dtn7 0.21) over Hop (hop-dtn bridge, hopd)",
            janitor: str | None = None, **hopcfg) -> Variant:
    """dtn7's dtnd at the flow's ends, Hop between them (hoplab.drivers.dtnhop): hopd set up
    as the `hop` variant runs it (`hopcfg` as `hop`'s, e.g. backpressure_limit), dtnd's
    janitor as the `dtn` driver's unless given."""
    v = hop(name, title, **hopcfg)
    v.flow["driver"] = "dtn-hop"
    if janitor is not None:
        v.flow["options"]["janitor"] = janitor
    return v


UDP_NOARQ = Variant("udp-noarq", "UDP, no ARQ, txop (achievable rate)", {"driver": "udp"},
                    {"retry_limit": 0, "txop_us": {"be": TXOP_US, "bk": TXOP_US}})
UDP_ARQ = Variant("udp-arq", "UDP, max-ARQ, txop", {"driver": "udp"})
