"""Experiment specification (TOML) -> validated dataclasses.

See docs/lab.md for the format. Every default that comes from the Hop paper is
a named constant citing its section.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from . import topology as topo
from .drivers import DRIVERS
from .errors import SpecError
from .schema import check_keys, parse_rate, parse_size, take
from .workloads import expand

# Hop §5: fixed 802.11b bit rate of 11 Mbit/s unless auto-rate is studied (§5.9).
DEFAULT_STANDARD = "b"
DEFAULT_RATE_MBPS = 11.0
# 802.11g runs use 24 Mbit/s fixed (Hop §5.10).
DEFAULT_RATE_G_MBPS = 24.0


def default_rate(standard: str) -> float:
    """The data rate of a medium that names none."""
    return DEFAULT_RATE_MBPS if standard == "b" else DEFAULT_RATE_G_MBPS


# Hop §5.1.1 compares MadWifi's default of 11 link-layer retries; ns-3's own default is 7.
DEFAULT_RETRY_LIMIT = 7
# Hop §4: txop of the background queue set to 8160 us when burst mode is used.
HOP_TXOP_BK_US = 8160
DEFAULT_LAG_BOUND_MS = 50.0

B_RATES = {1.0: "DsssRate1Mbps", 2.0: "DsssRate2Mbps", 5.5: "DsssRate5_5Mbps", 11.0: "DsssRate11Mbps"}
G_RATES = {r: f"ErpOfdmRate{int(r)}Mbps" for r in (6.0, 9.0, 12.0, 18.0, 24.0, 36.0, 48.0, 54.0)}
ACS = ("be", "bk", "vi", "vo")
ACTIONS = ("down", "up", "loss")
# 802.11e user priorities (TIDs) of each access category.
# ns-3's RtsCtsThreshold that no frame exceeds: RTS/CTS off.
RTS_OFF = 65535
AC_TIDS = {"be": (0, 3), "bk": (1, 2), "vi": (4, 5), "vo": (6, 7)}


@dataclass
class Medium:
    standard: str = DEFAULT_STANDARD
    rate_mbps: float = DEFAULT_RATE_MBPS
    auto_rate: bool = False
    retry_limit: int = DEFAULT_RETRY_LIMIT  # retransmissions after the first attempt
    rts_cts: bool = False
    # RTS/CTS before the unicast frames whose MAC payload exceeds this many bytes, the others
    # without (a driver's RTS threshold, `iw phy ... set rts N`); rts_cts is the threshold 0.
    rts_threshold: int | None = None
    txop_us: dict[str, float] = field(default_factory=dict)
    broadcast_rate_mbps: float | None = None  # None: lowest basic rate (802.11 default)
    classify_dscp: bool = True
    # Unicast frames for another node also reach its tap, as a radio's receiver hears them
    # (hopd's `overhear` reads them from a packet socket); off, the medium drops them.
    overhear: bool = False
    # Access categories whose unicast frames get no link retries (the others keep
    # retry_limit): Hop §4.1 turns link ARQ off for its data frames only.
    no_arq_acs: list[str] = field(default_factory=list)
    # The medium reports each node's MAC backlog to the node's hopd (medium_cpp.h, "link
    # status"), which sends only while that backlog is short, as a real interface's socket
    # would hold it back (docs/lab.md). Only runs with hopd flows get reports: kernel TCP and
    # the other peers have no use for them. False: the tap takes every frame at once.
    link_status: bool = True

    def rts_threshold_bytes(self) -> int:
        """ns-3's RtsCtsThreshold: 0 with rts_cts, the threshold if set, else no RTS/CTS."""
        if self.rts_cts:
            return 0
        return RTS_OFF if self.rts_threshold is None else self.rts_threshold

    def no_retry_tids(self) -> int:
        """The TIDs of `no_arq_acs` as a bit mask (bit i = TID i)."""
        mask = 0
        for ac in self.no_arq_acs:
            for tid in AC_TIDS[ac]:
                mask |= 1 << tid
        return mask

    def modes(self) -> tuple[str, str, str | None]:
        table = B_RATES if self.standard == "b" else G_RATES
        if self.rate_mbps not in table:
            raise SpecError(f"rate {self.rate_mbps} not an 802.11{self.standard} rate: {sorted(table)}")
        control = "DsssRate1Mbps" if self.standard == "b" else "ErpOfdmRate6Mbps"
        bc = None
        if self.broadcast_rate_mbps is not None:
            if self.broadcast_rate_mbps not in table:
                raise SpecError(f"broadcast rate {self.broadcast_rate_mbps} not an 802.11{self.standard} rate")
            bc = table[self.broadcast_rate_mbps]
        return table[self.rate_mbps], control, bc


