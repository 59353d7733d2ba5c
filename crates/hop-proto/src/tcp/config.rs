//! Parameters of the TCP-like baseline, with the kernel (Linux) value or RFC each default
//! follows. Read by the simulator from a scenario's `[transports.tcp]` table, durations as
//! strings (`"200ms"`, `"60s"`), as [`HopConfig`](crate::hop::HopConfig) is.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::hop::DEFAULT_PACKET_PAYLOAD_BYTES;

/// Initial window: 10 segments (RFC 6928, Linux's default since 2.6.39).
pub const INITIAL_WINDOW_SEGMENTS: u32 = 10;
/// Receive window: 64 segments of 1380 bytes, 88 KB. Linux starts a connection at about
/// 64 KB (`tcp_rmem` default 131072 with `tcp_adv_win_scale` 1) and autotunes upwards;
/// no multi-hop 802.11b path holds more than a few segments in flight, so the window binds
/// only when a bottleneck queue would otherwise grow without bound, which a fixed window
/// of this order models without the autotuning machinery.
pub const RECEIVE_WINDOW_SEGMENTS: u32 = 64;
/// Duplicate ACKs that trigger fast retransmit (RFC 5681 §3.2, DupThresh of RFC 6675).
pub const DUP_ACK_THRESHOLD: u32 = 3;
/// RTO before the first RTT sample: 1 s (RFC 6298 §2.1).
pub const INITIAL_RTO: Duration = Duration::from_secs(1);
/// Lower bound of the RTO: Linux's `TCP_RTO_MIN`, 200 ms (RFC 6298 §2.4 recommends 1 s
/// but allows less; the kernel's value is what the lab's TCP runs with).
pub const MIN_RTO: Duration = Duration::from_millis(200);
/// Upper bound of the backed-off RTO: 60 s (RFC 6298 §2.5 allows a maximum of at least
/// 60 s; Linux's `TCP_RTO_MAX` is 120 s).
pub const MAX_RTO: Duration = Duration::from_secs(60);
/// Delayed-ACK timer: Linux's `TCP_DELACK_MIN`, 40 ms (RFC 5681 §4.2 requires < 500 ms).
pub const DELAYED_ACK: Duration = Duration::from_millis(40);
/// Drop-tail FIFO per node, packets. Linux's default `txqueuelen` is 1000 and ns-3's
/// `WifiMacQueue` holds 500; 100 is ns-3's default `DropTailQueue` size and the order of
/// magnitude of the interface queues these models put in front of a slow radio.
pub const QUEUE_LIMIT_PACKETS: usize = 100;
/// A flow with data outstanding and no acknowledgement progress for this long fails (and a
/// destination that hears nothing of a flow for this long drops it). Linux gives up after
/// `tcp_retries2` = 15 backed-off retransmissions, about 924 s with a 200 ms minimum RTO
/// (`ip-sysctl.rst`); 15 minutes keeps a starved flow trying for the whole of any
/// simulated run, as the kernel's would, instead of failing it early.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(15 * 60);
/// Send buffer per flow (the simulator's application blocks when it is full).
pub const SEND_BUFFER_BYTES: usize = 256 * 1024;

/// Configuration of [`TcpTransport`](super::TcpTransport).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TcpConfig {
    /// Payload bytes per segment: Hop's packet payload, so both send the same frames.
    pub mss: usize,
    pub initial_window_segments: u32,
    pub receive_window_segments: u32,
    pub dup_ack_threshold: u32,
    #[serde(with = "humantime_serde")]
    pub initial_rto: Duration,
    #[serde(with = "humantime_serde")]
    pub min_rto: Duration,
    #[serde(with = "humantime_serde")]
    pub max_rto: Duration,
    #[serde(with = "humantime_serde")]
    pub delayed_ack: Duration,
    /// Packets a node's FIFO holds (forwarded segments and ACKs, and its own); drop-tail.
    pub queue_limit_packets: usize,
    #[serde(with = "humantime_serde")]
    pub give_up_after: Duration,
    pub send_buffer_bytes: usize,
    pub max_flows: usize,
    /// Finished flows a destination remembers, to acknowledge late retransmissions.
    pub finished_memory: usize,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            mss: DEFAULT_PACKET_PAYLOAD_BYTES,
            initial_window_segments: INITIAL_WINDOW_SEGMENTS,
            receive_window_segments: RECEIVE_WINDOW_SEGMENTS,
            dup_ack_threshold: DUP_ACK_THRESHOLD,
            initial_rto: INITIAL_RTO,
            min_rto: MIN_RTO,
            max_rto: MAX_RTO,
            delayed_ack: DELAYED_ACK,
            queue_limit_packets: QUEUE_LIMIT_PACKETS,
            give_up_after: GIVE_UP_AFTER,
            send_buffer_bytes: SEND_BUFFER_BYTES,
            max_flows: 1024,
            finished_memory: 1024,
        }
    }
}

/// Largest segment payload that fits the envelope with the segment header.
pub const MAX_MSS: usize = 60_000;

impl TcpConfig {
    /// The defaults with a TOML table's fields over them (unknown keys are errors).
    pub fn from_toml(table: &toml::Table) -> Result<Self, String> {
        toml::Value::Table(table.clone())
            .try_into::<TcpConfig>()
            .map_err(|e| e.message().to_string())
    }

    /// The same configuration with every value in a range that cannot make the transport
    /// panic or spin (e.g. a zero RTO or an empty window).
    pub fn sanitized(mut self) -> Self {
        let hour = Duration::from_secs(3600);
        self.mss = self.mss.clamp(1, MAX_MSS);
        self.initial_window_segments = self.initial_window_segments.clamp(1, 1 << 16);
        self.receive_window_segments = self.receive_window_segments.clamp(1, 1 << 15);
        self.dup_ack_threshold = self.dup_ack_threshold.clamp(1, 1000);
        self.min_rto = self.min_rto.clamp(Duration::from_millis(1), hour);
        self.max_rto = self.max_rto.clamp(self.min_rto, hour);
        self.initial_rto = self.initial_rto.clamp(self.min_rto, self.max_rto);
        self.delayed_ack = self.delayed_ack.min(Duration::from_millis(500));
        self.queue_limit_packets = self.queue_limit_packets.max(1);
        self.give_up_after = self
            .give_up_after
            .clamp(Duration::from_millis(1), Duration::from_secs(86_400));
        self.send_buffer_bytes = self.send_buffer_bytes.max(self.mss);
        self.max_flows = self.max_flows.max(1);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_durations_as_strings_and_rejects_unknown_keys() {
        let t: toml::Table = toml::from_str("min_rto = \"300ms\"\nmss = 1000").unwrap();
        let c = TcpConfig::from_toml(&t).unwrap();
        assert_eq!(c.min_rto, Duration::from_millis(300));
        assert_eq!(c.mss, 1000);
        assert_eq!(c.initial_window_segments, 10);
        let t: toml::Table = toml::from_str("cubic = true").unwrap();
        assert!(TcpConfig::from_toml(&t).unwrap_err().contains("cubic"));
        assert_eq!(TcpConfig::default().mss, 1380, "Hop's packet payload");
    }
}
