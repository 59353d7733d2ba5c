//! §3.2 credit-based flow control: the credit pool a next hop advertised, the credits this
//! node advertises upstream, credit updates, and the stall timer that probes a blocked flow.

use std::time::Duration;

use hop_wire::hxh::{self as wire, Message};
use hop_wire::NodeId;

use super::per_hop::Fwd;
use super::{duration_from_secs, Flow, HxhConfig, HxhTransport, Role};
use crate::time::Instant;
use crate::FlowKey;

impl Fwd {
    pub(super) fn pool(&self) -> i64 {
        let used = if self.passive {
            self.sent_since_sync as usize
        } else {
            self.inflight.len()
        };
        i64::from(self.adv) - used as i64
    }

    /// Credits the next hop advertised just now (a hop ack, a credit update, or with passive
    /// feedback one of its overheard transmissions).
    pub(super) fn sync_credits(&mut self, credits: u16, now: Instant) {
        self.adv = credits;
        self.sent_since_sync = 0;
        self.last_feedback = now;
        self.probe_ready = false;
    }

    pub(super) fn stall_after(&self, cfg: &HxhConfig) -> Duration {
        duration_from_secs(self.hop_delay * f64::from(cfg.stall_multiplier)).max(cfg.hop_rto_min)
    }
    /// A data packet left for the next hop: it uses a credit, and if it was a probe or used
    /// the last credit, the stall timer starts now.
    pub(super) fn note_sent(&mut self, probe: bool, now: Instant) {
        if probe {
            self.probe_ready = false;
        }
        let pool_before = self.pool();
        self.sent_since_sync = self.sent_since_sync.saturating_add(1);
        if probe || pool_before <= 1 {
            // This send exhausts the credits (or is a probe): the stall timer starts now.
            self.stall_clock = now;
        }
    }
}

impl Flow {
    /// The credits a data packet carries. A relay advertises its free buffer (§3.2), counting
    /// the packet being sent as still its own (in flight) until the next hop has it; a source
    /// has no upstream node and advertises its whole buffer.
    pub(super) fn credits_to_advertise(&mut self, cfg: &HxhConfig) -> u16 {
        match &mut self.role {
            Role::Relay(rl) => {
                let c = cfg
                    .buffer_packets
                    .saturating_sub(self.fwd.held() as u16 + 1);
                if cfg.passive_feedback {
                    // The upstream node overhears this advertisement (§3.2).
                    rl.last_adv_sent = c;
                }
                c
            }
            _ => cfg.buffer_packets,
        }
    }
}

impl HxhTransport {
    /// Credits this node advertises upstream for a relayed flow (§3.2, under-reported).
    pub(super) fn advertised(cfg: &HxhConfig, fwd: &Fwd) -> u16 {
        cfg.buffer_packets.saturating_sub(fwd.held() as u16)
    }

    /// A relay whose last advertisement was zero tells its upstream when room appears.
    pub(super) fn maybe_credit_update(&mut self, key: FlowKey) {
        let cfg = &self.cfg;
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        let credits = Self::advertised(cfg, &flow.fwd);
        // With passive feedback our next transmission of the flow carries the credits; a
        // message is needed only if none is coming (nothing queued, or no credits downstream).
        let will_send = !flow.fwd.queue.is_empty() && flow.fwd.pool() > 0;
        let Role::Relay(rl) = &mut flow.role else {
            return;
        };
        if rl.last_adv_sent == 0 && credits > 0 && !(cfg.passive_feedback && will_send) {
            if let Some(up) = rl.upstream {
                rl.last_adv_sent = credits;
                let msg = Message::Credit(wire::Credit {
                    flags: 0,
                    credits,
                    src: key.src,
                    id: key.id,
                    rev_ack: flow.rev_ack,
                });
                self.push_control(up, msg);
            }
        }
    }

    pub(super) fn on_credit(&mut self, now: Instant, from: NodeId, c: wire::Credit) {
        let key = FlowKey {
            src: c.src,
            id: c.id,
        };
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        if matches!(flow.role, Role::Dest(_)) || flow.fwd.next_hop != Some(from) {
            return;
        }
        flow.fwd.sync_credits(c.credits, now);
        if let Role::Relay(rl) = &mut flow.role {
            rl.last_activity = now;
        }
        if !Self::is_last_hop(flow) {
            self.learn_rev_ack(now, key, c.rev_ack);
        }
    }
    /// §3.2: a flow with packets waiting and no credits is probed once the stall timer
    /// (5x the EWMA of previous delays) runs out. Returns whether the probe was armed now.
    pub(super) fn stall_probe_due(cfg: &HxhConfig, now: Instant, flow: &mut Flow) -> bool {
        let waiting = Self::has_packet(flow);
        if waiting
            && flow.fwd.pool() <= 0
            && !flow.fwd.probe_ready
            && flow.fwd.last_feedback.max(flow.fwd.stall_clock) + flow.fwd.stall_after(cfg) <= now
        {
            flow.fwd.probe_ready = true;
            return true;
        }
        false
    }
}