@dataclass
class Flow:
    driver: str
    src: int
    dst: int
    start: float = 0.0
    size: int | None = None  # bytes; None = long-lived for `duration`
    duration: float | None = None
    rate_bps: float | None = None  # UDP offered rate; None = over-offer
    cc: str = "cubic"
    label: str = ""
    options: dict = field(default_factory=dict)
    after: str | None = None  # start `start` seconds after the flow with this label finished
    # Load for the others: the run does not wait for it to finish, it ends once every other
    # flow has (or at `duration`), cutting it off.
    background: bool = False


@dataclass
class Event:
    at: float
    action: str
    node: int | None = None
    a: int | None = None
    b: int | None = None
    loss: float | None = None


# Static routes the lab computes once ("etx", "hops"), or a routing daemon in every node
# ("babel": babeld, whose routes follow the medium while the run goes on).
ROUTING = ("etx", "hops", "babel")
DYNAMIC_ROUTING = ("babel",)


@dataclass
class Spec:
    name: str
    topology: topo.Topology
    medium: Medium
    flows: list[Flow]
    schedule: list[Event]
    routing: str = "etx"
    duration: float = 30.0
    seed: int = 1
    lag_bound_ms: float = DEFAULT_LAG_BOUND_MS
    settle: float = 1.0
    source: dict = field(default_factory=dict)

    def reports_link_status(self) -> bool:
        """Whether the medium reports MAC backlogs in this run: medium.link_status, and hopd
        runs (a flow of a driver that starts it: `hop`, `dtn-hop`)."""
        return self.medium.link_status and any(DRIVERS[f.driver].runs_hopd for f in self.flows)


def build_topology(d: dict, base: Path, seed: int) -> topo.Topology:
    check_keys(d, {"kind", "nodes", "rows", "cols", "loss", "senders", "hidden_pairs", "links",
                    "seed", "file", "link", "sense_range", "sense"}, "topology")
    kind = take(d, "kind", str, "chain", "topology")
    loss = take(d, "loss", float, 0.0, "topology")
    if kind == "chain":
        t = topo.chain(take(d, "nodes", int, 2, "topology"), loss)
    elif kind == "grid":
        t = topo.grid(take(d, "rows", int, 3, "topology"), take(d, "cols", int, 3, "topology"), loss)
    elif kind == "star":
        t = topo.star(take(d, "senders", int, topo.AP_SENDERS, "topology"),
                      take(d, "hidden_pairs", int, topo.AP_HIDDEN_PAIRS, "topology"), loss)
    elif kind == "mesh":
        t = topo.mesh(take(d, "nodes", int, topo.MESH_NODES, "topology"),
                      take(d, "links", int, topo.MESH_LINKS, "topology"),
                      take(d, "seed", int, seed, "topology"))
    elif kind == "file":
        f = take(d, "file", str, None, "topology")
        if not f:
            raise SpecError("topology.kind = 'file' needs topology.file")
        p = Path(f) if Path(f).is_absolute() else base / f
        if not p.exists():
            raise SpecError(f"topology file {p} not found")
        t = topo.from_file(p)
    else:
        raise SpecError(f"unknown topology kind {kind!r} (chain, grid, star, mesh, file)")
    for i, link in enumerate(d.get("link", [])):
        where = f"topology.link[{i}]"
        check_keys(link, {"a", "b", "loss", "loss_back"}, where)
        a, b = take(link, "a", int, None, where), take(link, "b", int, None, where)
        if a is None or b is None:
            raise SpecError(f"{where}: needs a and b")
        la = take(link, "loss", float, 0.0, where)
        lb = take(link, "loss_back", float, la, where)
        t.add(a, b, la, lb)
    sense_range = take(d, "sense_range", float, None, "topology")
    if sense_range is not None:
        topo.with_sense_range(t, sense_range)
    for i, pair in enumerate(d.get("sense", [])):
        # explicit sense pairs: out of range, yet each senses the other's carrier
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, int) for x in pair)):
            raise SpecError(f"topology.sense[{i}] must be a pair of node numbers, got {pair!r}")
        a, b = sorted(pair)
        if not (0 <= a < b < t.n):
            raise SpecError(f"topology.sense[{i}]: nodes must be two different nodes in 0..{t.n - 1}")
        if t.in_range(a, b):
            raise SpecError(f"topology.sense[{i}]: {a} and {b} have a link already")
        t.sense.add((a, b))
    return t


