//! Turn horizon: a receiver's turn (§3.5) that its block would hold too long at the pace it
//! has moved goes to the senders waiting for it (docs/design/hop.md#turn-horizon).

use super::*;

impl HopTransport {
    /// Release every turn whose block, at the rate its packets have arrived since the turn
    /// began, would need more than `turn_horizon` to complete, once the turn has lasted twice
    /// `withhold_timeout` (a rate measured over less says little), and only while another
    /// sender's BSYN waits for the turn. The block keeps what it has; its sender's next BSYN
    /// waits for the next turn, behind the senders that waited for this one.
    ///
    /// §3.5 ends a turn only when its block completes or its sender goes silent. A sender
    /// behind a link that loses most frames is never silent, since its BSYNs cross with link
    /// ARQ, yet its data barely moves. Every other sender of the receiver then waits for
    /// minutes. Not in the paper.
    pub(super) fn release_slow_turns(&mut self, now: Instant) -> bool {
        let horizon = self.cfg.turn_horizon.as_secs_f64();
        if horizon <= 0.0
            || !self
                .withholding
                .waiting
                .iter()
                .any(|w| w.reason == Withhold::AckWithholding)
        {
            return false;
        }
        let judged_after = self.cfg.withhold_timeout * 2;
        let mut slow = Vec::new();
        for (&(key, n), a) in &self.withholding.admitted {
            let age = now.saturating_duration_since(a.since);
            if age < judged_after || age.is_zero() {
                continue;
            }
            let Some(b) = self.flows.get(&key).and_then(|f| f.blocks.get(&n)) else {
                continue;
            };
            let held = b.have.count();
            let rate = f64::from(held.saturating_sub(a.held_at_start)) / age.as_secs_f64();
            let left = f64::from(b.geom.packets().saturating_sub(held));
            if left > rate * horizon {
                slow.push(((key, n), b.admitted_from));
            }
        }
        for (turn, from) in &slow {
            self.withholding.admitted.remove(turn);
            if from.is_some() {
                self.withholding.last_holder = *from;
            }
            self.extra("released_slow");
        }
        !slow.is_empty()
    }
}
