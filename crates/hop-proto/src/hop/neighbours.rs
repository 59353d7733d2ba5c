//! Per-neighbour liveness (not in the paper): a next hop that has answered nothing for
//! `neighbour_silence` is probed by one BSYN per `probe_interval` (doubling up to
//! `bsyn_max_backoff`), whatever the number of flows and blocks waiting for it; everything
//! waiting for it asks again as soon as anything is heard from it. Without this each
//! transfer repeats its own BSYN on its own timer, so a node holding many blocks for a relay
//! that is down spends the air its other traffic needs on probes of a dead node
//! (docs/design/hop.md#dead-neighbours).

use super::*;

/// What a node knows of one neighbour's liveness.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Neighbour {
    /// The first BSYN sent to it since anything was last heard from it.
    asked_since: Option<Instant>,
    /// Deemed unreachable: when the next probe may go, and the interval after it.
    probe: Option<(Instant, Duration)>,
}

/// The neighbours this node has asked something.
#[derive(Debug, Default)]
pub(super) struct Neighbours {
    by_id: BTreeMap<NodeId, Neighbour>,
}

impl Neighbours {
    /// When the next BSYN to `id` may go, if it is being probed.
    pub(super) fn probe_at(&self, id: NodeId) -> Option<Instant> {
        self.by_id.get(&id).and_then(|n| n.probe).map(|(at, _)| at)
    }
}

impl HopTransport {
    /// Anything heard from neighbour `id` (a message to this node or one overheard): it is
    /// alive. Transfers that waited for it while it was probed ask again at once.
    pub(super) fn heard_from(&mut self, ctx: &mut Ctx<'_>, id: NodeId) {
        if self.cfg.neighbour_silence.is_zero() {
            return;
        }
        let Some(n) = self.neighbours.by_id.get_mut(&id) else {
            return;
        };
        n.asked_since = None;
        if n.probe.take().is_none() {
            return;
        }
        self.extra("neighbour_returned");
        self.events
            .push_back(Event::NeighbourReturned { neighbour: id });
        let mut waiting = Vec::new();
        for (k, f) in self.flows.iter_mut() {
            for x in f.outs.values_mut() {
                if x.next_hop == id && x.state != TransferState::Sending {
                    x.state = TransferState::NeedBsyn;
                    x.attempts = 0;
                    waiting.push(*k);
                }
            }
        }
        waiting.dedup();
        for k in waiting {
            self.pump_flow(ctx, k);
        }
    }

    /// Whether a BSYN may go to next hop `id` now: always, unless it has answered nothing
    /// for `neighbour_silence` since it was first asked; then only as its probe, once per
    /// probe interval.
    pub(super) fn may_ask(&mut self, id: NodeId, now: Instant) -> bool {
        let silence = self.cfg.neighbour_silence;
        if silence.is_zero() {
            return true;
        }
        let first = self.cfg.probe_interval;
        let ceiling = self.cfg.bsyn_max_backoff.max(first);
        let n = self.neighbours.by_id.entry(id).or_default();
        let since = *n.asked_since.get_or_insert(now);
        let mut went_silent = false;
        let (allowed, probed) = match n.probe {
            Some((at, _)) if now < at => (false, false),
            Some((_, interval)) => {
                n.probe = Some((now + interval, (interval * 2).min(ceiling)));
                (true, true)
            }
            None if now >= since + silence => {
                n.probe = Some((now + first, (first * 2).min(ceiling)));
                self.stats
                    .extra
                    .entry("neighbour_silent")
                    .and_modify(|c| *c += 1)
                    .or_insert(1);
                went_silent = true;
                (true, true)
            }
            None => (true, false),
        };
        if probed {
            self.extra("neighbour_probes");
        }
        if went_silent {
            // The runtime tells the operator and the applications that wait.
            let flows = self
                .flows
                .iter()
                .filter(|(_, f)| f.source().is_some() && f.outs.values().any(|x| x.next_hop == id))
                .map(|(k, _)| *k)
                .collect();
            self.events.push_back(Event::NeighbourSilent {
                neighbour: id,
                flows,
            });
        }
        allowed
    }
}
