//! The JSON result of a run (schema documented in docs/scenarios.md).

use std::collections::BTreeMap;

use hop_proto::NodeStats;
use serde::Serialize;

/// Bumped on any incompatible change of the result layout.
/// 2: `completed` is the source's knowledge (SendComplete); flows' `hops`; nodes' state at
/// the end and positions; data airtime; `hop_weighted_jain_fairness`, `efficiency`,
/// `flows_at_end`, `cache_bytes_at_end`.
pub const SCHEMA_VERSION: u32 = 2;

#[derive(Debug, Clone, Serialize)]
pub struct SimResult {
    pub schema_version: u32,
    pub scenario: String,
    pub seed: u64,
    pub medium_kind: String,
    /// "flows_done", "duration" or "idle" (nothing left to simulate).
    pub stop_reason: String,
    pub virtual_seconds: f64,
    /// The only field that differs between two runs of the same scenario and seed.
    pub wall_seconds: f64,
    /// Every flow's source got its completion event.
    pub all_flows_completed: bool,
    /// Jain's index over the flows' goodputs; null without flows.
    pub jain_fairness: Option<f64>,
    /// Jain's index over goodput x hops (Hop paper §5.3.2), over the flows with a route;
    /// null without such flows.
    pub hop_weighted_jain_fairness: Option<f64>,
    pub efficiency: Efficiency,
    /// Flows still held by the nodes' transports at the end, summed over nodes.
    pub flows_at_end: u64,
    /// Bytes still held in the nodes' caches and buffers at the end, summed over nodes.
    pub cache_bytes_at_end: u64,
    pub flows: Vec<FlowResult>,
    pub nodes: Vec<NodeResult>,
    pub medium: MediumCounters,
}

