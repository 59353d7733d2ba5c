//! §3.3 end-to-end reliability: the source's send buffer, the reverse ACK learnt from
//! downstream, the last hop's sync bit, explicit ACKs and NACKs forwarded upstream, and the
//! source's retransmission of what a NACK reports missing.

use hop_wire::hxh::{self as wire, Message};
use hop_wire::NodeId;

use super::per_hop::{Fwd, Pkt};
use super::{Flow, HxhConfig, HxhTransport, Role};
use crate::stream::sendbuf::SendBuffer;
use crate::time::Instant;
use crate::transport::Ctx;
use crate::{Event, FailReason, FlowKey};

/// Upper bound on the source retransmission timer backoff (`source_rto` x 2^n).
pub(super) const SOURCE_BACKOFF_MAX_EXP: u32 = 4;

#[derive(Debug)]
pub(super) struct Src {
    pub(super) buf: SendBuffer,
    pub(super) last_progress: Instant,
    pub(super) last_tail: Instant,
    pub(super) backoff: u32,
    pub(super) writable_pending: bool,
}

impl Src {
    /// Data the application handed over that is not yet acknowledged end to end.
    pub(super) fn owes(&self) -> bool {
        self.buf.unacked_sent().next().is_some() || self.buf.has_pending_new()
    }
    /// The source gives up on a flow that owes data and made no progress for `give_up`.
    pub(super) fn gives_up(
        &self,
        cfg: &HxhConfig,
        ctx: &Ctx<'_>,
        dst: NodeId,
    ) -> Option<FailReason> {
        if !(self.owes() && self.last_progress + cfg.give_up <= ctx.now) {
            return None;
        }
        Some(if ctx.routing.next_hop(dst).is_none() {
            FailReason::NoRoute
        } else {
            FailReason::Timeout
        })
    }

    /// Source retransmission timer: when nothing of the flow is queued or in flight here and
    /// the first unacknowledged packet waited `source_rto` (doubled per expiry), resend it
    /// asking for an explicit ACK (§3.3.2).
    pub(super) fn retransmit_tail(&mut self, cfg: &HxhConfig, now: Instant, fwd: &mut Fwd) {
        let Some(first) = self.buf.unacked_sent().next() else {
            return;
        };
        let idle = fwd.queue.is_empty() && fwd.inflight.is_empty();
        let tail = self.last_tail + cfg.source_rto.saturating_mul(1u32 << self.backoff.min(30));
        if !(idle && tail <= now) {
            return;
        }
        if let Some((payload, fin)) = self.buf.get(first) {
            let mut flags = wire::DATA_RETX | wire::DATA_ACK_REQ;
            if fin {
                flags |= wire::DATA_FIN;
            }
            fwd.queue.insert(
                first,
                Pkt {
                    seq: first,
                    flags,
                    payload,
                    tries: 0,
                },
            );
        }
        self.last_tail = now;
        self.backoff = (self.backoff + 1).min(SOURCE_BACKOFF_MAX_EXP);
    }
}
impl Flow {
    /// The flags of a data packet about to leave. The last packet to leave the source's
    /// buffer asks for an explicit ACK (§3.3.2; the packet keeps the flag for its retries),
    /// and the last hop sets the sync bit while it is out of sync with the destination
    /// (§3.3.1).
    pub(super) fn data_flags(&mut self, pkt: &mut Pkt, next_hop: NodeId) -> u8 {
        if let Role::Source(s) = &mut self.role {
            if self.fwd.queue.is_empty() && !s.buf.has_new() {
                pkt.flags |= wire::DATA_ACK_REQ;
            }
        }
        let mut flags = pkt.flags;
        if next_hop == self.dst {
            self.fwd.highest_tx = Some(self.fwd.highest_tx.map_or(pkt.seq, |h| h.max(pkt.seq)));
            if !self.fwd.in_sync {
                flags |= wire::DATA_SYNC;
            }
        }
        flags
    }
}

