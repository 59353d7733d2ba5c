//! Scenario files (TOML): topology, medium, routing, flows, events and transport overrides.
//!
//! Every table rejects unknown keys so that a typo in a scenario is an error, not a silently
//! ignored setting. `docs/scenarios.md` documents every key.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::error::ScenarioError;

/// 802.11b PLCP long preamble + header at 1 Mb/s (IEEE 802.11-2007 §18.2.2): 192 µs.
pub const DEFAULT_PREAMBLE_US: f64 = 192.0;
/// 802.11b DIFS = SIFS + 2 slots: 50 µs.
pub const DEFAULT_DIFS_US: f64 = 50.0;
/// 802.11b SIFS: 10 µs.
pub const DEFAULT_SIFS_US: f64 = 10.0;
/// 802.11b slot time: 20 µs.
pub const DEFAULT_SLOT_US: f64 = 20.0;
/// 802.11b CWmin (DSSS PHY): 31 slots.
pub const DEFAULT_CW_MIN: u32 = 31;
/// 802.11b CWmax: 1023 slots.
pub const DEFAULT_CW_MAX: u32 = 1023;
/// Control datagrams go through the voice queue (Hop paper §3.6); 802.11e AC_VO CWmin for
/// a DSSS PHY is (CWmin+1)/4-1 = 7.
pub const DEFAULT_CONTROL_CW_MIN: u32 = 7;
/// 802.11e AC_VO CWmax for a DSSS PHY is (CWmin+1)/2-1 = 15: a retried control frame's
/// window stops doubling there (ns-3's EDCA default for the voice queue, as in the lab).
pub const DEFAULT_CONTROL_CW_MAX: u32 = 15;
/// Link-layer retry limit for control datagrams (802.11 default short retry limit 7).
pub const DEFAULT_RETRY_LIMIT: u32 = 7;
/// The paper's testbed locks 802.11b at 11 Mb/s (Hop paper §5).
pub const DEFAULT_RATE_MBPS: f64 = 11.0;
/// 802.11b ACKs go at a basic rate; 2 Mb/s.
pub const DEFAULT_ACK_RATE_MBPS: f64 = 2.0;
/// Background-queue txop used by Hop: 8160 µs (Hop paper §4.1).
pub const DEFAULT_TXOP_US: f64 = 8160.0;
/// MAC header + FCS (28 B) plus IP (20 B) and UDP (8 B) headers, which Hop runs over (§4).
pub const DEFAULT_HEADER_BYTES: u32 = 56;
/// Interface queue length in frames.
pub const DEFAULT_QUEUE_FRAMES: usize = 10;
/// Per-access-category MAC queue of the push model: ns-3's `WifiMacQueue` attribute `MaxSize`
/// defaults to 500 packets (ns-3.44 `src/wifi/model/wifi-mac-queue.cc`), drop-tail.
pub const DEFAULT_MAC_QUEUE_FRAMES: usize = 500;
/// ns-3's `WifiMacQueue` attribute `MaxDelay` defaults to 500 ms: a frame that waited longer is
/// dropped when it reaches the head of the queue.
pub const DEFAULT_MAC_QUEUE_MAX_DELAY_MS: f64 = 500.0;
/// Default virtual-time limit of a run, seconds.
pub const DEFAULT_DURATION_S: f64 = 600.0;
/// Radio model: links shorter than this fraction of `range_m` lose nothing beyond
/// `topology.loss`; from there the loss rises linearly to `loss_at_range` at the range.
pub const DEFAULT_LOSS_FREE_FRACTION: f64 = 0.5;
/// Radio model: the loss of a link exactly `range_m` long.
pub const DEFAULT_LOSS_AT_RANGE: f64 = 0.5;
/// Random placements drawn before giving up on a connected one.
pub const DEFAULT_PLACEMENT_TRIES: u32 = 1000;
/// Node positions make the link set quadratic in the node count: a bound that keeps building
/// it (and redrawing it) well under a second.
pub const MAX_PLACED_NODES: u32 = 5000;

fn default_rate() -> f64 {
    DEFAULT_RATE_MBPS
}

/// A whole scenario.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Free-form name reported in the result.
    #[serde(default)]
    pub name: String,
    /// Seed of every random draw (medium losses, backoff, node randomness, byte patterns).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Virtual-time limit in seconds (alias `stop_at`).
    #[serde(default, alias = "stop_at")]
    pub duration: Option<f64>,
    /// Keep running until `duration` even when every flow is done.
    #[serde(default)]
    pub run_to_end: bool,
    #[serde(default)]
    pub medium: MediumSpec,
    pub topology: TopologySpec,
    #[serde(default)]
    pub routing: RoutingSpec,
    #[serde(default)]
    pub flows: Vec<FlowSpec>,
    /// Flows drawn at random (seeded), expanded into `flows` when the simulation is built.
    #[serde(default)]
    pub flow_sets: Vec<FlowSetSpec>,
    #[serde(default)]
    pub events: Vec<EventSpec>,
    /// Per-transport configuration overrides, keyed by transport name.
    #[serde(default)]
    pub transports: BTreeMap<String, toml::Table>,
}

