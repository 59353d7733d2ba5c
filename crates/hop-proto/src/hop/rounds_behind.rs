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
//! reports duplicates shows a packet taken for lost that was only late. The sender keeps a
//! debt of rounds per next hop: it starts at [`BEHIND_STREAK`], each round that came behind
//! pays one off, and each overtaken round adds [`BEHIND_STREAK`] (up to [`MAX_DEBT`]). With
//! no debt it marks its BSYNs `BEHIND`. Over a link the runtime says does not retry control
//! frames (a wire, a veth, a tunnel: `link_retries = false`, which mostly keep one queue for
//! control and data) the debt starts at [`WIRE_STREAK`] instead: until trust each round whose
//! end was lost waits for the data to pause (`back_quiet`, 10 ms) or for the BSYN timer, and
//! a small file's rounds all came before a streak of 16
//! (docs/notebook/2026-12-04-copies-before-the-loss-is-known.md). Such a link that does
//! overtake (802.11 without retries, whose BSYNs ride the voice queue) shows it within its
//! first rounds with a backlog and owes a full streak from then on. So a link whose BSYNs
//! overtake their data in more than one round in 17 (802.11's voice queue, §3.6, does in
//! most rounds with a backlog) is
//! never trusted, while one that reorders a rare round (a wired link, a tunnel or a veth on
//! a busy host) costs 16 rounds unmarked each time, not the rest of the transfer: at 30 %
//! loss an unmarked round whose end was lost waits for the data to pause and then a loss
//! age, a marked one that overtakes costs the packets queued behind it, sent again.

use super::*;

/// Rounds whose BSYN came behind its round end before a sender trusts the link's order, and
/// the rounds one overtaken round costs: a link that reorders at all shows it within a few
/// rounds with a backlog.
pub(super) const BEHIND_STREAK: u32 = 16;

/// Rounds in order before a sender trusts a link that does not retry control frames (a
/// wire, a veth, a tunnel: `link_retries = false`). Such a link mostly keeps one queue for
/// control and data, and the first rounds are the ones a small transfer has; an 802.11 link
/// without retries whose BSYNs overtake (the lab's §5.1.2) shows it within these.
pub(super) const WIRE_STREAK: u32 = 2;

/// The most rounds a next hop's overtakings can owe: after a run of them (a link that
/// reorders under load, then stops) trust comes back within this many rounds in order.
pub(super) const MAX_DEBT: u32 = 16 * BEHIND_STREAK;

/// What this node has learnt of the order in which its BSYNs and data reach each next hop.
#[derive(Debug, Default)]
pub(super) struct RoundOrder {
    peers: BTreeMap<NodeId, Order>,
}

#[derive(Debug, Clone, Copy)]
struct Order {
    /// Rounds in order still owed before the BSYNs are marked.
    debt: u32,
}

/// The debt a next hop starts with: [`WIRE_STREAK`] over a link that does not retry control
/// frames, which is mostly a wire whose control and data leave one queue; a full streak
/// elsewhere (802.11, whose BSYNs ride the voice queue, or a link the runtime did not name).
fn initial_debt(cfg: &HopConfig) -> u32 {
    if cfg.link_retries == Some(false) {
        WIRE_STREAK
    } else {
        BEHIND_STREAK
    }
}

impl RoundOrder {
    /// Whether this node's BSYNs to `to` come behind their data, as far as it has learnt.
    pub(super) fn behind(&self, cfg: &HopConfig, to: NodeId) -> bool {
        let debt = self.peers.get(&to).map_or(initial_debt(cfg), |o| o.debt);
        cfg.rounds_behind && debt == 0
    }

