//! Diagnostics: the time a node's sending side spends in each state, and counter names.

use super::*;

/// What a node's sending side was doing, for the time-in-state counters (diagnostics): where
/// a node that seldom sends spends its time. A node in several states at once counts in the
/// first that applies, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SendState {
    /// A transfer has packets of its round it may hand to the link now: the node sends as
    /// fast as its link takes them (or as its link window opens).
    Ready,
    /// A relay's transfer holds fewer than a txop of new packets of a block still arriving
    /// and waits for more from upstream (pipelining threshold, §3.1): the pace is set
    /// upstream.
    Feed,
    /// The transfers wait for the BACK of a round's first BSYN (a control round trip, the
    /// receiver's BACK deferral, or the node's own queue ahead of the BSYN), or have yet to
    /// send their BSYN (held back while their packets may still be queued here, or for want
    /// of a route).
    Round,
    /// The transfers' BSYNs went unanswered more than once, or the next hop told them to
    /// wait: the receiver withholds (backpressure §3.3, ack withholding §3.5) or the control
    /// frames were lost.
    Silent,
    /// Blocks to move or application bytes to cut, and no transfer under way: a source
    /// holding its next block back (backpressure, §3.3, or its cache bound).
    Held,
}

/// How often the time-in-state counters look the sending state up (diagnostics only), on a
/// node holding at most [`STATE_SAMPLE_FLOWS`] flows; a node holding more looks it up
/// proportionally less often, so that the lookup (which walks every flow) costs a bounded
/// share of the node's work however many flows cross it.
pub(super) const STATE_SAMPLE: Duration = Duration::from_millis(10);
pub(super) const STATE_SAMPLE_FLOWS: usize = 64;

/// Names of the counters, in [`SendState`] order, and how long the node was in none of them.
pub(super) const SEND_STATE_NAMES: [&str; 5] = [
    "time_ready_ms",
    "time_feed_ms",
    "time_round_ms",
    "time_silent_ms",
    "time_held_ms",
];

pub(super) const SEND_IDLE_NAME: &str = "time_idle_ms";

/// Time during which this node withheld at least one upstream BSYN for backpressure (§3.3)
/// or for ack withholding (§3.5): why its upstream neighbours were silent.
pub(super) const WITHHOLD_NAMES: [&str; 2] = ["time_withholding_bp_ms", "time_withholding_aw_ms"];

/// Time per [`SendState`], credited at each call into the transport for the time since the
/// previous one (the state cannot change in between).
#[derive(Debug, Clone, Default)]
pub(super) struct StateClock {
    pub(super) at: Option<Instant>,
    pub(super) spent: [Duration; 5],
    pub(super) idle: Duration,
    pub(super) withholding: [Duration; 2],
    /// When the sending state was last looked up, what it was, and whether BSYNs were
    /// withheld for backpressure and for ack withholding.
    pub(super) sampled: Option<(Instant, Option<SendState>, [bool; 2])>,
}

pub(super) fn bump(map: &mut BTreeMap<&'static str, u64>, k: &'static str) {
    *map.entry(k).or_insert(0) += 1;
}

pub(super) fn name_of(t: MsgType, flags: u8) -> &'static str {
    match t {
        MsgType::Data => "data",
        MsgType::Bsyn if flags & FLAG_MICRO != 0 => "micro",
        MsgType::Bsyn if flags & FLAG_VTX != 0 => "vtx",
        MsgType::Bsyn => "bsyn",
        MsgType::Back if flags & FLAG_WAIT != 0 => "wait",
        MsgType::Back => "back",
        MsgType::E2eBack => "e2e_back",
        MsgType::Fin if flags & FLAG_ABORT != 0 && flags & FLAG_COMPLETE != 0 => "abort_ack",
        MsgType::Fin if flags & FLAG_ABORT != 0 => "abort",
        MsgType::Fin => "fin",
    }
}

impl HopTransport {
    /// The node's sending state now (see [`SendState`]); None: nothing to send.
    pub(super) fn send_state(&self) -> Option<SendState> {
        let mut best: Option<SendState> = None;
        let mut has_work = false;
        for f in self.flows.values() {
            if let Some(src) = f.source() {
                has_work |= src.pending_bytes > 0 || (src.finish && src.fin_block.is_none());
            }
            has_work |= f
                .blocks
                .values()
                .any(|b| b.custody && !b.moved && f.dest().is_none());
            // A relay receiving a block it has not started to forward (a txop of it is not
            // here yet, §3.1) waits for upstream too.
            if f.is_relay()
                && f.blocks.iter().any(|(n, b)| {
                    !b.complete() && b.admitted_from.is_some() && !f.outs.contains_key(n)
                })
            {
                best = Some(match best {
                    Some(b) if (b as u8) <= (SendState::Feed as u8) => b,
                    _ => SendState::Feed,
                });
            }
            for (n, x) in &f.outs {
                let st = match x.state {
                    TransferState::Sending => {
                        match f.blocks.get(n).map(|b| self.round_left(b, x)) {
                            Some((_, true)) => return Some(SendState::Ready),
                            Some((left, false)) if left > 0 => SendState::Feed,
                            _ => SendState::Round,
                        }
                    }
                    TransferState::NeedBsyn => SendState::Round,
                    TransferState::AwaitBack { .. } if x.attempts > 1 => SendState::Silent,
                    TransferState::AwaitBack { .. } => SendState::Round,
                };
                best = Some(match best {
                    Some(b) if (b as u8) <= (st as u8) => b,
                    _ => st,
                });
            }
        }
        best.or(has_work.then_some(SendState::Held))
    }

    /// Credit the time since the previous call to the state the node was in.
    pub(super) fn tick(&mut self, now: Instant) {
        let Some(at) = self.state_clock.at.replace(now) else {
            return;
        };
        let d = now.saturating_duration_since(at);
        if d.is_zero() {
            return;
        }
        // The state is looked up at most once per sample period (it walks every flow): the
        // time in between is credited to the state seen last.
        let scale = (self.flows.len() / STATE_SAMPLE_FLOWS).max(1) as u32;
        if self
            .state_clock
            .sampled
            .is_none_or(|(t, ..)| now.saturating_duration_since(t) >= STATE_SAMPLE * scale)
        {
            let withheld = [Withhold::Backpressure, Withhold::AckWithholding]
                .map(|r| self.withholding.waiting.iter().any(|w| w.reason == r));
            self.state_clock.sampled = Some((at, self.send_state(), withheld));
        }
        let Some((_, state, withheld)) = self.state_clock.sampled else {
            return;
        };
        match state {
            Some(st) => self.state_clock.spent[st as usize] += d,
            None => self.state_clock.idle += d,
        }
        for (i, w) in withheld.into_iter().enumerate() {
            if w {
                self.state_clock.withholding[i] += d;
            }
        }
    }
}
