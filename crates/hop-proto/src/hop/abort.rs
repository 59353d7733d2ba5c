//! Aborts that reach the whole path (not in the paper, whose FIN with the abort flag goes
//! once): a flow aborted by its application, or given up by its source, must free the
//! partial data and custody every node downstream holds, and a relay holding its blocks in
//! custody must not deliver them after the path heals. One lost FIN, or a next hop that was
//! down when it went, would leave both. So the node that sends an abort (the source, and
//! each relay that passes one on) keeps a notice and repeats the FIN to its next hop, at the
//! probe schedule of a silent neighbour, until that neighbour acknowledges it (a FIN with
//! `ABORT | COMPLETE`, never passed on) (docs/design/hop.md#aborts-along-the-path); a
//! message about an aborted flow from any node is answered with the abort again.

use super::*;

/// An abort this node passes on toward the flow's destination.
#[derive(Debug, Clone, Copy)]
pub(super) struct AbortNotice {
    dst: NodeId,
    total_bytes: u64,
    /// When to send the FIN again.
    next_at: Instant,
    interval: Duration,
    /// The notice is dropped then, answered or not: no node holds the flow's blocks
    /// longer (custody expiry, the source's give-up).
    until: Instant,
    /// The last answer to a message about the flow (at most one per probe interval).
    answered_at: Option<Instant>,
}

/// Aborts in progress, by flow.
#[derive(Debug, Default)]
pub(super) struct Aborts {
    by_flow: BTreeMap<FlowKey, AbortNotice>,
}

impl Aborts {
    pub(super) fn is_empty(&self) -> bool {
        self.by_flow.is_empty()
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.by_flow.values().map(|n| n.next_at).min()
    }
}

impl HopTransport {
    /// Start passing on the abort of flow `key` (to `dst`, `total_bytes` sent by its
    /// source): the FIN goes now and is repeated until the next hop has heard it.
    pub(super) fn start_abort(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, dst: NodeId, total: u64) {
        if dst == ctx.local || self.aborts.by_flow.contains_key(&key) {
            return;
        }
        let now = ctx.now;
        let until = now + self.cfg.custody_expiry.max(self.cfg.give_up_after);
        self.aborts.by_flow.insert(
            key,
            AbortNotice {
                dst,
                total_bytes: total,
                next_at: now,
                interval: self.cfg.probe_interval.max(Duration::from_millis(100)),
                until,
                answered_at: None,
            },
        );
        self.send_abort_notice(ctx, key);
    }

    /// An abort FIN for `key` arrived from `from` (`ack`: it acknowledges one this node
    /// sent). An abort is acknowledged to its sender; an acknowledgement ends the notice.
    /// True if the message was an acknowledgement (nothing more to do with it).
    pub(super) fn abort_received(
        &mut self,
        key: FlowKey,
        h: &HopHeader,
        from: NodeId,
        total: u64,
        ack: bool,
    ) -> bool {
        if ack {
            if self.aborts.by_flow.remove(&key).is_some() {
                self.extra("abort_acknowledged");
            }
            return true;
        }
        let msg = HopMessage {
            header: HopHeader {
                flags: FLAG_ABORT | FLAG_COMPLETE,
                ..*h
            },
            body: HopBody::Fin { total_bytes: total },
        };
        self.push_ctrl(from, &msg);
        false
    }

    /// A message about flow `key` came from `from`: if the flow was aborted here, `from`
    /// did not hear it (it still asks, or still reports), so it hears it again.
    /// True if the message is about an aborted flow (and needs nothing else).
    pub(super) fn answer_aborted(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, from: NodeId) -> bool {
        let now = ctx.now;
        let gap = self.cfg.probe_interval;
        let Some(n) = self.aborts.by_flow.get_mut(&key) else {
            return false;
        };
        if n.answered_at.is_some_and(|t| now < t + gap) {
            return true;
        }
        n.answered_at = Some(now);
        let msg = Self::abort_fin(key, n.dst, n.total_bytes);
        self.push_ctrl(from, &msg);
        self.extra("abort_answered");
        true
    }

    /// Notices due: the FIN again, or the end of a notice no one acknowledged in time.
    pub(super) fn abort_notices(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        let due: Vec<FlowKey> = self
            .aborts
            .by_flow
            .iter()
            .filter(|(_, n)| n.next_at <= now)
            .map(|(k, _)| *k)
            .collect();
        for key in due {
            if self
                .aborts
                .by_flow
                .get(&key)
                .is_some_and(|n| now >= n.until)
            {
                self.aborts.by_flow.remove(&key);
                self.extra("abort_unacknowledged");
                continue;
            }
            self.send_abort_notice(ctx, key);
        }
    }

    fn send_abort_notice(&mut self, ctx: &mut Ctx<'_>, key: FlowKey) {
        let now = ctx.now;
        let ceiling = self.cfg.bsyn_max_backoff.max(self.cfg.probe_interval);
        let Some(n) = self.aborts.by_flow.get_mut(&key) else {
            return;
        };
        let interval = n.interval;
        n.next_at = now + interval;
        n.interval = (interval * 2).min(ceiling);
        let Some(nh) = ctx.routing.next_hop(n.dst) else {
            // No route now: look again at the next interval.
            return;
        };
        let msg = Self::abort_fin(key, n.dst, n.total_bytes);
        self.push_ctrl(nh, &msg);
        self.extra("abort_sent");
    }

    fn abort_fin(key: FlowKey, dst: NodeId, total: u64) -> HopMessage<'static> {
        HopMessage {
            header: Self::header(key, dst, 0, FLAG_ABORT, 0),
            body: HopBody::Fin { total_bytes: total },
        }
    }
}
