//! The status JSON and the metrics text.

use std::collections::HashMap;

use hop_proto::FlowKey;

use super::Daemon;
use crate::flowfmt::HASH_LEN;

impl Daemon {
    pub(super) fn storage_bytes(&self) -> u64 {
        let inflight: u64 = self.inflows.values().map(|f| f.bytes).sum();
        let inbox: u64 = self
            .inbox
            .values()
            .map(|e| e.size + e.content_offset + HASH_LEN as u64)
            .sum();
        inflight + inbox
    }

    pub(super) fn status(&self) -> serde_json::Value {
        let stats = self.node.stats();
        let now = std::time::Instant::now();
        let mut neighbours: Vec<_> = self
            .cfg
            .neighbours
            .iter()
            .map(|n| {
                serde_json::json!({
                    "id": n.id,
                    "address": n.addr.to_string(),
                    "last_heard_ms": self.last_heard.get(&n.id).map(|t| now.duration_since(*t).as_millis() as u64),
                })
            })
            .collect();
        let mut found: Vec<_> = self.discovered.iter().collect();
        found.sort_by_key(|(id, _)| **id);
        for (id, d) in found {
            neighbours.push(serde_json::json!({
                "id": id,
                "address": d.addr.to_string(),
                "last_heard_ms": self.last_heard.get(id).map(|t| now.duration_since(*t).as_millis() as u64),
                "discovered": true,
            }));
        }
        // The share of each neighbour's recent hellos heard (directory.rs).
        for n in neighbours.iter_mut() {
            let id = n["id"].as_u64().unwrap_or(0) as u32;
            if let Some(w) = self.hello_windows.get(&id) {
                n["hello_quality"] = ((w.quality() * 100.0).round() / 100.0).into();
            }
        }
        // Hop's control datagrams lost each way (control_copies.rs): a share of a link
        // without retries that loses them; `control_copies` answers it.
        let reports = self.node.neighbour_reports();
        for n in neighbours.iter_mut() {
            let id = n["id"].as_u64().unwrap_or(0) as u32;
            if let Some(c) = reports
                .iter()
                .find(|r| r.id == id)
                .and_then(|r| r.control_loss)
            {
                let pct = |v: f64| (v * 1000.0).round() / 10.0;
                n["control_loss_from_pct"] = pct(c.from).into();
                n["control_loss_to_pct"] = pct(c.to).into();
            }
        }
        // With sessions: whether this node holds each neighbour's key.
        if self.sessions.is_some() {
            for n in neighbours.iter_mut() {
                let id = n["id"].as_u64().unwrap_or(0) as u32;
                n["session_key"] = self.auth.has_peer_key(id).into();
            }
        }
        let outgoing = self.outgoing_list();
        // `bytes`: delivered in order and spooled; `received_bytes`: unique payload bytes
        // the transport holds for the flow, including packets of blocks not complete yet
        // (what a transfer cut off before its end has achieved).
        let mut received: HashMap<FlowKey, u64> = self.node.received().into_iter().collect();
        let mut incoming: Vec<_> = self
            .inflows
            .iter()
            .map(|(k, f)| {
                let got = received.remove(k).unwrap_or(0).max(f.bytes);
                serde_json::json!({"flow": k.to_string(), "bytes": f.bytes, "received_bytes": got})
            })
            .collect();
        incoming.extend(received.into_iter().map(|(k, got)| {
            serde_json::json!({"flow": k.to_string(), "bytes": 0, "received_bytes": got})
        }));
        serde_json::json!({
            "node_id": self.cfg.node_id,
            "listen": self.cfg.listen.to_string(),
            "packet_payload_bytes": self.cfg.hop.packet_payload_bytes,
            "sessions": self.sessions.is_some(),
            "cipher": self.auth.cipher().name(),
            "directory": self.directory_status(),
            "uptime_s": self.clock.elapsed().as_secs(),
            "neighbours": neighbours,
            "outgoing": outgoing,
            "incoming": incoming,
            "inbox": self.inbox.len(),
            "storage_bytes": self.storage_bytes(),
            "storage_limit_bytes": self.cfg.max_disk_bytes,
            "kernel_routes": self.kernel_routes.len(),
            "kernel_next_hops": self
                .kernel_routes
                .iter()
                .map(|(d, n)| (d.to_string(), serde_json::json!(n)))
                .collect::<serde_json::Map<_, _>>(),
            "batman_next_hops": self
                .batman_routes
                .iter()
                .map(|(d, n)| (d.to_string(), serde_json::json!(n)))
                .collect::<serde_json::Map<_, _>>(),
            "custody": self.custody_json(),
            "spool": self.spool_json(),
            "counters": self.counters,
            "link_status": self.link.as_ref().map(|l| l.backlog.counters),
            // Hop: whether the link retries control frames, why hopd thinks so, and whether
            // BSYNs and BACKs go more than once where they are lost (`control_copies`).
            "link": self.link_retries.as_ref().map(|l| serde_json::json!({
                "retries": l.retries,
                "reason": l.reason,
                "control_copies": self.cfg.hop.clone().for_link(l.retries).control_copies.on(),
            })),
            "node": stats,
        })
    }