impl SimResult {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct FlowResult {
    pub index: usize,
    pub src: u32,
    pub dst: u32,
    pub transport: String,
    /// "src:id" as the node allocated it; null if the flow never opened.
    pub flow_id: Option<String>,
    pub size: u64,
    /// Start time, seconds.
    pub start: f64,
    /// Hops of the route from src to dst in the tables the run starts with; null without one.
    pub hops: Option<u32>,
    /// The nodes of that route, source to destination; null without one.
    pub route: Option<Vec<u32>>,
    /// Bytes the source transport accepted.
    pub bytes_sent: u64,
    /// Unique in-order bytes delivered at the destination.
    pub bytes_delivered: u64,
    /// Bytes delivered again (already delivered before).
    pub duplicate_bytes: u64,
    /// Every byte delivered, in order, equal to what was sent.
    pub identical: bool,
    /// The bytes delivered so far (possibly not all) were in order and equal to those sent.
    pub delivered_bytes_match: bool,
    /// The source application got its completion event (SendComplete): every byte was
    /// acknowledged end to end. The destination's side is `bytes_delivered` / `identical`.
    pub completed: bool,
    /// Seconds from start until the destination had every byte; null unless `identical`.
    pub completion_time: Option<f64>,
    /// Seconds from start until the source saw SendComplete.
    pub send_complete_time: Option<f64>,
    /// Seconds from start until the destination had the first byte; null if none arrived.
    pub first_delivery_time: Option<f64>,
    /// The longest time (seconds) the destination went without new in-order bytes while the
    /// flow ran: from its start to the first byte, between deliveries, and from the last
    /// delivery to the end of the run for a flow not delivered in full; null for a flow
    /// that had not started when the run ended.
    pub longest_stall: Option<f64>,
    /// Unique bytes delivered * 8 / (time of the last delivery - start) (Hop paper §5.1.1).
    pub goodput_bps: f64,
    pub failed: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct MacCounters {
    pub frames_sent: u64,
    pub data_frames: u64,
    pub control_frames: u64,
    pub acks_sent: u64,
    pub link_retries: u64,
    pub link_drops: u64,
    pub rx_collisions: u64,
    pub duplicates_filtered: u64,
    pub airtime_ns: u64,
    /// Airtime of the `Class::Data` frames among them (link retries included).
    pub data_airtime_ns: u64,
    /// Push model: frames dropped because their class queue was full.
    pub queue_drops: u64,
    /// Push model: frames dropped after waiting longer than the queue delay limit.
    pub queue_expired: u64,
}

/// How much of the air went to data that arrived (the issue-46 efficiency figures).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Efficiency {
    /// Airtime of data frames on the medium (ns), link retries included.
    pub data_airtime_ns: u64,
    /// Σ over flows of unique bytes delivered x the flow's hops.
    pub delivered_byte_hops: u64,
    /// data_airtime_ns / delivered_byte_hops; null when nothing was delivered.
    pub data_air_ns_per_byte_hop: Option<f64>,
    /// Data packets the transports sent (every hop, resends included: `sent_by_type.data`).
    pub data_packets_sent: u64,
    /// Of them, resent on the same hop (`data_retransmissions`).
    pub data_retransmissions: u64,
    /// data_retransmissions / data_packets_sent; null without data packets.
    pub data_resend_share: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct MediumCounters {
    /// Data and control frames put on the air (link retries included, ACKs excluded).
    pub frames_sent: u64,
    pub acks_sent: u64,
    /// Frames lost at their link destination because they overlapped another frame.
    pub collisions: u64,
    /// Frames lost at their link destination by the link's loss rate.
    pub random_losses: u64,
    pub link_retries: u64,
    /// Control frames dropped after the retry limit.
    pub link_drops: u64,
    /// Frames in interface queues when their node crashed.
    pub crash_drops: u64,
    /// Push model: frames dropped because their class queue was full.
    pub queue_drops: u64,
    /// Push model: frames dropped after waiting longer than the queue delay limit.
    pub queue_expired: u64,
    pub airtime_ns: u64,
    /// Airtime of `Class::Data` frames (link retries included).
    pub data_airtime_ns: u64,
    pub stale_timeouts: u64,
    /// Shared medium: frames lost by overlap at the node meant to process them (the link
    /// destination, or the next hop a broadcast's envelope names), by what they carried and
    /// what spoilt them first: "LOST by OTHER (hidden)" when the other frame's sender cannot
    /// hear the lost frame's sender, "(heard)" when it can (both drew the same slot), "LOST:
    /// receiver sending" (half duplex). Labels: data, bsyn, micro, back, e2e_back, fin,
    /// control (other transports' control), acked (the TCP baseline's frames), ack (MAC ACK).
    pub losses_at_next_hop: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeResult {
    pub id: u32,
    /// [x, y] in metres with the radio model; null otherwise.
    pub position: Option<[f64; 2]>,
    pub crashes: u64,
    pub alive: bool,
    pub datagrams_sent: u64,
    pub datagrams_received: u64,
    pub datagrams_overheard: u64,
    pub datagrams_rejected: u64,
    pub sent_by_type: BTreeMap<String, u64>,
    pub received_by_type: BTreeMap<String, u64>,
    pub data_retransmissions: u64,
    pub cache_bytes_peak: u64,
    pub buffered_blocks_peak: u64,
    /// Flows the node's transports still hold at the end (0 for a node that is down).
    pub flows_at_end: u64,
    /// Bytes still in the node's caches and buffers at the end.
    pub cache_bytes_at_end: u64,
    pub extra: BTreeMap<String, u64>,
    pub mac: MacCounters,
}

impl NodeResult {
    /// Sum counters over incarnations and transports; peaks are maxima. `now` is the
    /// running incarnation's (None for a node that is down); it is also in `all`.
    pub fn from_stats(
        id: u32,
        crashes: u64,
        now: Option<&NodeStats>,
        all: &[NodeStats],
        mac: MacCounters,
    ) -> Self {
        let held = |f: fn(&hop_proto::TransportStats) -> u64| -> u64 {
            now.map_or(0, |s| s.transports.iter().map(|(_, t)| f(t)).sum())
        };
        let mut r = NodeResult {
            id,
            position: None,
            crashes,
            alive: now.is_some(),
            datagrams_sent: 0,
            datagrams_received: 0,
            datagrams_overheard: 0,
            datagrams_rejected: 0,
            sent_by_type: BTreeMap::new(),
            received_by_type: BTreeMap::new(),
            data_retransmissions: 0,
            cache_bytes_peak: 0,
            buffered_blocks_peak: 0,
            flows_at_end: held(|t| t.flows),
            cache_bytes_at_end: held(|t| t.cache_bytes),
            extra: BTreeMap::new(),
            mac,
        };
        for s in all {
            r.datagrams_sent += s.datagrams_sent;
            r.datagrams_received += s.datagrams_received;
            r.datagrams_overheard += s.datagrams_overheard;
            r.datagrams_rejected += s.datagrams_rejected;
            for (_, t) in &s.transports {
                for (k, v) in &t.sent_by_type {
                    *r.sent_by_type.entry((*k).to_string()).or_default() += v;
                }
                for (k, v) in &t.received_by_type {
                    *r.received_by_type.entry((*k).to_string()).or_default() += v;
                }
                for (k, v) in &t.extra {
                    *r.extra.entry((*k).to_string()).or_default() += v;
                }
                r.data_retransmissions += t.data_retransmissions;
                r.cache_bytes_peak = r.cache_bytes_peak.max(t.cache_bytes_peak);
                r.buffered_blocks_peak = r.buffered_blocks_peak.max(t.buffered_blocks_peak);
            }
        }
        r
    }
}

/// Jain's fairness index (Σx)² / (n Σx²); 1.0 when all are equal.
pub fn jain(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let s: f64 = xs.iter().sum();
    let s2: f64 = xs.iter().map(|x| x * x).sum();
    if s2 == 0.0 {
        return Some(0.0);
    }
    Some(s * s / (xs.len() as f64 * s2))
}
