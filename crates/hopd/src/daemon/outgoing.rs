//! Outgoing flows: application bytes queued until the transport takes them.

use std::collections::VecDeque;

use bytes::Bytes;
use hop_proto::{FlowKey, NodeId};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use super::cmd::FlowUpdate;
use super::Daemon;

pub(super) struct OutFlow {
    pub(super) updates: mpsc::UnboundedSender<FlowUpdate>,
    pub(super) pending: VecDeque<(Bytes, Option<oneshot::Sender<()>>)>,
    pub(super) bytes_accepted: u64,
    pub(super) to: NodeId,
    /// The application finished; `finish` is passed on once `pending` is empty.
    pub(super) finish: bool,
    pub(super) name: String,
    pub(super) size: u64,
    pub(super) opened: std::time::Instant,
    /// The client left the flow to the daemon.
    pub(super) detached: bool,
    /// The end of its lifetime.
    pub(super) expires: Option<std::time::Instant>,
    /// Flow bytes (header, file, hash) the destination acknowledged end to end.
    pub(super) bytes_acked: u64,
    /// A detached transfer kept on disk until it ends (persist.rs).
    pub(super) persisted: Option<super::persist::Persisted>,
    /// The destination said its storage is full; cleared by its next acknowledgement.
    pub(super) dest_full: bool,
    pub(super) priority: crate::api::Priority,
}

impl Daemon {
    /// An outgoing flow ended (completed, failed, cancelled): its state and, if it was kept
    /// on disk, its files go.
    pub(super) fn end_outgoing(&mut self, flow: FlowKey) -> Option<OutFlow> {
        let mut f = self.out.remove(&flow)?;
        if let Some(p) = f.persisted.take() {
            let earlier = p.forget();
            self.abort_earlier_flows(&earlier, f.to);
        }
        Some(f)
    }

    /// Abort along their path the flows of a transfer that a restart superseded
    /// (persist.rs): the nodes downstream free what they hold of them.
    pub(super) fn abort_earlier_flows(&mut self, flows: &[FlowKey], to: NodeId) {
        let now = self.now();
        for &flow in flows {
            match self.node.abort_earlier(now, self.transport_id, flow, to) {
                Ok(()) => {
                    info!(%flow, to, "earlier flow of a resumed transfer aborted along its path")
                }
                Err(e) => {
                    warn!(%flow, error = %e, "cannot abort an earlier flow of a resumed transfer")
                }
            }
        }
    }

    /// The outgoing flows, oldest first, for `hop list`.
    pub(super) fn outgoing_list(&self) -> Vec<crate::api::OutgoingFlow> {
        let now = std::time::Instant::now();
        let mut v: Vec<_> = self
            .out
            .iter()
            .map(|(k, f)| crate::api::OutgoingFlow {
                flow: k.to_string(),
                to: f.to,
                name: f.name.clone(),
                size: f.size,
                bytes_accepted: f.bytes_accepted,
                bytes_acked: f.bytes_acked,
                age_s: now.duration_since(f.opened).as_secs(),
                expires_in_s: f
                    .expires
                    .map(|e| e.saturating_duration_since(now).as_secs()),
                attached: !f.detached && !f.updates.is_closed(),
                priority: f.priority,
            })
            .collect();
        v.sort_by(|a, b| b.age_s.cmp(&a.age_s).then_with(|| a.flow.cmp(&b.flow)));
        v
    }

    /// What this node holds of other nodes' transfers: relayed flows (every flow with state
    /// here that is neither sent nor received here) and the custody store.
    pub(super) fn held_here(&self) -> crate::api::HeldHere {
        let flows: u64 = self
            .node
            .stats()
            .transports
            .iter()
            .map(|(_, t)| t.flows)
            .sum();
        let own = (self.out.len() + self.inflows.len()) as u64;
        let u = self.custody.lock().map(|u| *u).unwrap_or_default();
        crate::api::HeldHere {
            flows: flows.saturating_sub(own),
            blocks: u.blocks,
            bytes: u.bytes,
        }
    }

