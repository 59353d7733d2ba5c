//! The result of a run.

use hop_proto::NodeStats;

use super::Simulation;
use crate::result::{jain, Efficiency, FlowResult, NodeResult, SimResult};

impl Simulation {
    pub(super) fn report(&self, wall_s: f64) -> SimResult {
        let virtual_s = self.now as f64 / 1e9;
        let flows: Vec<FlowResult> = self
            .flows
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let size = f.size;
                // The destination side: every byte, in order, equal to what was sent.
                let all_delivered = f.delivered == size && f.identical && f.completed_at.is_some();
                let goodput = match f.last_delivery_at {
                    Some(t) if t > f.start && f.delivered > 0 => {
                        f.delivered as f64 * 8.0 / ((t - f.start) as f64 / 1e9)
                    }
                    _ => 0.0,
                };
                FlowResult {
                    index: i,
                    src: f.src as u32,
                    dst: f.dst as u32,
                    transport: f.transport.clone(),
                    flow_id: f.key.map(|k| k.to_string()),
                    size,
                    start: f.start as f64 / 1e9,
                    hops: self.route_hops(f.src as u32, f.dst as u32),
                    route: self.route_path(f.src as u32, f.dst as u32),
                    bytes_sent: f.offered,
                    bytes_delivered: f.delivered,
                    duplicate_bytes: f.duplicate_bytes,
                    identical: f.identical && f.delivered == size,
                    delivered_bytes_match: f.identical,
                    // The source's knowledge, not the destination's: a flow whose bytes all
                    // arrived but whose source never learned it is not complete.
                    completed: f.send_complete_at.is_some() && f.failed.is_none(),
                    completion_time: if all_delivered {
                        f.completed_at.map(|t| (t - f.start) as f64 / 1e9)
                    } else {
                        None
                    },
                    send_complete_time: f.send_complete_at.map(|t| (t - f.start) as f64 / 1e9),
                    first_delivery_time: f.first_delivery_at.map(|t| (t - f.start) as f64 / 1e9),
                    longest_stall: (f.start < self.now).then(|| {
                        let tail = if f.delivered == size {
                            0
                        } else {
                            self.now - f.last_delivery_at.unwrap_or(f.start)
                        };
                        f.longest_gap.max(tail) as f64 / 1e9
                    }),
                    goodput_bps: goodput,
                    failed: f.failed.clone(),
                }
            })
            .collect();
        let nodes: Vec<NodeResult> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, sn)| {
                let now = sn.node.as_ref().map(|n| n.stats());
                let mut all: Vec<NodeStats> = sn.past.clone();
                all.extend(now.clone());
                let mut r = NodeResult::from_stats(
                    i as u32,
                    sn.crashes,
                    now.as_ref(),
                    &all,
                    sn.mac.clone(),
                );
                r.position = self.positions.as_ref().map(|p| [p[i].0, p[i].1]);
                r
            })
            .collect();
        let goodputs: Vec<f64> = flows.iter().map(|f| f.goodput_bps).collect();
        let weighted: Vec<f64> = flows
            .iter()
            .filter_map(|f| f.hops.map(|h| f.goodput_bps * f64::from(h)))
            .collect();
        let byte_hops: u64 = flows
            .iter()
            .map(|f| f.bytes_delivered * u64::from(f.hops.unwrap_or(0)))
            .sum();
        let data_sent: u64 = nodes
            .iter()
            .map(|n| n.sent_by_type.get("data").copied().unwrap_or(0))
            .sum();
        let resent: u64 = nodes.iter().map(|n| n.data_retransmissions).sum();
        let data_air = self.medium.data_airtime_ns;
        let efficiency = Efficiency {
            data_airtime_ns: data_air,
            delivered_byte_hops: byte_hops,
            data_air_ns_per_byte_hop: (byte_hops > 0).then(|| data_air as f64 / byte_hops as f64),
            data_packets_sent: data_sent,
            data_retransmissions: resent,
            data_resend_share: (data_sent > 0).then(|| resent as f64 / data_sent as f64),
        };
        SimResult {
            schema_version: crate::result::SCHEMA_VERSION,
            scenario: self.sc.name.clone(),
            seed: self.seed,
            medium_kind: if self.shared { "shared" } else { "p2p" }.into(),
            stop_reason: self.stop_reason.into(),
            virtual_seconds: virtual_s,
            wall_seconds: wall_s,
            all_flows_completed: flows.iter().all(|f| f.completed),
            jain_fairness: jain(&goodputs),
            hop_weighted_jain_fairness: jain(&weighted),
            efficiency,
            flows_at_end: nodes.iter().map(|n| n.flows_at_end).sum(),
            cache_bytes_at_end: nodes.iter().map(|n| n.cache_bytes_at_end).sum(),
            flows,
            nodes,
            medium: self.medium.clone(),
        }
    }
}
