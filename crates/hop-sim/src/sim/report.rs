//! The result of a run.

use hop_proto::NodeStats;

use super::Simulation;
use crate::result::{FlowResult, NodeResult, SimResult};

impl Simulation {
    pub(super) fn report(&self, wall_s: f64) -> SimResult {
        let virtual_s = self.now as f64 / 1e9;
        let flows: Vec<FlowResult> = self
            .flows
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let size = f.size;
                let complete = f.delivered == size && f.identical && f.completed_at.is_some();
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
                    bytes_sent: f.offered,
                    bytes_delivered: f.delivered,
                    duplicate_bytes: f.duplicate_bytes,
                    identical: f.identical && f.delivered == size,
                    delivered_bytes_match: f.identical,
                    completed: complete,
                    completion_time: if complete {
                        f.completed_at.map(|t| (t - f.start) as f64 / 1e9)
                    } else {
                        None
                    },
                    send_complete_time: f.send_complete_at.map(|t| (t - f.start) as f64 / 1e9),
                    goodput_bps: goodput,
                    failed: f.failed.clone(),
                }
            })
            .collect();
        let nodes = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, sn)| {
                let mut all: Vec<NodeStats> = sn.past.clone();
                if let Some(n) = &sn.node {
                    all.push(n.stats());
                }
                NodeResult::from_stats(
                    i as u32,
                    sn.crashes,
                    sn.node.is_some(),
                    &all,
                    sn.mac.clone(),
                )
            })
            .collect();
        let goodputs: Vec<f64> = flows.iter().map(|f| f.goodput_bps).collect();
        SimResult {
            schema_version: crate::result::SCHEMA_VERSION,
            scenario: self.sc.name.clone(),
            seed: self.seed,
            medium_kind: if self.shared { "shared" } else { "p2p" }.into(),
            stop_reason: self.stop_reason.into(),
            virtual_seconds: virtual_s,
            wall_seconds: wall_s,
            all_flows_completed: flows.iter().all(|f| f.completed),
            jain_fairness: crate::result::jain(&goodputs),
            flows,
            nodes,
            medium: self.medium.clone(),
        }
    }
}
