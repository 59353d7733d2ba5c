//! The node's interface queue: one drop-tail FIFO that every outgoing datagram of the
//! transport goes through, forwarded or this node's own. It models the kernel's queue in
//! front of the radio (qdisc and driver queue): a relay that receives faster than its
//! link drains drops at the tail, and those drops are the congestion signal TCP reacts to.

use hop_wire::tcp::{self as wire, Message};
use hop_wire::NodeId;

use super::TcpTransport;
use crate::transport::Ctx;
use crate::FlowKey;

/// A datagram waiting in the FIFO.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) next_hop: NodeId,
    pub(super) body: Vec<u8>,
    /// Counted under this name in `sent_by_type` when it leaves.
    pub(super) kind: &'static str,
}

impl TcpTransport {
    fn queue_full(&self) -> bool {
        self.out.len() >= self.cfg.queue_limit_packets
    }

    /// Queue a datagram toward `toward`; drop it when there is no route or no room
    /// (drop-tail).
    pub(super) fn enqueue(
        &mut self,
        ctx: &Ctx<'_>,
        toward: NodeId,
        body: Vec<u8>,
        kind: &'static str,
    ) {
        let Some(next_hop) = ctx.routing.next_hop(toward) else {
            self.bump("no_route_drops", 1);
            return;
        };
        if self.queue_full() {
            self.bump("queue_drops", 1);
            return;
        }
        self.out.push_back(Queued {
            next_hop,
            body,
            kind,
        });
    }

    /// A segment (toward `dst`) or an ACK (toward the flow's source) passing through: it
    /// goes on unchanged. A segment that came back to its own source is a routing loop and
    /// is dropped.
    pub(super) fn forward(&mut self, ctx: &Ctx<'_>, src: NodeId, toward: NodeId, body: &[u8]) {
        if src == ctx.local && toward != ctx.local {
            self.bump("loop_drops", 1);
            return;
        }
        self.enqueue(ctx, toward, body.to_vec(), "forwarded");
    }

    /// Move the segments the local flows' windows allow into the FIFO, one per flow in
    /// turn, while it has room. A full FIFO holds a local flow back rather than dropping its
    /// segment (the kernel stops a socket whose packets fill the queue in the same way).
    pub(super) fn fill(&mut self, ctx: &Ctx<'_>) {
        let keys: Vec<FlowKey> = self.senders.keys().copied().collect();
        loop {
            let mut progressed = false;
            for &key in &keys {
                if self.queue_full() {
                    return;
                }
                let Some(s) = self.senders.get_mut(&key) else {
                    continue;
                };
                let Some(next_hop) = ctx.routing.next_hop(s.dst) else {
                    continue;
                };
                let Some(seg) = s.next_segment(ctx.now, &self.cfg) else {
                    continue;
                };
                let body = Message::Segment(wire::Segment {
                    flags: if seg.fin { wire::FLAG_FIN } else { 0 },
                    src: key.src,
                    id: key.id,
                    dst: s.dst,
                    seq: seg.seq,
                    payload: &seg.payload,
                })
                .to_vec();
                if seg.retransmission {
                    self.stats.data_retransmissions += 1;
                }
                self.out.push_back(Queued {
                    next_hop,
                    body,
                    kind: "data",
                });
                progressed = true;
            }
            if !progressed {
                return;
            }
        }
    }
}
