//! Timers: housekeeping (silent senders, slow turns, stale withheld BSYNs, idle flows,
//! custody expiry, sources giving up) and the transport's next deadline.

use super::*;

impl HopTransport {
    pub(super) fn housekeeping(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        // Silent senders release ack withholding.
        let silence = self.cfg.withhold_timeout;
        let before = self.withholding.admitted.len();
        self.withholding
            .admitted
            .retain(|_, a| a.last_heard + silence > now);
        for _ in self.withholding.admitted.len()..before {
            self.extra("released_silent");
        }
        let released_slow = self.release_slow_turns(now);
        // Withheld BSYNs are refreshed by the sender's retries, at least one per
        // `bsyn_max_backoff`: an entry outlives two of them lost.
        let stale = self.cfg.bsyn_max_backoff * 3;
        self.withholding.waiting.retain(|w| w.at + stale > now);
        if self.withholding.admitted.len() != before || released_slow {
            self.service_waiting(ctx);
        }
        self.forget_old_closed_flows(now);
        let flows = &self.flows;
        self.finished_flows.retain(|k| flows.contains_key(k));
        if !self.waiting.is_empty() {
            self.expire_waiting(now);
        }
        let idle = self.cfg.flow_idle_timeout;
        let expiry = self.cfg.custody_expiry;
        let give_up = self.cfg.give_up_after;
        let dest_idle = self.cfg.unfinished_flow_idle_timeout();
        let mut remove = Vec::new();
        let mut failed = Vec::new();
        let mut expired = Vec::new();
        for (k, f) in &self.flows {
            if let Some(s) = f.source() {
                // Only a source with work outstanding can fail; one waiting for its
                // application is idle, not stuck.
                let outstanding = !f.blocks.is_empty() || s.pending_bytes > 0 || s.finish;
                // With a lifetime the flow is tried until it ends, however long it goes
                // without progress (a partition may last days); without, it gives up.
                match s.lifetime {
                    Some(until) if until <= now => failed.push((*k, FailReason::Expired)),
                    Some(_) => {}
                    None if outstanding && s.last_progress + give_up <= now => {
                        failed.push((
                            *k,
                            if s.had_route {
                                FailReason::Timeout
                            } else {
                                FailReason::NoRoute
                            },
                        ));
                    }
                    None => {}
                }
                continue;
            }
            for (n, b) in &f.blocks {
                if b.custody && !b.moved && b.custody_since + expiry <= now {
                    expired.push((*k, *n));
                }
            }
            let limit = if f.dest().is_some_and(|d| !d.finished) {
                dest_idle
            } else {
                idle
            };
            if f.last_activity + limit <= now && !f.has_custody() {
                remove.push(*k);
            }
        }
        for (k, n) in expired {
            self.extra("custody_expired");
            self.drop_block(k, n);
        }
        for k in remove {
            self.extra("flows_reclaimed");
            self.remove_flow(k, now);
        }
        for (k, reason) in failed {
            self.abort_flow(ctx, k);
            self.events.push_back(Event::SendFailed { flow: k, reason });
        }
        self.stats.flows = self.flows.len() as u64;
    }

    pub(super) fn abort_flow(&mut self, ctx: &mut Ctx<'_>, key: FlowKey) {
        if let Some(f) = self.flows.get(&key) {
            let dst = f.dst;
            let total = f.source().map(|s| s.next_offset).unwrap_or(0);
            self.start_abort(ctx, key, dst, total);
        }
        self.remove_flow(key, ctx.now);
        self.stats.flows = self.flows.len() as u64;
    }

    /// The transport's next deadline: the earliest of the flows' deadlines (recomputed for
    /// the flows touched since the last call) and housekeeping's.
    pub(super) fn refresh_timer(&mut self, now: Instant) {
        self.prune_in_flight();
        for key in std::mem::take(&mut self.deadlines.dirty) {
            let due = self
                .flows
                .get(&key)
                .and_then(|f| self.flow_deadline(f, now));
            self.deadlines.set(key, due);
        }
        let mut t = self.deadlines.first();
        if let Some(a) = self.aborts.next_deadline() {
            t = Some(t.map_or(a, |x| x.min(a)));
        }
        // A waiting flow's destination whose start hold ends (admission.rs).
        if let Some(h) = self.waiting.hold_until {
            t = Some(t.map_or(h, |x| x.min(h)));
        }
        if self.flows.is_empty()
            && self.withholding.waiting.is_empty()
            && self.withholding.admitted.is_empty()
        {
            self.housekeeping_at = None;
        } else {
            // A housekeeping deadline that has passed stays until housekeeping runs: moved on
            // by every datagram handled first, it would never come on a node that receives
            // without pause.
            let h = self.housekeeping_at.unwrap_or(now + HOUSEKEEPING_INTERVAL);
            self.housekeeping_at = Some(h);
            t = Some(t.map_or(h, |x| x.min(h)));
        }
        self.timer = t;
    }

    /// The earliest moment flow `f` needs a visit: a BACK overdue, a BSYN to send, a
    /// deferred BACK, a virtual retransmission, a probe for the BACK that finishes the flow.
    fn flow_deadline(&self, f: &Flow, now: Instant) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut min = |x: Instant| {
            t = Some(t.map_or(x, |y: Instant| y.min(x)));
        };
        for x in f.outs.values() {
            match x.state {
                TransferState::AwaitBack { deadline } => min(deadline),
                TransferState::NeedBsyn => match self.neighbours.probe_at(x.next_hop) {
                    Some(at) => min(at.max(now)),
                    None => min(now + self.cfg.bsyn_timeout),
                },
                TransferState::Sending => {
                    if let Some(t) = x.not_before.filter(|t| *t > now) {
                        min(t);
                    }
                }
            }
        }
        for d in f.deferred.values() {
            min(d.due);
        }
        if let Some(p) = &f.fin_probe {
            min(p.due());
        }
        if f.source().is_some() && self.cfg.virtual_retransmission {
            for b in f.blocks.values() {
                if let Some(d) = b.vtx_deadline {
                    min(d);
                }
            }
        }
        t
    }
}

/// Flows' deadlines indexed by time.
#[derive(Debug, Default)]
pub(super) struct Deadlines {
    by_time: BTreeSet<(Instant, FlowKey)>,
    of: BTreeMap<FlowKey, Instant>,
    /// Flows whose deadline may have changed.
    pub(super) dirty: BTreeSet<FlowKey>,
}

impl Deadlines {
    fn set(&mut self, key: FlowKey, due: Option<Instant>) {
        if let Some(old) = self.of.remove(&key) {
            self.by_time.remove(&(old, key));
        }
        if let Some(t) = due {
            self.of.insert(key, t);
            self.by_time.insert((t, key));
        }
    }

    fn first(&self) -> Option<Instant> {
        self.by_time.first().map(|(t, _)| *t)
    }

    /// The flows whose deadline is `now` or earlier, taken out of the index (they are
    /// visited, and so recomputed).
    pub(super) fn take_due(&mut self, now: Instant) -> Vec<FlowKey> {
        let mut due = Vec::new();
        while let Some(&(t, k)) = self.by_time.first() {
            if t > now {
                break;
            }
            self.by_time.pop_first();
            self.of.remove(&k);
            self.dirty.insert(k);
            due.push(k);
        }
        due
    }
}