def from_dict(d: dict, base: Path = Path(".")) -> Spec:
    check_keys(d, {"name", "duration", "seed", "lag_bound_ms", "routing", "settle", "medium",
                    "topology", "flow", "workload", "schedule"}, "spec")
    seed = take(d, "seed", int, 1, "spec")
    t = build_topology(d.get("topology", {}), base, seed)

    md = d.get("medium", {})
    check_keys(md, {"standard", "rate_mbps", "auto_rate", "retry_limit", "rts_cts", "rts_threshold", "txop_us",
                     "broadcast_rate_mbps", "classify_dscp", "no_arq_acs", "overhear",
                     "link_status"}, "medium")
    std = take(md, "standard", str, DEFAULT_STANDARD, "medium")
    if std not in ("b", "g"):
        raise SpecError("medium.standard must be 'b' or 'g'")
    rate_default = default_rate(std)
    txop = md.get("txop_us", {})
    if not isinstance(txop, dict) or any(k not in ACS for k in txop):
        raise SpecError(f"medium.txop_us must be a table with keys from {ACS}")
    no_arq = md.get("no_arq_acs", [])
    if not isinstance(no_arq, list) or any(k not in ACS for k in no_arq):
        raise SpecError(f"medium.no_arq_acs must be a list of access categories from {ACS}")
    m = Medium(
        standard=std,
        rate_mbps=take(md, "rate_mbps", float, rate_default, "medium"),
        auto_rate=take(md, "auto_rate", bool, False, "medium"),
        retry_limit=take(md, "retry_limit", int, DEFAULT_RETRY_LIMIT, "medium"),
        rts_cts=take(md, "rts_cts", bool, False, "medium"),
        rts_threshold=take(md, "rts_threshold", int, None, "medium"),
        txop_us={k: float(v) for k, v in txop.items()},
        broadcast_rate_mbps=take(md, "broadcast_rate_mbps", float, None, "medium"),
        classify_dscp=take(md, "classify_dscp", bool, True, "medium"),
        overhear=take(md, "overhear", bool, False, "medium"),
        link_status=take(md, "link_status", bool, True, "medium"),
        no_arq_acs=sorted(set(no_arq)),
    )
    if m.no_arq_acs and m.auto_rate:
        raise SpecError("medium.no_arq_acs needs a fixed rate: auto_rate learns from the link retries")
    if m.no_arq_acs and not m.classify_dscp:
        raise SpecError("medium.no_arq_acs needs classify_dscp: without it every frame is best effort")
    if m.rts_threshold is not None:
        if m.rts_cts:
            raise SpecError("medium: set rts_cts (RTS/CTS before every unicast frame) or rts_threshold, not both")
        if not 0 <= m.rts_threshold < RTS_OFF:
            raise SpecError(f"medium.rts_threshold must be in 0..{RTS_OFF - 1} bytes")
    if not 0 <= m.retry_limit <= 100:
        raise SpecError("medium.retry_limit must be in 0..100")
    m.modes()

    flows = []
    for i, f in enumerate(d.get("flow", [])):
        flows.append(parse_flow(f, f"flow[{i}]", t.n))
    for i, w in enumerate(d.get("workload", [])):
        where = f"workload[{i}]"
        flows.extend(parse_flow(f, where, t.n) for f in expand(w, where, t, seed + i))

    events = []
    for i, e in enumerate(d.get("schedule", [])):
        where = f"schedule[{i}]"
        check_keys(e, {"at", "action", "node", "a", "b", "loss"}, where)
        ev = Event(at=take(e, "at", float, 0.0, where), action=take(e, "action", str, "", where),
                   node=take(e, "node", int, None, where), a=take(e, "a", int, None, where),
                   b=take(e, "b", int, None, where), loss=take(e, "loss", float, None, where))
        if ev.action not in ACTIONS:
            raise SpecError(f"{where}.action must be one of {ACTIONS}")
        if ev.action in ("down", "up") and (ev.node is None or not 0 <= ev.node < t.n):
            raise SpecError(f"{where}: node missing or out of range")
        if ev.action == "loss":
            if ev.a is None or ev.b is None or ev.loss is None or not 0.0 <= ev.loss <= 1.0:
                raise SpecError(f"{where}: loss needs a, b and loss in [0, 1]")
            if not t.in_range(ev.a, ev.b):
                raise SpecError(f"{where}: {ev.a}->{ev.b} is not a link of the topology")
        if ev.at < 0:
            raise SpecError(f"{where}.at must be >= 0")
        events.append(ev)
    events.sort(key=lambda e: e.at)

    routing = take(d, "routing", str, "etx", "spec")
    if routing not in ROUTING:
        raise SpecError(f"routing must be one of {', '.join(ROUTING)}: static shortest paths by ETX or "
                        "hop count, computed by the lab, or 'babel' (babeld in every node, routes that change "
                        "with the medium)")
    spec = Spec(
        name=take(d, "name", str, "experiment", "spec"),
        topology=t,
        medium=m,
        flows=flows,
        schedule=events,
        routing=routing,
        duration=take(d, "duration", float, 30.0, "spec"),
        seed=seed,
        lag_bound_ms=take(d, "lag_bound_ms", float, DEFAULT_LAG_BOUND_MS, "spec"),
        settle=take(d, "settle", float, 1.0, "spec"),
        source=d,
    )
    if spec.duration <= 0:
        raise SpecError("duration must be > 0")
    if not flows:
        raise SpecError("no flows: add [[flow]] or [[workload]] entries")
    labels = [f.label for f in flows if f.label]
    if len(labels) != len(set(labels)):
        raise SpecError("flow labels must be unique")
    for f in flows:
        if f.after is not None and (f.after not in labels or f.after == f.label):
            raise SpecError(f"flow {f.label or f.driver}: after = {f.after!r} names no other flow")
    if all(f.background for f in flows):
        raise SpecError("every flow is background: at least one flow must be one the run waits for")
    return spec