fn default_seed() -> u64 {
    1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum MediumKind {
    /// 802.11-like shared medium: carrier sense, backoff, collisions, overhearing.
    #[default]
    Shared,
    /// Independent point-to-point links: no contention, no collisions, no overhearing.
    P2p,
}

/// How the runtime hands datagrams to a node's link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum QueueMode {
    /// The runtime calls `poll_transmit` only while the interface queue has room (the
    /// contract of `hop_proto::Node`): transports are paced by being polled.
    #[default]
    Pull,
    /// The runtime takes every datagram the node yields at once and pushes it into a
    /// per-class drop-tail MAC queue it cannot see, as a user-space daemon writing into a tap
    /// does (hopd over ns-3): control and data each have `mac_queue_frames` slots.
    Push,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MediumSpec {
    #[serde(default)]
    pub kind: MediumKind,
    #[serde(default = "d_preamble")]
    pub preamble_us: f64,
    #[serde(default = "d_difs")]
    pub difs_us: f64,
    #[serde(default = "d_sifs")]
    pub sifs_us: f64,
    #[serde(default = "d_slot")]
    pub slot_us: f64,
    #[serde(default = "d_cw_min")]
    pub cw_min: u32,
    #[serde(default = "d_cw_max")]
    pub cw_max: u32,
    #[serde(default = "d_ctl_cw")]
    pub control_cw_min: u32,
    #[serde(default = "d_ctl_cw_max")]
    pub control_cw_max: u32,
    #[serde(default = "d_retry")]
    pub retry_limit: u32,
    #[serde(default = "d_ack_rate")]
    pub ack_rate_mbps: f64,
    /// Data frames sent back to back after one contention, up to this airtime (0 = off).
    #[serde(default = "d_txop")]
    pub txop_us: f64,
    /// Per-frame overhead bytes added to the datagram (MAC header, FCS, IP, UDP).
    #[serde(default = "d_hdr")]
    pub header_bytes: u32,
    /// Bounded interface queue, frames per node.
    #[serde(default = "d_queue")]
    pub queue_frames: usize,
    /// Pull (the node API's contract) or push (a runtime that cannot see its link queue).
    #[serde(default)]
    pub queue_mode: QueueMode,
    /// Push model: frames per class queue (drop-tail).
    #[serde(default = "d_mac_queue")]
    pub mac_queue_frames: usize,
    /// Push model: frames older than this are dropped at the head of the queue (0 = never).
    #[serde(default = "d_mac_queue_delay")]
    pub mac_queue_max_delay_ms: f64,
    /// Unicast `Class::Data` frames get an 802.11 ACK and up to `retry_limit` retries, like
    /// control frames (as any unicast frame in ns-3 or a stock driver); off: no ARQ for data
    /// (Hop §4.1).
    #[serde(default)]
    pub data_arq: bool,
    /// Send Class::Data datagrams as link-layer broadcast (all neighbours hear either way).
    #[serde(default)]
    pub data_broadcast: bool,
    /// 802.11 ACK frames are not subject to the link loss rate (collisions still corrupt
    /// them), as with ns-3's per-link error model in the lab (docs/lab.md), where a lossy
    /// link loses data frames, not their acknowledgements. Off: an ACK crosses the reverse
    /// link and is lost at its rate, like any frame.
    #[serde(default)]
    pub lossless_acks: bool,
    /// Control frames go before any queued data frame (their own, higher-priority 802.11e
    /// access category: hopd's default DSCP EF, AC_VO). Off: control and data share one
    /// queue in the order the transport handed them over (both in the data's access
    /// category, e.g. hopd `control_dscp = 8`).
    #[serde(default = "d_true")]
    pub control_priority: bool,
    /// Pull model: while the interface queue is full, the runtime still takes the control
    /// datagrams the node has queued (`Node::poll_control`), as hopd does with
    /// `link_control_when_full`, so an ack does not wait for a data frame to leave. Off (the
    /// default, as in hopd): control waits for room like data.
    #[serde(default)]
    pub control_when_full: bool,
}

fn d_true() -> bool {
    true
}

fn d_preamble() -> f64 {
    DEFAULT_PREAMBLE_US
}
fn d_difs() -> f64 {
    DEFAULT_DIFS_US
}
fn d_sifs() -> f64 {
    DEFAULT_SIFS_US
}
fn d_slot() -> f64 {
    DEFAULT_SLOT_US
}
fn d_cw_min() -> u32 {
    DEFAULT_CW_MIN
}
fn d_cw_max() -> u32 {
    DEFAULT_CW_MAX
}
fn d_ctl_cw() -> u32 {
    DEFAULT_CONTROL_CW_MIN
}
fn d_ctl_cw_max() -> u32 {
    DEFAULT_CONTROL_CW_MAX
}
fn d_retry() -> u32 {
    DEFAULT_RETRY_LIMIT
}
fn d_ack_rate() -> f64 {
    DEFAULT_ACK_RATE_MBPS
}
fn d_txop() -> f64 {
    DEFAULT_TXOP_US
}
fn d_hdr() -> u32 {
    DEFAULT_HEADER_BYTES
}
fn d_queue() -> usize {
    DEFAULT_QUEUE_FRAMES
}
fn d_mac_queue() -> usize {
    DEFAULT_MAC_QUEUE_FRAMES
}
fn d_mac_queue_delay() -> f64 {
    DEFAULT_MAC_QUEUE_MAX_DELAY_MS
}

impl Default for MediumSpec {
    fn default() -> Self {
        MediumSpec {
            kind: MediumKind::Shared,
            preamble_us: DEFAULT_PREAMBLE_US,
            difs_us: DEFAULT_DIFS_US,
            sifs_us: DEFAULT_SIFS_US,
            slot_us: DEFAULT_SLOT_US,
            cw_min: DEFAULT_CW_MIN,
            cw_max: DEFAULT_CW_MAX,
            control_cw_min: DEFAULT_CONTROL_CW_MIN,
            control_cw_max: DEFAULT_CONTROL_CW_MAX,
            retry_limit: DEFAULT_RETRY_LIMIT,
            ack_rate_mbps: DEFAULT_ACK_RATE_MBPS,
            txop_us: DEFAULT_TXOP_US,
            header_bytes: DEFAULT_HEADER_BYTES,
            queue_frames: DEFAULT_QUEUE_FRAMES,
            queue_mode: QueueMode::Pull,
            mac_queue_frames: DEFAULT_MAC_QUEUE_FRAMES,
            mac_queue_max_delay_ms: DEFAULT_MAC_QUEUE_MAX_DELAY_MS,
            data_arq: false,
            data_broadcast: false,
            lossless_acks: false,
            control_priority: true,
            control_when_full: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Generator {
    /// No generated links: only `[[topology.links]]`.
    None,
    /// 0 - 1 - 2 - ... - (nodes-1).
    Chain,
    /// `rows` x `cols` grid, 4-neighbourhood, node id = row * cols + col.
    Grid,
    /// Node 0 is the hub, every other node a leaf.
    Star,
    /// `nodes` placed uniformly at random in `width_m` x `height_m` (redrawn until the
    /// radio links connect them); links from the radio model.
    Random,
}

/// `topology.nodes`: a count, or one `[[topology.nodes]]` table (`id`, `x`, `y`) per node.
#[derive(Debug, Clone)]
pub enum NodesSpec {
    Count(u32),
    Placed(Vec<NodePos>),
}

/// A node's position in metres.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodePos {
    pub id: u32,
    pub x: f64,
    pub y: f64,
}

impl<'de> Deserialize<'de> for NodesSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match toml::Value::deserialize(d)? {
            toml::Value::Integer(i) => u32::try_from(i)
                .map(NodesSpec::Count)
                .map_err(|_| D::Error::custom(format!("nodes = {i}: not a node count"))),
            v @ toml::Value::Array(_) => v
                .try_into::<Vec<NodePos>>()
                .map(NodesSpec::Placed)
                .map_err(|e| D::Error::custom(format!("[[topology.nodes]]: {e}"))),
            other => Err(D::Error::custom(format!(
                "nodes must be a node count or [[topology.nodes]] tables with id, x, y; not {other}"
            ))),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    /// Number of nodes (ids are 0..nodes; for a grid, defaults to rows * cols), or their
    /// positions.
    #[serde(default)]
    pub nodes: Option<NodesSpec>,
    #[serde(default = "d_gen")]
    pub generator: Generator,
    #[serde(default)]
    pub rows: Option<u32>,
    #[serde(default)]
    pub cols: Option<u32>,
    /// Defaults for generated links (and for explicit links that omit them).
    #[serde(default)]
    pub loss: f64,
    #[serde(default = "default_rate")]
    pub rate_mbps: f64,
    #[serde(default = "d_delay")]
    pub delay_us: f64,
    #[serde(default)]
    pub links: Vec<LinkSpec>,
    /// Random placement: the area, metres.
    #[serde(default)]
    pub width_m: Option<f64>,
    #[serde(default)]
    pub height_m: Option<f64>,
    /// Radio model: nodes at most this far apart share a link (they decode each other).
    #[serde(default)]
    pub range_m: Option<f64>,
    /// Radio model: nodes farther apart than `range_m` but at most this far sense each
    /// other's transmissions (defer, and collide at a receiver) without decoding them.
    /// Default: `range_m` (carrier sense range = decode range).
    #[serde(default)]
    pub carrier_sense_range_m: Option<f64>,
    #[serde(default = "d_loss_free")]
    pub loss_free_fraction: f64,
    #[serde(default = "d_loss_at_range")]
    pub loss_at_range: f64,
    /// Seed of the random placement; default: the run's seed.
    #[serde(default)]
    pub layout_seed: Option<u64>,
    #[serde(default = "d_tries")]
    pub placement_tries: u32,
}

fn d_loss_free() -> f64 {
    DEFAULT_LOSS_FREE_FRACTION
}
fn d_loss_at_range() -> f64 {
    DEFAULT_LOSS_AT_RANGE
}
fn d_tries() -> u32 {
    DEFAULT_PLACEMENT_TRIES
}

impl TopologySpec {
    /// Whether links come from node positions and the radio model.
    pub fn has_radio(&self) -> bool {
        self.generator == Generator::Random || matches!(self.nodes, Some(NodesSpec::Placed(_)))
    }

    /// The loss of a link `d` metres long under the radio model: `loss` up to
    /// `loss_free_fraction * range_m`, then rising linearly to `loss_at_range` at the range.
    pub fn loss_at(&self, d: f64) -> f64 {
        let range = self.range_m.unwrap_or(0.0);
        let free = self.loss_free_fraction * range;
        if d <= free || range <= free {
            return self.loss;
        }
        let f = ((d - free) / (range - free)).clamp(0.0, 1.0);
        self.loss + (self.loss_at_range - self.loss).max(0.0) * f
    }
}

fn d_gen() -> Generator {
    Generator::None
}
/// A few hundred metres of radio propagation: 1 µs.
fn d_delay() -> f64 {
    1.0
}

/// An undirected link; per-direction values override the symmetric ones.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    pub a: u32,
    pub b: u32,
    #[serde(default)]
    pub loss: Option<f64>,
    #[serde(default)]
    pub loss_ab: Option<f64>,
    #[serde(default)]
    pub loss_ba: Option<f64>,
    #[serde(default)]
    pub rate_mbps: Option<f64>,
    #[serde(default)]
    pub rate_ab_mbps: Option<f64>,
    #[serde(default)]
    pub rate_ba_mbps: Option<f64>,
    #[serde(default)]
    pub delay_us: Option<f64>,
    /// The link starts down.
    #[serde(default)]
    pub down: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RouteMetric {
    /// Fewest hops.
    #[default]
    Hops,
    /// Expected transmission count 1/((1-p_fwd)(1-p_rev)).
    Etx,
    /// Only `[[routing.routes]]` / `[[routing.paths]]`.
    Static,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RoutingSpec {
    #[serde(default)]
    pub metric: RouteMetric,
    /// Recompute shortest paths over the links that are up after every topology event.
    /// Destinations that become unreachable keep their previous next hop (§3.4).
    #[serde(default)]
    pub recompute: bool,
    /// Explicit entries; they override computed ones.
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    /// A path installs forward routes to its last node and reverse routes to its first.
    #[serde(default)]
    pub paths: Vec<PathSpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    pub node: u32,
    pub dst: u32,
    pub via: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathSpec {
    pub path: Vec<u32>,
}

/// A byte count: an integer, or a string with a unit ("4KB", "1MB", "10 MiB"; KB = 1000).
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "toml::Value")]
pub enum Size {
    Bytes(u64),
    Text(String),
}

impl TryFrom<toml::Value> for Size {
    type Error = String;
    fn try_from(v: toml::Value) -> Result<Self, String> {
        match v {
            toml::Value::Integer(i) if i >= 0 => Ok(Size::Bytes(i as u64)),
            toml::Value::String(s) => Ok(Size::Text(s)),
            other => Err(format!(
                "size must be a number of bytes >= 0 or a string such as \"4KB\" or \"1MiB\", not {other}"
            )),
        }
    }
}

impl Size {
    pub fn bytes(&self) -> Result<u64, String> {
        match self {
            Size::Bytes(b) => Ok(*b),
            Size::Text(s) => parse_size(s),
        }
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("bad size {s:?}: expected e.g. 4096, \"4KB\", \"1MiB\""))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "kib" => 1024.0,
        "mib" => 1048576.0,
        "gib" => 1073741824.0,
        other => {
            return Err(format!(
                "bad size unit {other:?} in {s:?}: use B, KB, MB, GB, KiB, MiB or GiB"
            ))
        }
    };
    Ok((n * mult).round() as u64)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowSpec {
    pub src: u32,
    pub dst: u32,
    pub size: Size,
    /// Start time, seconds.
    #[serde(default)]
    pub start: f64,
    #[serde(default = "d_transport")]
    pub transport: String,
}

fn d_transport() -> String {
    "hop".to_string()
}

/// A flow's end in a flow set: a node id, or "random".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Endpoint {
    #[default]
    Random,
    Node(u32),
}

impl<'de> Deserialize<'de> for Endpoint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match toml::Value::deserialize(d)? {
            toml::Value::Integer(i) => u32::try_from(i)
                .map(Endpoint::Node)
                .map_err(|_| D::Error::custom(format!("{i} is not a node id"))),
            toml::Value::String(s) if s == "random" => Ok(Endpoint::Random),
            other => Err(D::Error::custom(format!(
                "src/dst must be a node id or \"random\", not {other}"
            ))),
        }
    }
}

