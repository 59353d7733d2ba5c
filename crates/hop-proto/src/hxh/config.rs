//! HxH parameters. Values from the HxH paper cite their section; the others are choices of
//! this implementation, explained in `docs/transports.md`.

use std::time::Duration;

/// Payload bytes per data packet (HxH paper §4: "a packet size of 1000 bytes").
pub const PACKET_PAYLOAD_BYTES: usize = 1000;
/// Advertised per-flow buffer, in packets (§4: "nodes advertise a maximum queue size of 4
/// packets per flow").
pub const BUFFER_PACKETS: u16 = 4;
/// Extra per-flow buffer that is never advertised (§3.2: "a downstream node under-reports its
/// available buffer space by a few packets per flow").
pub const RESERVE_PACKETS: u16 = 2;
/// A stalled flow is probed after this many EWMAs of previous delays (§3.2: "five times").
pub const STALL_MULTIPLIER: u32 = 5;
/// Unused flow state is deleted after this long (§3.1: "two seconds").
pub const FLOW_TIMEOUT: Duration = Duration::from_secs(2);
/// Per-hop retries before a relay drops a packet; stands in for the 802.11 retry limit the
/// paper's scheduler relies on (§3.1, §3.3: "whenever a frame transmission fails it re-sends").
pub const HOP_RETRY_LIMIT: u32 = 7;

/// Configuration of [`HxhTransport`](super::HxhTransport).
#[derive(Debug, Clone, PartialEq)]
pub struct HxhConfig {
    /// Payload bytes per data packet.
    pub packet_payload_bytes: usize,
    /// Advertised per-flow buffer, in packets.
    pub buffer_packets: u16,
    /// Per-flow buffer held back from the advertisement.
    pub reserve_packets: u16,
    /// Stall probe after `stall_multiplier` x EWMA of per-hop feedback delay.
    pub stall_multiplier: u32,
    /// Idle relay flow state is deleted after this long.
    pub flow_timeout: Duration,
    /// Initial estimate of the per-hop feedback delay (data sent -> hop ack received).
    pub hop_delay_initial: Duration,
    /// Weight of a new sample in the per-hop delay EWMA.
    pub hop_delay_gain: f64,
    /// A hop ack missing for EWMA + `hop_rto_multiplier` x mean deviation of the per-hop
    /// delay means the packet is sent again.
    pub hop_rto_multiplier: u32,
    pub hop_rto_min: Duration,
    pub hop_rto_max: Duration,
    /// Per-hop retries before a relay drops a packet (end-to-end recovery takes over).
    pub hop_retry_limit: u32,
    /// Destination: resend a NACK if the gap is still open after this long (§3.3.1 timer).
    pub nack_timeout: Duration,
    /// Destination: NACK a gap only once it has stayed open longer than packets reordered
    /// by per-hop retransmissions usually take to fill it (EWMA + `hop_rto_multiplier` x
    /// mean deviation of that delay, bounded by `hop_rto_min` .. `hop_rto_max`). `false`
    /// NACKs every gap at once, as §3.3.1 does over a MAC that delivers each hop in order.
    pub nack_holdoff: bool,
    /// Destination: at most one explicit ACK per flow per interval (§3.3.2 rate limit).
    pub explicit_ack_interval: Duration,
    /// Source: with nothing left to send and data unacknowledged, resend the first
    /// unacknowledged packet with the ACK-request bit after this long (doubling).
    pub source_rto: Duration,
    /// A flow with no progress for this long fails (source) or is dropped (destination).
    pub give_up: Duration,
    /// Application bytes a source flow buffers until acknowledged.
    pub send_buffer_bytes: usize,
    /// Most flows with state on this node.
    pub max_flows: usize,
    /// Finished flows remembered by a destination to answer late retransmissions.
    pub finished_memory: usize,
    /// Passive feedback (§3.2, §3.3): a relay does not acknowledge the data it accepts; the
    /// node before it learns that the packet arrived, and the relay's credits, by overhearing
    /// the relay forward it. Only the destination (which forwards nothing) and relays refusing
    /// or receiving a packet twice answer with a per-hop acknowledgement. Needs a runtime that
    /// hands this node the unicast datagrams its neighbours send each other (hopd with
    /// `overhear = true`, the simulator's shared medium); off, every packet is acknowledged
    /// (the explicit variant of §3.4).
    pub passive_feedback: bool,
}

impl Default for HxhConfig {
    fn default() -> Self {
        HxhConfig {
            packet_payload_bytes: PACKET_PAYLOAD_BYTES,
            buffer_packets: BUFFER_PACKETS,
            reserve_packets: RESERVE_PACKETS,
            stall_multiplier: STALL_MULTIPLIER,
            flow_timeout: FLOW_TIMEOUT,
            hop_delay_initial: Duration::from_millis(20),
            hop_delay_gain: 0.125,
            hop_rto_multiplier: 4,
            hop_rto_min: Duration::from_millis(5),
            hop_rto_max: Duration::from_secs(1),
            hop_retry_limit: HOP_RETRY_LIMIT,
            nack_timeout: Duration::from_millis(200),
            nack_holdoff: true,
            explicit_ack_interval: Duration::from_millis(10),
            source_rto: Duration::from_millis(500),
            give_up: Duration::from_secs(30),
            send_buffer_bytes: 256 * 1024,
            max_flows: 1024,
            finished_memory: 1024,
            passive_feedback: false,
        }
    }
}

/// Largest payload that fits the envelope with the HxH data header.
pub const MAX_PACKET_PAYLOAD_BYTES: usize = 60_000;

impl HxhConfig {
    /// The same configuration with every value forced into its valid range, so that no
    /// configuration can make the transport panic or spin (e.g. a zero timer).
    pub fn sanitized(mut self) -> Self {
        let ms = Duration::from_millis(1);
        let day = Duration::from_secs(86_400);
        self.packet_payload_bytes = self.packet_payload_bytes.clamp(1, MAX_PACKET_PAYLOAD_BYTES);
        self.buffer_packets = self.buffer_packets.clamp(1, 1024);
        self.reserve_packets = self.reserve_packets.min(1024);
        self.stall_multiplier = self.stall_multiplier.clamp(1, 1000);
        self.flow_timeout = self.flow_timeout.clamp(ms, day);
        self.hop_delay_initial = self.hop_delay_initial.clamp(Duration::from_micros(1), day);
        if !(self.hop_delay_gain.is_finite() && (0.0..=1.0).contains(&self.hop_delay_gain)) {
            self.hop_delay_gain = HxhConfig::default().hop_delay_gain;
        }
        self.hop_rto_multiplier = self.hop_rto_multiplier.clamp(1, 1000);
        self.hop_rto_min = self.hop_rto_min.clamp(Duration::from_micros(1), day);
        self.hop_rto_max = self.hop_rto_max.clamp(self.hop_rto_min, day);
        self.nack_timeout = self.nack_timeout.clamp(ms, day);
        self.explicit_ack_interval = self.explicit_ack_interval.min(day);
        self.source_rto = self.source_rto.clamp(ms, day);
        self.give_up = self.give_up.clamp(ms, day);
        self.send_buffer_bytes = self.send_buffer_bytes.max(1);
        self
    }
}
