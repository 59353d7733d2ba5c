//! Rounds behind their data (not in the paper): a sender that has learnt that its BSYNs reach
//! a next hop behind the data sent before them says so in the BSYN; the next hop answers at
//! once, and the sender takes what the BACK lacks of the round as lost.
//!
//! A receiver whose BSYN names a round end it does not hold cannot tell a lost packet from
//! one still queued behind the BSYN (which on 802.11 travels in the voice queue and overtakes
//! the data, §3.6): it waits for the data to pause (`back_quiet`), and the sender then waits
//! a loss age before it gives the tail up. Over a link with one FIFO queue for control and
//! data (a wired or tunnel link, a daemon that writes both into one socket queue) the BSYN
//! comes behind all of the round's data, so a missing round end was lost: on such a link
//! that loses packets at random, every round whose last packet was lost paid both waits.
//!
//! Which kind a link is the sender learns from its next hop's BACKs: `END_HEARD`, on a round
//! whose BSYN left with packets of the round still queued ahead of it, says the round end had
//! arrived when the BSYN did (the BSYN came behind it); a BACK that holds the
//! round end without `END_HEARD` saw it arrive after the BSYN (overtaken), and a BACK that
//! reports duplicates shows a packet taken for lost that was only late. After
//! [`BEHIND_STREAK`] rounds in a row that came behind and none overtaken for
//! [`OVERTAKEN_MEMORY`], the sender marks its BSYNs `BEHIND`.

use super::*;

/// Rounds in a row whose BSYN came behind its round end before a sender trusts the link's
/// order: a link that reorders at all shows it within a few rounds with a backlog.
pub(super) const BEHIND_STREAK: u32 = 16;

/// How long one overtaken round (or duplicate) keeps a next hop's BSYNs unmarked: a link that
/// reorders under load does so again with the next burst, and a marked BSYN that overtakes
/// its data costs the packets still queued (sent again) and the time to learn it.
pub(super) const OVERTAKEN_MEMORY: Duration = Duration::from_secs(300);

/// What this node has learnt of the order in which its BSYNs and data reach each next hop.
#[derive(Debug, Default)]
pub(super) struct RoundOrder {
    peers: BTreeMap<NodeId, Order>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Order {
    /// Rounds in a row whose BSYN came behind its round end.
    streak: u32,
    /// When a round's end last arrived after its BSYN, or a duplicate was reported.
    overtaken_at: Option<Instant>,
}

impl RoundOrder {
    /// Whether this node's BSYNs to `to` come behind their data, as far as it has learnt.
    pub(super) fn behind(&self, cfg: &HopConfig, to: NodeId, now: Instant) -> bool {
        cfg.rounds_behind
            && self.peers.get(&to).is_some_and(|o| {
                o.streak >= BEHIND_STREAK
                    && o.overtaken_at
                        .is_none_or(|t| now.saturating_duration_since(t) >= OVERTAKEN_MEMORY)
            })
    }

    /// Learn from the BACK of `to` that answered a round whose BSYN named a round end:
    /// whether that end had arrived before the BSYN (`end_heard`), or after it
    /// (`overtaken`: held without `END_HEARD`, or duplicates reported).
    pub(super) fn learn(&mut self, to: NodeId, now: Instant, end_heard: bool, overtaken: bool) {
        let o = self.peers.entry(to).or_default();
        if overtaken {
            o.streak = 0;
            o.overtaken_at = Some(now);
        } else if end_heard {
            o.streak = o.streak.saturating_add(1);
        }
    }
}

/// The round end a transfer's BSYN names: the packet of the block handed to the link last
/// (None: nothing of the round in flight).
pub(super) fn round_end_of(x: &Transfer) -> Option<u32> {
    x.sent_seq
        .iter()
        .enumerate()
        .filter(|(_, s)| **s > 0)
        .max_by_key(|(_, s)| **s)
        .map(|(p, _)| p as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_is_trusted_after_a_streak_and_not_for_a_while_after_one_overtaking() {
        let cfg = HopConfig::default();
        let mut o = RoundOrder::default();
        let t0 = Instant::ZERO;
        for _ in 0..BEHIND_STREAK - 1 {
            o.learn(2, t0, true, false);
        }
        assert!(!o.behind(&cfg, 2, t0));
        o.learn(2, t0, true, false);
        assert!(o.behind(&cfg, 2, t0));
        assert!(!o.behind(&cfg, 3, t0), "per next hop");
        // A round without news (the end was lost) changes nothing.
        o.learn(2, t0, false, false);
        assert!(o.behind(&cfg, 2, t0));
        // One overtaking: not trusted again until a streak and the memory have passed.
        o.learn(2, t0, false, true);
        for _ in 0..BEHIND_STREAK {
            o.learn(2, t0, true, false);
        }
        assert!(!o.behind(&cfg, 2, t0 + OVERTAKEN_MEMORY / 2));
        assert!(o.behind(&cfg, 2, t0 + OVERTAKEN_MEMORY));
        assert!(!o.behind(&HopConfig::paper(), 2, t0 + OVERTAKEN_MEMORY));
    }
}
