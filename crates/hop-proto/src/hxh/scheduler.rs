//! §3.1 per-flow fair queueing: which flows may send now, and the packet each sends next.

use hop_wire::hxh as wire;

use super::per_hop::Pkt;
use super::{Flow, HxhConfig, HxhTransport, Role};
use crate::transport::Ctx;
use crate::FlowKey;

impl HxhTransport {
    /// Per-flow fair queueing (§3.1): the eligible flow with the smallest start tag, with
    /// that tag.
    pub(super) fn next_flow(&mut self, ctx: &Ctx<'_>) -> Option<(u64, FlowKey)> {
        let cfg = &self.cfg;
        let vclock = self.vclock;
        let mut best: Option<(u64, FlowKey)> = None;
        for (&key, flow) in self.flows.iter_mut() {
            if Self::eligible(cfg, ctx, flow) {
                let start = flow.fwd.vtime.max(vclock);
                if best.is_none_or(|(b, _)| start < b) {
                    best = Some((start, key));
                }
            }
        }
        best
    }
    /// Does this flow have a packet it could send now?
    pub(super) fn has_packet(flow: &mut Flow) -> bool {
        if !flow.fwd.queue.is_empty() {
            return true;
        }
        match &mut flow.role {
            Role::Source(s) => s.buf.has_new(),
            _ => false,
        }
    }

    pub(super) fn eligible(cfg: &HxhConfig, ctx: &Ctx<'_>, flow: &mut Flow) -> bool {
        if matches!(flow.role, Role::Dest(_)) {
            return false;
        }
        let nh = ctx.routing.next_hop(flow.dst);
        if nh != flow.fwd.next_hop {
            // New or changed route: fresh credit state for the new neighbour (§3.1).
            flow.fwd.next_hop = nh;
            flow.fwd.adv = cfg.buffer_packets;
            flow.fwd.in_sync = true;
            flow.fwd.delivered.clear();
            flow.fwd.last_feedback = ctx.now;
            flow.fwd.sent_since_sync = 0;
        }
        flow.fwd.passive = cfg.passive_feedback && nh.is_some() && nh != Some(flow.dst);
        if nh.is_none() || !Self::has_packet(flow) {
            return false;
        }
        flow.fwd.pool() > 0 || flow.fwd.probe_ready
    }

    pub(super) fn take_packet(flow: &mut Flow) -> Option<Pkt> {
        if let Some((_, p)) = flow.fwd.queue.pop_first() {
            return Some(p);
        }
        if let Role::Source(s) = &mut flow.role {
            let (seq, payload, fin) = s.buf.take_new()?;
            return Some(Pkt {
                seq,
                flags: if fin { wire::DATA_FIN } else { 0 },
                payload,
                tries: 0,
            });
        }
        None
    }
}
