//! Outgoing flows: application bytes queued until the transport takes them.

use std::collections::VecDeque;

use bytes::Bytes;
use hop_proto::{FlowKey, NodeId};
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use super::cmd::FlowUpdate;
use super::Daemon;

pub(super) struct OutFlow {
    pub(super) updates: mpsc::UnboundedSender<FlowUpdate>,
    pub(super) pending: VecDeque<(Bytes, Option<oneshot::Sender<()>>)>,
    pub(super) bytes_accepted: u64,
    pub(super) to: NodeId,
    /// The application finished; `finish` is passed on once `pending` is empty.
    pub(super) finish: bool,
}

impl Daemon {
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
