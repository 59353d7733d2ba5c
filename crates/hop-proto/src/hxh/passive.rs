//! §3.2 passive feedback: a node that overhears its next hop forward a packet of the flow
//! learns that its own transmission arrived, and the credits the next hop has now.

use hop_wire::hxh as wire;

use super::{HxhTransport, Role};
use crate::time::Instant;
use crate::FlowKey;

impl HxhTransport {
    /// Passive feedback (§3.2): our next hop sent packet `d.seq` of a flow we forward to it.
    /// It holds the packet, so our transmission of it succeeded, and its shim header carries
    /// the credits it has for the flow now.
    pub(super) fn on_forward_overheard(&mut self, now: Instant, key: FlowKey, d: &wire::Data<'_>) {
        let cfg = self.cfg.clone();
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        if !flow.fwd.passive || flow.fwd.synced_seq == Some(d.seq) {
            return;
        }
        flow.fwd.synced_seq = Some(d.seq);
        flow.fwd.sync_credits(d.credits, now);
        if let Role::Relay(rl) = &mut flow.role {
            rl.last_activity = now;
        }
        let mut implied = 0;
        let synced_sent_at = flow.fwd.inflight.get(&d.seq).map(|inf| inf.sent_at);
        let freed = match flow.fwd.inflight.remove(&d.seq) {
            Some(inf) => {
                flow.fwd
                    .delay_sample(&cfg, (now - inf.sent_at).as_secs_f64());
                // The next hop forwards its packets lowest sequence first, and the link
                // delivers ours in the order we sent them (802.11 retries a frame before the
                // next one). So the earlier packets we sent it before this one reached it
                // and left it already, though we did not overhear them leave.
                let sent = inf.sent_at;
                let before: Vec<u32> = flow
                    .fwd
                    .inflight
                    .range(..d.seq)
                    .filter(|(_, i)| i.sent_at <= sent)
                    .map(|(&s, _)| s)
                    .collect();
                for s in before {
                    flow.fwd.inflight.remove(&s);
                    implied += 1;
                }
                true
            }
            None => false,
        };
        // The credits are the next hop's when it sent this packet. What we sent to it after
        // this packet may still be on the way (in our interface and MAC queues) and is not
        // in them: count it against the pool, or a source that hands packets to its
        // interface faster than the air carries them overruns the next hop's buffer. Packets
        // that did arrive before the next hop sent this one are counted twice, which errs
        // on the side of the buffer.
        flow.fwd.sent_since_sync = flow
            .fwd
            .inflight
            .values()
            .filter(|i| match synced_sent_at {
                Some(t) => i.sent_at > t,
                None => true,
            })
            .count() as u32;
        self.bump("passive_syncs");
        if implied > 0 {
            *self.stats.extra.entry("passive_acks_implied").or_insert(0) += implied;
        }
        if freed {
            self.bump("passive_acks");
            self.maybe_credit_update(key);
        }
    }
}