/// A flow set's size: one size, or `[min, max]` drawn uniformly per flow.
#[derive(Debug, Clone)]
pub enum SizeRange {
    Fixed(Size),
    Range(Size, Size),
}

impl<'de> Deserialize<'de> for SizeRange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match toml::Value::deserialize(d)? {
            toml::Value::Array(a) if a.len() == 2 => {
                let mut it = a.into_iter().map(Size::try_from);
                match (it.next(), it.next()) {
                    (Some(Ok(lo)), Some(Ok(hi))) => Ok(SizeRange::Range(lo, hi)),
                    (Some(Err(e)), _) | (_, Some(Err(e))) => Err(D::Error::custom(e)),
                    _ => unreachable!("two elements"),
                }
            }
            toml::Value::Array(_) => Err(D::Error::custom(
                "size as a range is [min, max], e.g. [\"100KB\", \"10MB\"]",
            )),
            v => Size::try_from(v)
                .map(SizeRange::Fixed)
                .map_err(D::Error::custom),
        }
    }
}

impl SizeRange {
    /// (min, max) bytes.
    pub fn bounds(&self) -> Result<(u64, u64), String> {
        match self {
            SizeRange::Fixed(s) => s.bytes().map(|b| (b, b)),
            SizeRange::Range(lo, hi) => {
                let (lo, hi) = (lo.bytes()?, hi.bytes()?);
                if lo > hi {
                    return Err(format!("size range [{lo}, {hi}]: min above max"));
                }
                Ok((lo, hi))
            }
        }
    }
}