    /// Abort an outgoing flow by its printed id (`hop cancel`); its client, if one waits,
    /// hears that it was cancelled.
    pub(super) fn cancel(&mut self, flow: &str) -> Result<(), String> {
        let Some(key) = self.out.keys().copied().find(|k| k.to_string() == flow) else {
            return Err(format!(
                "no outgoing flow {flow} on this node (`hop list` shows them)"
            ));
        };
        let f = self.end_outgoing(key).expect("found above");
        let now = self.now();
        let _ = self.node.abort(now, key);
        info!(%key, to = f.to, name = %f.name, "flow cancelled");
        self.event(serde_json::json!({"event": "cancelled", "flow": key.to_string(), "to": f.to, "name": f.name}));
        self.counters.flows_cancelled += 1;
        let _ = f.updates.send(FlowUpdate::Failed {
            reason: "cancelled (`hop cancel`)".into(),
        });
        Ok(())
    }

    /// Hand queued application bytes to the transport, then the finish once all are taken.
    pub(super) fn feed(&mut self, flow: FlowKey) {
        let now = self.now();
        let Some(f) = self.out.get_mut(&flow) else {
            return;
        };
        while let Some((data, _)) = f.pending.front_mut() {
            match self.node.send(now, flow, data.clone()) {
                Ok(n) => {
                    f.bytes_accepted += n as u64;
                    if n >= data.len() {
                        if let Some((_, Some(done))) = f.pending.pop_front() {
                            let _ = done.send(());
                        }
                    } else {
                        *data = data.slice(n..);
                        return;
                    }
                }
                Err(e) => {
                    warn!(%flow, error = %e, "send rejected");
                    return;
                }
            }
        }
        if std::mem::take(&mut f.finish) {
            if let Err(e) = self.node.finish(now, flow) {
                warn!(%flow, error = %e, "finish failed");
            }
        }
    }
}

impl Daemon {
    /// The core found next hop `id` silent: the operator hears what to check, and the
    /// clients whose transfers wait for it hear why.
    pub(super) fn neighbour_silent(&mut self, id: NodeId, flows: &[FlowKey]) {
        let addr = self
            .addrs
            .get(&id)
            .map_or("no address".to_string(), |a| a.to_string());
        let heard = self
            .last_heard
            .get(&id)
            .map_or("never heard".to_string(), |t| {
                format!("last heard {} s ago", t.elapsed().as_secs())
            });
        warn!(
            neighbour = id,
            %addr,
            transfers = flows.len(),
            "next hop answers nothing ({heard}); transfers through it wait. Check that its hopd \
             runs, its address and UDP port in [[neighbours]], firewalls, and that both nodes \
             have the same [security] mesh_key (its `hop status` counts auth_failures)"
        );
        let reason = format!("next hop {id} ({addr}) answers nothing, {heard}; waiting for it");
        for k in flows {
            if let Some(f) = self.out.get(k) {
                let _ = f.updates.send(FlowUpdate::Waiting {
                    reason: Some(reason.clone()),
                });
            }
        }
    }

    /// The destination of `flow` holds its next block but has no room to deliver it: the
    /// sender and the operator hear why the transfer stalls, once per stall.
    pub(super) fn destination_full(&mut self, flow: FlowKey) {
        let Some(f) = self.out.get_mut(&flow) else {
            return;
        };
        if std::mem::replace(&mut f.dest_full, true) {
            return;
        }
        warn!(
            %flow,
            to = f.to,
            name = %f.name,
            "the destination's storage is full: the transfer waits until its applications take \
             files (`hop recv` there) or its operator frees room (`[storage] max_disk_bytes`, disk)"
        );
        let reason = format!(
            "destination {}'s storage is full; waiting until it has room (its receivers take \
             files, or its operator frees space)",
            f.to
        );
        let _ = f.updates.send(FlowUpdate::Waiting {
            reason: Some(reason),
        });
    }

    pub(super) fn neighbour_returned(&mut self, id: NodeId) {
        info!(
            neighbour = id,
            "next hop answers again; waiting transfers resume"
        );
        for f in self.out.values() {
            let _ = f.updates.send(FlowUpdate::Waiting { reason: None });
        }
    }
}
