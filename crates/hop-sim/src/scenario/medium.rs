//! The `[medium]` table: the 802.11-like MAC's timing, queues and link-layer retries.

use serde::Deserialize;

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
/// Link-layer retry limit for `Class::Acked` frames (the baselines' unicast segments and
/// ACKs): 802.11's dot11ShortRetryLimit, 7, as a stock driver and ns-3 use for any unicast
/// frame.
pub const DEFAULT_ACKED_RETRY_LIMIT: u32 = 7;
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
    /// Link-layer retries of a `Class::Acked` frame (the baselines' unicast frames).
    #[serde(default = "d_acked_retry")]
    pub acked_retry_limit: u32,
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
    /// Virtual carrier sense (802.11's NAV): a node that decodes a unicast frame addressed
    /// to another node defers until that frame's ACK is over (SIFS + ACK), as the frame's
    /// Duration field tells it, so it does not start a frame on top of an ACK it may not
    /// hear. Broadcast frames carry no Duration and set no NAV. Off: only the frames a node
    /// hears keep it from sending (the simulator before 2026-12-02).
    #[serde(default = "d_true")]
    pub nav: bool,
    /// EIFS: after a frame it could not decode (a collision or a frame lost on its link), a
    /// node waits SIFS + ACK + DIFS instead of DIFS before counting its backoff down, until it
    /// decodes a frame again, to leave room for the ACK of an exchange it did not follow.
    /// Off: DIFS after every frame (the simulator before 2026-12-02).
    #[serde(default = "d_true")]
    pub eifs: bool,
    /// Unicast frames get a link-layer acknowledgement (802.11: the sender waits for it
    /// before its next frame, and retries on its loss). Off: a wire, a veth or a tunnel,
    /// where a frame is sent and forgotten; then no frame is retried (`retry_limit` and
    /// `acked_retry_limit` must be 0, `data_arq` off).
    #[serde(default = "d_true")]
    pub link_acks: bool,
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
fn d_acked_retry() -> u32 {
    DEFAULT_ACKED_RETRY_LIMIT
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
            acked_retry_limit: DEFAULT_ACKED_RETRY_LIMIT,
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
            link_acks: true,
            control_when_full: false,
            nav: true,
            eifs: true,
        }
    }
}