/// `count` flows drawn at random, expanded into ordinary flows when the simulation is built
/// (after the topology and its routes, which the draw needs).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowSetSpec {
    pub count: u32,
    #[serde(default)]
    pub src: Endpoint,
    #[serde(default)]
    pub dst: Endpoint,
    /// The route from src to dst has at least this many hops.
    #[serde(default = "d_min_hops")]
    pub min_hops: u32,
    pub size: SizeRange,
    /// Every flow starts here, unless `rate_per_s` or `start_window` is set.
    #[serde(default)]
    pub start: f64,
    /// Poisson arrivals from `start` on: exponential gaps of mean 1 / rate_per_s.
    #[serde(default)]
    pub rate_per_s: Option<f64>,
    /// Starts drawn uniformly in [from, to).
    #[serde(default)]
    pub start_window: Option<[f64; 2]>,
    #[serde(default = "d_transport")]
    pub transport: String,
}

fn d_min_hops() -> u32 {
    1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Link `a`-`b` stops carrying frames in both directions.
    LinkDown,
    LinkUp,
    /// Every link of `node` goes down; the node keeps its memory.
    NodeDown,
    NodeUp,
    /// `node` loses all state and stops sending and receiving.
    NodeCrash,
    /// `node` comes back as a fresh node (same id and transports).
    NodeRestart,
    /// Change the loss rate of link `a`-`b` (`loss`, or `loss_ab`/`loss_ba`).
    SetLoss,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSpec {
    /// Seconds.
    pub at: f64,
    pub kind: EventKind,
    #[serde(default)]
    pub node: Option<u32>,
    #[serde(default)]
    pub a: Option<u32>,
    #[serde(default)]
    pub b: Option<u32>,
    #[serde(default)]
    pub loss: Option<f64>,
    #[serde(default)]
    pub loss_ab: Option<f64>,
    #[serde(default)]
    pub loss_ba: Option<f64>,
    /// Repeat the event every `every` seconds...
    #[serde(default)]
    pub every: Option<f64>,
    /// ...this many times in total (default: until the end of the run).
    #[serde(default)]
    pub count: Option<u32>,
}

impl NodesSpec {
    /// The number of nodes.
    pub fn len(&self) -> u32 {
        match self {
            NodesSpec::Count(n) => *n,
            NodesSpec::Placed(v) => v.len() as u32,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Scenario {
    /// Parse a scenario from TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ScenarioError> {
        let sc: Scenario = toml::from_str(text).map_err(|e| {
            ScenarioError::Parse(e.to_string().replace('\n', " ").trim().to_string())
        })?;
        sc.validate()?;
        Ok(sc)
    }

    /// A scenario from an already parsed TOML table (e.g. a file with settings applied).
    pub fn from_table(table: toml::Table) -> Result<Self, ScenarioError> {
        let sc: Scenario = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| {
                ScenarioError::Parse(e.to_string().replace('\n', " ").trim().to_string())
            })?;
        sc.validate()?;
        Ok(sc)
    }

    /// Read and parse a scenario file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ScenarioError::Io(format!("{}: {e}", path.display())))?;
        Self::from_toml(&text)
    }

    /// Number of nodes after applying the generator.
    pub fn node_count(&self) -> Result<u32, ScenarioError> {
        let t = &self.topology;
        match t.generator {
            Generator::Grid => {
                let (r, c) = match (t.rows, t.cols) {
                    (Some(r), Some(c)) if r > 0 && c > 0 => (r, c),
                    _ => {
                        return Err(ScenarioError::Invalid(
                            "topology.generator = \"grid\" needs rows and cols >= 1".into(),
                        ))
                    }
                };
                let n = r.checked_mul(c).ok_or_else(|| {
                    ScenarioError::Invalid("topology: rows * cols is too large".into())
                })?;
                if let Some(k) = t.nodes.as_ref().map(NodesSpec::len) {
                    if k != n {
                        return Err(ScenarioError::Invalid(format!(
                            "topology: nodes = {k} but rows * cols = {n}; drop `nodes` or fix it"
                        )));
                    }
                }
                Ok(n)
            }
            _ => t.nodes.as_ref().map(NodesSpec::len).ok_or_else(|| {
                ScenarioError::Invalid("topology.nodes is required (node ids are 0..nodes)".into())
            }),
        }
    }

    /// Checks that do not need the transport registry.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let inv = |m: String| Err(ScenarioError::Invalid(m));
        let n = self.node_count()?;
        if n == 0 {
            return inv("topology.nodes must be at least 1".into());
        }
        if n > 100_000 {
            return inv(format!("topology.nodes = {n} is too large (limit 100000)"));
        }
        let node_ok = |what: &str, id: u32| -> Result<(), ScenarioError> {
            if id >= n {
                Err(ScenarioError::Invalid(format!(
                    "{what}: node {id} does not exist (ids are 0..{n})"
                )))
            } else {
                Ok(())
            }
        };
        if let Some(d) = self.duration {
            if !(d.is_finite() && d > 0.0) {
                return inv(format!(
                    "duration = {d}: must be a positive number of seconds"
                ));
            }
        }
        let m = &self.medium;
        for (k, v) in [
            ("medium.preamble_us", m.preamble_us),
            ("medium.difs_us", m.difs_us),
            ("medium.sifs_us", m.sifs_us),
            ("medium.slot_us", m.slot_us),
            ("medium.txop_us", m.txop_us),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return inv(format!("{k} = {v}: must be >= 0"));
            }
        }
        if !(m.ack_rate_mbps.is_finite() && m.ack_rate_mbps > 0.0) {
            return inv("medium.ack_rate_mbps must be > 0".into());
        }
        if m.cw_min > m.cw_max || m.cw_max > 65535 {
            return inv("medium: need cw_min <= cw_max <= 65535".into());
        }
        if m.control_cw_min > m.control_cw_max || m.control_cw_max > 65535 {
            return inv("medium: need control_cw_min <= control_cw_max <= 65535".into());
        }
        if m.queue_frames == 0 || m.queue_frames > 100_000 {
            return inv("medium.queue_frames must be in 1..=100000".into());
        }
        if m.mac_queue_frames == 0 || m.mac_queue_frames > 100_000 {
            return inv("medium.mac_queue_frames must be in 1..=100000".into());
        }
        if !(m.mac_queue_max_delay_ms.is_finite() && m.mac_queue_max_delay_ms >= 0.0) {
            return inv("medium.mac_queue_max_delay_ms must be >= 0".into());
        }
        if m.retry_limit > 1000 {
            return inv("medium.retry_limit must be <= 1000".into());
        }
        let t = &self.topology;
        check_loss("topology.loss", t.loss)?;
        check_rate("topology.rate_mbps", t.rate_mbps)?;
        check_delay("topology.delay_us", t.delay_us)?;
        for (i, l) in t.links.iter().enumerate() {
            let w = format!("topology.links[{i}]");
            node_ok(&w, l.a)?;
            node_ok(&w, l.b)?;
            if l.a == l.b {
                return inv(format!("{w}: a link needs two different nodes"));
            }
            for v in [l.loss, l.loss_ab, l.loss_ba].into_iter().flatten() {
                check_loss(&w, v)?;
            }
            for v in [l.rate_mbps, l.rate_ab_mbps, l.rate_ba_mbps]
                .into_iter()
                .flatten()
            {
                check_rate(&w, v)?;
            }
            if let Some(d) = l.delay_us {
                check_delay(&w, d)?;
            }
        }
        self.validate_radio(n)?;
        for (i, r) in self.routing.routes.iter().enumerate() {
            let w = format!("routing.routes[{i}]");
            node_ok(&w, r.node)?;
            node_ok(&w, r.dst)?;
            node_ok(&w, r.via)?;
        }
        for (i, p) in self.routing.paths.iter().enumerate() {
            let w = format!("routing.paths[{i}]");
            if p.path.len() < 2 {
                return inv(format!("{w}: a path needs at least two nodes"));
            }
            for &x in &p.path {
                node_ok(&w, x)?;
            }
        }
        for (i, f) in self.flows.iter().enumerate() {
            let w = format!("flows[{i}]");
            node_ok(&w, f.src)?;
            node_ok(&w, f.dst)?;
            if f.src == f.dst {
                return inv(format!("{w}: src and dst are both {}", f.src));
            }
            let size = f
                .size
                .bytes()
                .map_err(|e| ScenarioError::Invalid(format!("{w}: {e}")))?;
            if size > 1 << 34 {
                return inv(format!("{w}: size {size} is too large (limit 16 GiB)"));
            }
            if !(f.start.is_finite() && f.start >= 0.0) {
                return inv(format!("{w}: start must be >= 0 seconds"));
            }
        }
        for (i, fs) in self.flow_sets.iter().enumerate() {
            let w = format!("flow_sets[{i}]");
            if fs.count == 0 || fs.count > 1_000_000 {
                return inv(format!("{w}: count must be in 1..=1000000"));
            }
            for e in [fs.src, fs.dst] {
                if let Endpoint::Node(x) = e {
                    node_ok(&w, x)?;
                }
            }
            if let (Endpoint::Node(a), Endpoint::Node(b)) = (fs.src, fs.dst) {
                if a == b {
                    return inv(format!("{w}: src and dst are both {a}"));
                }
            }
            if fs.min_hops == 0 {
                return inv(format!("{w}: min_hops must be at least 1"));
            }
            let (_, hi) = fs
                .size
                .bounds()
                .map_err(|e| ScenarioError::Invalid(format!("{w}: {e}")))?;
            if hi > 1 << 34 {
                return inv(format!("{w}: size {hi} is too large (limit 16 GiB)"));
            }
            if !(fs.start.is_finite() && fs.start >= 0.0) {
                return inv(format!("{w}: start must be >= 0 seconds"));
            }
            if let Some(r) = fs.rate_per_s {
                if !(r.is_finite() && r > 0.0) {
                    return inv(format!("{w}: rate_per_s must be > 0"));
                }
            }
            if let Some([a, b]) = fs.start_window {
                if !(a.is_finite() && b.is_finite() && 0.0 <= a && a <= b) {
                    return inv(format!(
                        "{w}: start_window = [{a}, {b}] needs 0 <= from <= to seconds"
                    ));
                }
                if fs.rate_per_s.is_some() {
                    return inv(format!(
                        "{w}: give rate_per_s (Poisson arrivals) or start_window (uniform), not both"
                    ));
                }
            }
        }
        for (i, e) in self.events.iter().enumerate() {
            let w = format!("events[{i}] ({:?})", e.kind);
            if !(e.at.is_finite() && e.at >= 0.0) {
                return inv(format!("{w}: at must be >= 0 seconds"));
            }
            if let Some(ev) = e.every {
                if !(ev.is_finite() && ev > 0.0) {
                    return inv(format!("{w}: every must be > 0 seconds"));
                }
            }
            if e.count.is_some() && e.every.is_none() {
                return inv(format!("{w}: count needs every"));
            }
            match e.kind {
                EventKind::LinkDown | EventKind::LinkUp | EventKind::SetLoss => {
                    let (Some(a), Some(b)) = (e.a, e.b) else {
                        return inv(format!("{w}: needs a and b (the link's nodes)"));
                    };
                    node_ok(&w, a)?;
                    node_ok(&w, b)?;
                    if e.node.is_some() {
                        return inv(format!("{w}: takes a and b, not node"));
                    }
                    if e.kind == EventKind::SetLoss {
                        if e.loss.is_none() && e.loss_ab.is_none() && e.loss_ba.is_none() {
                            return inv(format!("{w}: needs loss, loss_ab or loss_ba"));
                        }
                        for v in [e.loss, e.loss_ab, e.loss_ba].into_iter().flatten() {
                            check_loss(&w, v)?;
                        }
                    } else if e.loss.is_some() || e.loss_ab.is_some() || e.loss_ba.is_some() {
                        return inv(format!("{w}: loss only applies to set_loss"));
                    }
                }
                EventKind::NodeDown
                | EventKind::NodeUp
                | EventKind::NodeCrash
                | EventKind::NodeRestart => {
                    let Some(x) = e.node else {
                        return inv(format!("{w}: needs node"));
                    };
                    node_ok(&w, x)?;
                    if e.a.is_some() || e.b.is_some() || e.loss.is_some() {
                        return inv(format!("{w}: takes node only"));
                    }
                }
            }
        }
        Ok(())
    }
}