    pub(super) fn custody_json(&self) -> serde_json::Value {
        let u = self.custody.lock().map(|u| *u).unwrap_or_default();
        serde_json::json!({"blocks": u.blocks, "bytes": u.bytes, "limit_bytes": u.limit,
            "stored_total": u.stored_total, "full_total": u.full_events,
            "writes_timed": u.writes_timed, "write_wait_us": u.write_wait_us,
            "write_wait_max_us": u.write_wait_max_us})
    }

    pub(super) fn spool_json(&self) -> serde_json::Value {
        let u = self.custody.lock().map(|u| *u).unwrap_or_default();
        serde_json::json!({"full": u.spool_full || u.spool_write_failing, "full_total": u.spool_full_events,
            "incoming_bytes": u.incoming_bytes, "inbox_bytes": u.inbox_bytes,
            "disk_bytes": u.disk_bytes(), "limit_bytes": self.cfg.max_disk_bytes,
            "deliveries_timed": u.deliveries_timed, "deliver_us": u.deliver_us,
            "deliver_max_us": u.deliver_max_us})
    }

    pub(super) fn metrics_text(&self) -> String {
        let u = self.custody.lock().map(|u| *u).unwrap_or_default();
        let now = std::time::Instant::now();
        // Configured and discovered neighbours alike.
        let mut ids: Vec<u32> = self.cfg.neighbours.iter().map(|n| n.id).collect();
        ids.extend(self.discovered.keys().copied());
        ids.sort_unstable();
        ids.dedup();
        let reports = self.node.neighbour_reports();
        let neighbours = ids
            .into_iter()
            .map(|id| {
                let (rx_datagrams, rx_bytes) = self.rx_by_peer.get(&id).copied().unwrap_or((0, 0));
                let (tx_datagrams, tx_bytes) = self.tx_by_peer.get(&id).copied().unwrap_or((0, 0));
                let report = reports.iter().find(|r| r.id == id);
                crate::metrics::NeighbourSample {
                    id,
                    last_heard_s: self
                        .last_heard
                        .get(&id)
                        .map(|t| now.duration_since(*t).as_secs_f64()),
                    rx_datagrams,
                    rx_bytes,
                    tx_datagrams,
                    tx_bytes,
                    rtt_s: report.and_then(|r| r.rtt).map(|d| d.as_secs_f64()),
                    hello_quality: self.hello_windows.get(&id).map(|w| w.quality()),
                    data_retransmissions: report.map_or(0, |r| r.data_retransmissions),
                    control_loss: report.and_then(|r| r.control_loss),
                }
            })
            .collect();
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
            - self.clock.elapsed().as_secs_f64();
        crate::metrics::render(crate::metrics::Snapshot {
            custody: u,
            stats: self.node.stats(),
            counters: self.counters.clone(),
            flows_out: self.out.len() as u64,
            flows_in: self.inflows.len() as u64,
            storage_bytes: self.storage_bytes(),
            peers: self.auth.peers() as u64,
            neighbours,
            completions: self.completions.clone(),
            start_time_s: start,
            packet_payload_bytes: self.cfg.hop.packet_payload_bytes as u64,
        })
    }
}
