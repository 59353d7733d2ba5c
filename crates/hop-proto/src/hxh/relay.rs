//! A relay's per-flow state and its reception of a data packet (§3.1, §3.2).

use std::collections::BTreeSet;

use bytes::Bytes;
use hop_wire::hxh::{self as wire, Message};
use hop_wire::NodeId;

use super::per_hop::{Fwd, Pkt};
use super::{Flow, HxhConfig, HxhTransport, Role};
use crate::time::Instant;
use crate::transport::Ctx;
use crate::FlowKey;

/// Sequence numbers a relay remembers having forwarded, to drop duplicates.
pub(super) const SEEN_MAX: usize = 4096;

#[derive(Debug)]
pub(super) struct Relay {
    pub(super) upstream: Option<NodeId>,
    pub(super) seen: BTreeSet<u32>,
    pub(super) last_adv_sent: u16,
    pub(super) last_activity: Instant,
}
impl Relay {
    /// A relay forgets a flow that saw no activity for `flow_timeout`.
    pub(super) fn idle_past_timeout(&self, cfg: &HxhConfig, now: Instant) -> bool {
        self.last_activity + cfg.flow_timeout <= now
    }
}

impl HxhTransport {
    pub(super) fn on_data_at_relay(
        &mut self,
        ctx: &mut Ctx<'_>,
        from: NodeId,
        key: FlowKey,
        d: wire::Data<'_>,
    ) {
        let now = ctx.now;
        if !self.flows.contains_key(&key) {
            if self.flows.len() >= self.cfg.max_flows {
                self.bump("flow_limit_drops");
                return;
            }
            self.flows.insert(
                key,
                Flow {
                    dst: d.dst,
                    rev_ack: 0,
                    fwd: Fwd::new(&self.cfg, now, self.vclock),
                    role: Role::Relay(Relay {
                        upstream: Some(from),
                        seen: BTreeSet::new(),
                        last_adv_sent: self.cfg.buffer_packets,
                        last_activity: now,
                    }),
                },
            );
        }
        let cfg = &self.cfg;
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        let Role::Relay(rl) = &mut flow.role else {
            // A packet of a flow this node sources or terminates, arriving as relay traffic.
            return;
        };
        rl.upstream = Some(from);
        rl.last_activity = now;
        let retx = d.flags & wire::DATA_RETX != 0;
        let dup =
            d.seq < flow.rev_ack || flow.fwd.holds(d.seq) || (!retx && rl.seen.contains(&d.seq));
        let mut flags = 0;
        if dup {
            *self.stats.extra.entry("duplicates").or_insert(0) += 1;
        } else if flow.fwd.held() >= usize::from(cfg.buffer_packets + cfg.reserve_packets) {
            flags |= wire::HOPACK_REFUSED;
            *self.stats.extra.entry("refused").or_insert(0) += 1;
        } else {
            flow.fwd.queue.insert(
                d.seq,
                Pkt {
                    seq: d.seq,
                    flags: d.flags & (wire::DATA_ACK_REQ | wire::DATA_FIN | wire::DATA_RETX),
                    payload: Bytes::copy_from_slice(d.payload),
                    tries: 0,
                },
            );
            rl.seen.insert(d.seq);
            while rl.seen.len() > SEEN_MAX {
                rl.seen.pop_first();
            }
        }
        let credits = Self::advertised(cfg, &flow.fwd);
        if cfg.passive_feedback && flags == 0 && !dup {
            // Passive feedback (§3.2): the upstream node learns that the packet arrived, and
            // our credits, when it overhears us forward it.
            return;
        }
        rl.last_adv_sent = credits;
        let ack = wire::HopAck {
            flags,
            credits,
            src: key.src,
            id: key.id,
            seq: d.seq,
            rev_ack: flow.rev_ack,
        };
        self.push_control(from, Message::HopAck(ack));
    }

    pub(super) fn touch(&mut self, now: Instant, key: FlowKey) {
        if let Some(Flow {
            role: Role::Relay(rl),
            ..
        }) = self.flows.get_mut(&key)
        {
            rl.last_activity = now;
        }
    }
}