impl Scenario {
    /// Node positions, the radio range and the placement area.
    fn validate_radio(&self, n: u32) -> Result<(), ScenarioError> {
        let inv = |m: String| Err(ScenarioError::Invalid(m));
        let t = &self.topology;
        if !t.has_radio() {
            for (k, set) in [
                ("width_m", t.width_m.is_some()),
                ("height_m", t.height_m.is_some()),
                ("range_m", t.range_m.is_some()),
                ("carrier_sense_range_m", t.carrier_sense_range_m.is_some()),
                ("layout_seed", t.layout_seed.is_some()),
            ] {
                if set {
                    return inv(format!(
                        "topology.{k} needs node positions: generator = \"random\" or \
                         [[topology.nodes]] tables with id, x, y"
                    ));
                }
            }
            return Ok(());
        }
        if n > MAX_PLACED_NODES {
            return inv(format!(
                "topology: {n} placed nodes is too many (limit {MAX_PLACED_NODES})"
            ));
        }
        let Some(range) = t.range_m else {
            return inv("topology.range_m is required with node positions".into());
        };
        if !(range.is_finite() && range > 0.0) {
            return inv(format!("topology.range_m = {range}: must be > 0 metres"));
        }
        if let Some(cs) = t.carrier_sense_range_m {
            if !(cs.is_finite() && cs >= range) {
                return inv(format!(
                    "topology.carrier_sense_range_m = {cs}: must be >= range_m ({range})"
                ));
            }
        }
        if !(0.0..=1.0).contains(&t.loss_free_fraction) {
            return inv("topology.loss_free_fraction must be in 0..=1".into());
        }
        check_loss("topology.loss_at_range", t.loss_at_range)?;
        match (&t.nodes, t.generator) {
            (Some(NodesSpec::Placed(v)), Generator::None) => {
                let mut seen = vec![false; v.len()];
                for p in v {
                    let w = format!("[[topology.nodes]] id = {}", p.id);
                    if !(p.x.is_finite() && p.y.is_finite()) {
                        return inv(format!("{w}: x and y must be finite metres"));
                    }
                    match seen.get_mut(p.id as usize) {
                        Some(s) if !*s => *s = true,
                        Some(_) => return inv(format!("{w}: given twice")),
                        None => {
                            return inv(format!(
                                "{w}: ids must be 0..{} (one table per node)",
                                v.len()
                            ))
                        }
                    }
                }
            }
            (Some(NodesSpec::Placed(_)), g) => {
                return inv(format!(
                    "topology: [[topology.nodes]] positions go with generator = \"none\" \
                     (the default), not {g:?}"
                ));
            }
            (_, Generator::Random) => {
                for (k, v) in [("width_m", t.width_m), ("height_m", t.height_m)] {
                    match v {
                        Some(x) if x.is_finite() && x >= 0.0 => {}
                        Some(x) => return inv(format!("topology.{k} = {x}: must be >= 0")),
                        None => {
                            return inv(format!(
                                "topology.{k} is required with generator = \"random\""
                            ))
                        }
                    }
                }
                if t.placement_tries == 0 {
                    return inv("topology.placement_tries must be at least 1".into());
                }
            }
            _ => {}
        }
        Ok(())
    }
}

fn check_loss(w: &str, v: f64) -> Result<(), ScenarioError> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(ScenarioError::Invalid(format!(
            "{w}: loss {v} must be a fraction in 0..=1"
        )))
    }
}

fn check_rate(w: &str, v: f64) -> Result<(), ScenarioError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(ScenarioError::Invalid(format!(
            "{w}: rate {v} Mb/s must be > 0"
        )))
    }
}

fn check_delay(w: &str, v: f64) -> Result<(), ScenarioError> {
    if v.is_finite() && (0.0..=60e6).contains(&v) {
        Ok(())
    } else {
        Err(ScenarioError::Invalid(format!(
            "{w}: delay {v} µs must be in 0..=60000000"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4KB").unwrap(), 4000);
        assert_eq!(parse_size("1 MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("12").unwrap(), 12);
        assert!(parse_size("3 parsecs").is_err());
    }

    #[test]
    fn unknown_key_rejected() {
        let e = Scenario::from_toml("[topology]\nnodes = 2\nnodez = 3\n").unwrap_err();
        assert!(e.to_string().contains("nodez"), "{e}");
    }
}