    /// Learn from the BACK of `to` that answered a round whose BSYN named a round end:
    /// whether that end had arrived before the BSYN (`end_heard`), or after it
    /// (`overtaken`: held without `END_HEARD`, or duplicates reported).
    pub(super) fn learn(&mut self, cfg: &HopConfig, to: NodeId, end_heard: bool, overtaken: bool) {
        let o = self.peers.entry(to).or_insert(Order {
            debt: initial_debt(cfg),
        });
        if overtaken {
            o.debt = (o.debt + BEHIND_STREAK).min(MAX_DEBT);
        } else if end_heard {
            o.debt = o.debt.saturating_sub(1);
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

    /// `rounds` rounds to next hop 2 that came behind their end.
    fn in_order(o: &mut RoundOrder, rounds: u32) {
        for _ in 0..rounds {
            o.learn(&HopConfig::default(), 2, true, false);
        }
    }

    #[test]
    fn a_link_is_trusted_after_a_streak_and_a_rare_overtaking_costs_a_streak() {
        let cfg = HopConfig::default();
        let mut o = RoundOrder::default();
        in_order(&mut o, BEHIND_STREAK - 1);
        assert!(!o.behind(&cfg, 2));
        in_order(&mut o, 1);
        assert!(o.behind(&cfg, 2));
        assert!(!o.behind(&cfg, 3), "per next hop");
        // A round without news (the end was lost) changes nothing.
        o.learn(&cfg, 2, false, false);
        assert!(o.behind(&cfg, 2));
        // One overtaking: unmarked for a streak of rounds in order, then marked again.
        o.learn(&cfg, 2, false, true);
        for _ in 0..BEHIND_STREAK - 1 {
            o.learn(&cfg, 2, true, false);
            assert!(!o.behind(&cfg, 2));
        }
        o.learn(&cfg, 2, true, false);
        assert!(o.behind(&cfg, 2));
        assert!(!o.behind(&HopConfig::paper(), 2));
    }

    #[test]
    fn a_link_that_overtakes_one_round_in_sixteen_is_never_trusted() {
        let cfg = HopConfig::default();
        let mut o = RoundOrder::default();
        for r in 0..10 * MAX_DEBT {
            o.learn(&cfg, 2, r % 16 != 0, r % 16 == 0);
            assert!(!o.behind(&cfg, 2), "round {r}");
        }
        // One in 32: trusted for stretches between its overtakings.
        let mut o = RoundOrder::default();
        let marked = (0..10 * MAX_DEBT)
            .filter(|r| {
                o.learn(&cfg, 2, r % 32 != 0, r % 32 == 0);
                o.behind(&cfg, 2)
            })
            .count();
        assert!(marked > (10 * MAX_DEBT as usize) / 3, "marked {marked}");
    }

    #[test]
    fn after_a_run_of_overtakings_trust_returns_within_the_debt_cap() {
        let cfg = HopConfig::default();
        let mut o = RoundOrder::default();
        for _ in 0..1000 {
            o.learn(&cfg, 2, false, true);
        }
        in_order(&mut o, MAX_DEBT - 1);
        assert!(!o.behind(&cfg, 2));
        in_order(&mut o, 1);
        assert!(o.behind(&cfg, 2));
    }

    #[test]
    fn over_a_link_that_does_not_retry_control_a_short_streak_earns_trust() {
        // A wire or a veth: control and data mostly leave one queue; two rounds in order
        // earn trust, and an overtaking still costs a full streak.
        let wire = HopConfig::default().for_link(false);
        let mut o = RoundOrder::default();
        assert!(!o.behind(&wire, 2));
        for _ in 0..WIRE_STREAK {
            o.learn(&wire, 2, true, false);
        }
        assert!(o.behind(&wire, 2));
        o.learn(&wire, 2, false, true);
        assert!(!o.behind(&wire, 2));
        for _ in 0..BEHIND_STREAK {
            o.learn(&wire, 2, true, false);
        }
        assert!(o.behind(&wire, 2));
        // 802.11 (or a link not named) starts owing a streak.
        let radio = HopConfig::default().for_link(true);
        let o = RoundOrder::default();
        assert!(!o.behind(&radio, 2));
        assert!(!o.behind(&HopConfig::default(), 2));
        assert!(
            !o.behind(&HopConfig::paper().for_link(false), 2),
            "the switch"
        );
    }
}