def parse_flow(f: dict, where: str, n: int) -> Flow:
    check_keys(f, {"driver", "src", "dst", "start", "size", "duration", "rate", "cc", "label",
                    "options", "after", "background"}, where)
    driver = take(f, "driver", str, "tcp", where)
    if driver not in DRIVERS:
        raise SpecError(f"{where}.driver {driver!r} unknown; known: {sorted(DRIVERS)}")
    src, dst = take(f, "src", int, None, where), take(f, "dst", int, None, where)
    if src is None or dst is None or not (0 <= src < n and 0 <= dst < n) or src == dst:
        raise SpecError(f"{where}: src/dst must be distinct nodes in 0..{n - 1}")
    flow = Flow(
        driver=driver, src=src, dst=dst, start=take(f, "start", float, 0.0, where),
        size=parse_size(f["size"]) if "size" in f else None,
        duration=take(f, "duration", float, None, where),
        rate_bps=parse_rate(f["rate"]) if "rate" in f else None,
        cc=take(f, "cc", str, "cubic", where), label=take(f, "label", str, "", where),
        options=f.get("options", {}),
        after=take(f, "after", str, None, where),
        background=take(f, "background", bool, False, where),
    )
    if flow.cc not in ("cubic", "bbr", "reno"):
        raise SpecError(f"{where}.cc must be cubic, bbr or reno")
    if not isinstance(flow.options, dict):
        raise SpecError(f"{where}.options must be a table")
    if "mss" in flow.options:
        mss = flow.options["mss"]
        if flow.driver != "tcp":
            raise SpecError(f"{where}.options.mss applies to tcp flows only")
        # Linux accepts TCP_MAXSEG from 88 bytes; above the lab's 1500-byte MTU it changes nothing
        if not isinstance(mss, int) or isinstance(mss, bool) or not 88 <= mss <= 1460:
            raise SpecError(f"{where}.options.mss must be a segment size in bytes, 88-1460")
    if flow.start < 0:
        raise SpecError(f"{where}.start must be >= 0")
    return flow


def load(path: Path) -> Spec:
    try:
        d = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SpecError(f"{path}: {e}") from e
    return from_dict(d, path.parent)