impl HxhTransport {
    pub(super) fn is_last_hop(flow: &Flow) -> bool {
        flow.fwd.next_hop == Some(flow.dst)
    }

    /// §3.3.1: a gap is a packet acknowledged by the destination while an earlier one is
    /// neither acknowledged nor held here.
    pub(super) fn last_hop_check_gap(flow: &mut Flow) -> bool {
        if flow.fwd.in_sync && !flow.fwd.delivered.is_empty() && !flow.fwd.holds(flow.rev_ack) {
            flow.fwd.in_sync = false;
            return true;
        }
        false
    }

    /// A new reverse ACK value learnt from downstream or the destination.
    pub(super) fn learn_rev_ack(&mut self, now: Instant, key: FlowKey, cum: u32) {
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        if cum <= flow.rev_ack {
            return;
        }
        flow.rev_ack = cum;
        let r = cum;
        flow.fwd.queue.retain(|&s, _| s >= r);
        flow.fwd.delivered.retain(|&s| s >= r);
        if flow.fwd.highest_tx.is_none_or(|h| r > h) {
            flow.fwd.in_sync = true;
        }
        let mut done = None;
        match &mut flow.role {
            Role::Relay(rl) => rl.seen.retain(|&s| s >= r),
            Role::Source(s) => {
                if s.buf.ack(r) {
                    s.last_progress = now;
                    s.last_tail = now;
                    s.backoff = 0;
                }
                if s.buf.complete() {
                    done = Some(s.buf.total());
                } else if s.writable_pending && s.buf.has_room() {
                    s.writable_pending = false;
                    self.events.push_back(Event::Writable { flow: key });
                }
            }
            Role::Dest(_) => {}
        }
        if let Some(bytes) = done {
            self.flows.remove(&key);
            self.events
                .push_back(Event::SendComplete { flow: key, bytes });
        }
    }

    /// Where to send a message that travels upstream toward the source of `key`.
    pub(super) fn upstream_of(&self, ctx: &Ctx<'_>, key: FlowKey) -> Option<NodeId> {
        match self.flows.get(&key).map(|f| &f.role) {
            Some(Role::Relay(rl)) if rl.upstream.is_some() => rl.upstream,
            _ => ctx.routing.next_hop(key.src),
        }
    }

    pub(super) fn on_ack(&mut self, ctx: &mut Ctx<'_>, a: wire::Ack) {
        let key = FlowKey {
            src: a.src,
            id: a.id,
        };
        self.touch(ctx.now, key);
        // §3.3.2: intermediate nodes update their ACK state from explicit ACKs.
        self.learn_rev_ack(ctx.now, key, a.cum);
        if a.src != ctx.local {
            if let Some(up) = self.upstream_of(ctx, key) {
                self.push_control(up, Message::Ack(a));
            }
        }
    }

    pub(super) fn on_nack(&mut self, ctx: &mut Ctx<'_>, n: wire::Nack) {
        let key = FlowKey {
            src: n.src,
            id: n.id,
        };
        self.touch(ctx.now, key);
        self.learn_rev_ack(ctx.now, key, n.cum);
        if n.src != ctx.local {
            if let Some(up) = self.upstream_of(ctx, key) {
                self.push_control(up, Message::Nack(n));
            }
            return;
        }
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        let Role::Source(s) = &mut flow.role else {
            return;
        };
        let mut count = 0u64;
        for &(start, end) in &n.ranges {
            let end = end.min(s.buf.next_new());
            for seq in start.max(flow.rev_ack)..end {
                if flow.fwd.holds(seq) {
                    continue;
                }
                if let Some((payload, fin)) = s.buf.get(seq) {
                    let mut flags = wire::DATA_RETX;
                    if fin {
                        flags |= wire::DATA_FIN;
                    }
                    flow.fwd.queue.insert(
                        seq,
                        Pkt {
                            seq,
                            flags,
                            payload,
                            tries: 0,
                        },
                    );
                    count += 1;
                }
            }
        }
        *self.stats.extra.entry("e2e_retransmissions").or_insert(0) += count;
    }
}
