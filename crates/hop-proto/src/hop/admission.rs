//! Opening more flows than a node sends at once: the rest wait, first opened first started.
//!
//! Not in the paper, which opens every flow at once. A source with thousands of flows open
//! (a burst of small files, a mail queue) gains nothing from sending all of them together:
//! flows to one destination share one path, every one pays its own BSYN/BACK rounds, and a
//! relay admits one block per next hop at a time (§3.3), so the others' BSYNs are withheld
//! and repeated. So at most `max_sending_flows` of a node's own flows send at a time, and at
//! most `max_sending_flows_per_destination` of them to one destination; the others wait,
//! holding only the bytes the application handed them (within the cache budget), and start
//! as sending flows end, the longest waiting first among the destinations with room (a
//! destination that is slow or gone holds up only its own flows). An open is refused only
//! when `max_waiting_flows` flows already wait, with that limit named.
//!
//! With `flow_start_hold` (off by default) a destination's small flows start one at a time
//! within those limits: after a flow of less than a block's worth of bytes, the next flow to
//! that destination waits until it ends, or for the hold at most, unless a long flow of this
//! node's is sending to that destination. Flows started together share the path and contend
//! at every hop, where hidden nodes collide: over an idle path a burst of small flows moves
//! faster one after the other; beside other traffic, where each flow mostly waits for turns,
//! fewer of them finish.

use std::collections::{BTreeMap, HashMap};

use super::*;

/// A flow opened and not started yet: its destination and the application's bytes so far.
#[derive(Debug)]
struct WaitingFlow {
    dst: NodeId,
    /// Order of opening.
    seq: u64,
    pending: VecDeque<Bytes>,
    pending_bytes: usize,
    finish: bool,
    /// The application was refused bytes: it hears `Writable` once the flow takes more.
    blocked: bool,
    lifetime: Option<Instant>,
    priority: u8,
}

impl WaitingFlow {
    fn new(dst: NodeId, seq: u64) -> Self {
        WaitingFlow {
            dst,
            seq,
            pending: VecDeque::new(),
            pending_bytes: 0,
            finish: false,
            blocked: false,
            lifetime: None,
            priority: PRIORITY_NORMAL,
        }
    }
}

/// Take what fits of `data` (at most `room` bytes) into a source's pending bytes; a flow
/// refused bytes is marked `blocked`, to hear `Writable` once it takes more.
pub(super) fn take_app_bytes(
    pending: &mut VecDeque<Bytes>,
    pending_bytes: &mut usize,
    blocked: &mut bool,
    room: usize,
    mut data: Bytes,
) -> usize {
    let take = room.min(data.len());
    if take < data.len() {
        *blocked = true;
    }
    if take > 0 {
        pending.push_back(data.split_to(take));
        *pending_bytes += take;
    }
    take
}

/// The flows waiting to start, in the order they were opened.
#[derive(Debug, Default)]
pub(super) struct OpenQueue {
    flows: HashMap<FlowKey, WaitingFlow>,
    /// Waiting flows per destination, oldest first.
    by_dst: BTreeMap<NodeId, VecDeque<FlowKey>>,
    /// This node's own flows that are sending (not waiting), in all and per destination.
    sending: usize,
    sending_to: HashMap<NodeId, usize>,
    /// Per destination, the flow started to it last and when, while it sends
    /// (`flow_start_hold`).
    last_start: HashMap<NodeId, (FlowKey, Instant)>,
    /// Long flows (a block's worth of bytes or more) sending, per destination.
    long_to: HashMap<NodeId, usize>,
    /// The earliest moment a hold on a destination with waiting flows ends.
    pub(super) hold_until: Option<Instant>,
    next_seq: u64,
    /// A flow may start: one ended or was opened since the queue was last looked at.
    pub(super) recheck: bool,
}

impl OpenQueue {
    pub(super) fn len(&self) -> usize {
        self.flows.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    pub(super) fn contains(&self, key: &FlowKey) -> bool {
        self.flows.contains_key(key)
    }

    /// One of this node's own flows, `key` to `dst`, stopped sending (`long`: it was long).
    pub(super) fn ended(&mut self, dst: NodeId, key: FlowKey, long: bool) {
        if long {
            if let Some(n) = self.long_to.get_mut(&dst) {
                *n -= 1;
                if *n == 0 {
                    self.long_to.remove(&dst);
                }
            }
        }
        if self.last_start.get(&dst).is_some_and(|(k, _)| *k == key) {
            self.last_start.remove(&dst);
        }
        self.sending = self.sending.saturating_sub(1);
        if let Some(n) = self.sending_to.get_mut(&dst) {
            *n -= 1;
            if *n == 0 {
                self.sending_to.remove(&dst);
            }
        }
        self.recheck = true;
    }

    /// A sending flow `s` to `dst` took bytes: once it holds a block's worth (`block`) it is
    /// long, and the flows waiting for `dst` are looked at again.
    pub(super) fn note_size(&mut self, dst: NodeId, s: &mut SourceState, block: u64) {
        if !s.long && s.next_offset + s.pending_bytes as u64 >= block {
            s.long = true;
            *self.long_to.entry(dst).or_default() += 1;
            self.recheck |= self.by_dst.contains_key(&dst);
        }
    }

    fn sending_to(&self, dst: NodeId) -> usize {
        self.sending_to.get(&dst).copied().unwrap_or(0)
    }

    /// The end of the hold on `dst`'s next flow, if one is on at `now`: the flow started
    /// to `dst` last is younger than the hold and short (less than a block's worth of bytes
    /// so far), and no long flow of this node's is sending to `dst`. A long flow holds
    /// nothing back, since it would hold the next for the whole hold; and beside one, small
    /// flows start as before, since each would wait its turn behind the long flow's rounds
    /// at this node (one after the other, a burst of them would take as many turns).
    fn held_until(
        &self,
        flows: &BTreeMap<FlowKey, Flow>,
        dst: NodeId,
        now: Instant,
        hold: Duration,
    ) -> Option<Instant> {
        if hold.is_zero() || self.long_to.contains_key(&dst) {
            return None;
        }
        let (key, at) = self.last_start.get(&dst)?;
        let s = flows.get(key)?.source()?;
        Some(*at + hold).filter(|end| !s.long && *end > now)
    }

    /// The destination with room whose waiting head was opened first; notes in
    /// `hold_until` when the first hold that keeps a waiting destination back ends.
    fn next_to_start(
        &mut self,
        flows: &BTreeMap<FlowKey, Flow>,
        per_dst: usize,
        now: Instant,
        hold: Duration,
    ) -> Option<NodeId> {
        let mut hold_until: Option<Instant> = None;
        let next = self
            .by_dst
            .iter()
            .filter(|(d, _)| self.sending_to(**d) < per_dst)
            .filter(|(d, _)| match self.held_until(flows, **d, now, hold) {
                Some(end) => {
                    hold_until = Some(hold_until.map_or(end, |t| t.min(end)));
                    false
                }
                None => true,
            })
            .filter_map(|(d, q)| Some((self.flows.get(q.front()?)?.seq, *d)))
            .min()
            .map(|(_, d)| d);
        self.hold_until = hold_until;
        next
    }
}

impl HopTransport {
    /// May a new flow of this node's own start sending now (`dst`: to that destination)?
    fn may_start(&self, dst: Option<NodeId>, now: Instant) -> bool {
        self.waiting.sending < self.cfg.max_sending_flows
            && self.flows.len() < self.cfg.max_flows
            && dst.is_none_or(|d| {
                self.waiting.sending_to(d) < self.cfg.max_sending_flows_per_destination
                    && self
                        .waiting
                        .held_until(&self.flows, d, now, self.cfg.flow_start_hold)
                        .is_none()
            })
    }

    /// Open `key`: it starts now, or waits behind the flows opened before it.
    pub(super) fn open_flow(
        &mut self,
        ctx: &mut Ctx<'_>,
        key: FlowKey,
        dst: NodeId,
    ) -> Result<(), AppError> {
        let seq = self.waiting.next_seq;
        self.waiting.next_seq += 1;
        let queued_to_dst = self.waiting.by_dst.get(&dst).is_some_and(|q| !q.is_empty());
        if !queued_to_dst && self.may_start(Some(dst), ctx.now) {
            self.start_flow(ctx, key, WaitingFlow::new(dst, seq));
            return Ok(());
        }
        if self.waiting.len() >= self.cfg.max_waiting_flows {
            self.extra("flows_refused_at_open");
            return Err(AppError::TooManyWaitingFlows(self.cfg.max_waiting_flows));
        }
        self.extra("flows_waited");
        // Looked at again: a hold may be all that keeps it back.
        self.waiting.recheck = true;
        self.waiting.by_dst.entry(dst).or_default().push_back(key);
        self.waiting.flows.insert(key, WaitingFlow::new(dst, seq));
        Ok(())
    }

    fn start_flow(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, w: WaitingFlow) {
        let WaitingFlow {
            dst,
            pending,
            pending_bytes,
            finish,
            blocked,
            lifetime,
            priority,
            ..
        } = w;
        let mut f = Flow::new(dst, ctx.now);
        f.priority = priority;
        f.role = Role::Source(SourceState {
            pending,
            pending_bytes,
            finish,
            rto: self.cfg.vtx_initial_timeout,
            last_progress: ctx.now,
            had_route: ctx.routing.next_hop(dst).is_some(),
            lifetime,
            ..SourceState::default()
        });
        self.flows.insert(key, f);
        self.waiting.sending += 1;
        *self.waiting.sending_to.entry(dst).or_default() += 1;
        self.waiting.last_start.insert(dst, (key, ctx.now));
        if let Some(s) = self.flows.get_mut(&key).and_then(|f| f.source_mut()) {
            self.waiting
                .note_size(dst, s, self.cfg.block_bytes() as u64);
        }
        self.stats.flows = self.flows.len() as u64;
        if (pending_bytes > 0 || finish) && !self.to_form.contains(&key) {
            self.to_form.push(key);
        }
        // A flow refused bytes while it waited takes them now (a sending flow's buffer is
        // not bounded by the cache budget: blocks are cut only when the cache has room).
        if blocked {
            self.events.push_back(Event::Writable { flow: key });
        }
    }

    /// Start the waiting flows there is room for, the longest waiting first among the
    /// destinations with room. True if it looked (a start hold's end may be a new deadline).
    pub(super) fn start_waiting(&mut self, ctx: &mut Ctx<'_>) -> bool {
        let hold_over = self.waiting.hold_until.is_some_and(|t| t <= ctx.now);
        if !std::mem::take(&mut self.waiting.recheck) && !hold_over {
            return false;
        }
        self.waiting.hold_until = None;
        let (per_dst, hold) = (
            self.cfg.max_sending_flows_per_destination,
            self.cfg.flow_start_hold,
        );
        while self.may_start(None, ctx.now) {
            let Some(dst) = self
                .waiting
                .next_to_start(&self.flows, per_dst, ctx.now, hold)
            else {
                break;
            };
            let Some(q) = self.waiting.by_dst.get_mut(&dst) else {
                break;
            };
            let key = q.pop_front();
            if q.is_empty() {
                self.waiting.by_dst.remove(&dst);
            }
            let Some(w) = key.and_then(|k| self.waiting.flows.remove(&k)) else {
                continue;
            };
            self.start_flow(ctx, key.expect("popped"), w);
        }
        true
    }

    /// Bytes for a waiting flow: kept while the flow holds less than a sending flow would
    /// and the cache has room; the rest is refused until the flow starts.
    pub(super) fn send_waiting(&mut self, key: FlowKey, data: Bytes) -> Result<usize, AppError> {
        let limit = self.cfg.source_buffer_bytes.max(self.cfg.block_bytes());
        let budget = self.cfg.cache_limit_bytes.saturating_sub(self.cache_bytes) as usize;
        let w = self.waiting_unfinished(key)?;
        let room = limit.saturating_sub(w.pending_bytes).min(budget);
        let take = take_app_bytes(
            &mut w.pending,
            &mut w.pending_bytes,
            &mut w.blocked,
            room,
            data,
        );
        self.count_app_bytes(take);
        Ok(take)
    }

    pub(super) fn finish_waiting(&mut self, key: FlowKey) -> Result<(), AppError> {
        self.waiting_unfinished(key)?.finish = true;
        Ok(())
    }

    /// Waiting flow `key`, if the application may still hand it bytes.
    fn waiting_unfinished(&mut self, key: FlowKey) -> Result<&mut WaitingFlow, AppError> {
        let w = self
            .waiting
            .flows
            .get_mut(&key)
            .ok_or(AppError::UnknownFlow(key))?;
        if w.finish {
            return Err(AppError::FlowFinished(key));
        }
        Ok(w)
    }

    /// Application bytes just taken by a source flow, sending or waiting: they are cached.
    pub(super) fn count_app_bytes(&mut self, take: usize) {
        if take > 0 {
            self.cache_bytes += take as u64;
            self.app_bytes += take as u64;
            self.note_cache();
        }
    }

    /// Abort a waiting flow: it never sent anything, so nothing goes on the air.
    pub(super) fn abort_waiting(&mut self, key: FlowKey) -> bool {
        let Some(w) = self.waiting.flows.remove(&key) else {
            return false;
        };
        if let Some(q) = self.waiting.by_dst.get_mut(&w.dst) {
            q.retain(|k| *k != key);
            if q.is_empty() {
                self.waiting.by_dst.remove(&w.dst);
            }
        }
        self.cache_bytes = self.cache_bytes.saturating_sub(w.pending_bytes as u64);
        self.app_bytes = self.app_bytes.saturating_sub(w.pending_bytes as u64);
        self.note_cache();
        true
    }

    /// Set the lifetime of a flow of this node's own, sending or waiting.
    pub(super) fn set_source_lifetime(&mut self, key: FlowKey, until: Instant) -> bool {
        if let Some(w) = self.waiting.flows.get_mut(&key) {
            w.lifetime = Some(until);
            return true;
        }
        match self.flows.get_mut(&key).map(|f| &mut f.role) {
            Some(Role::Source(s)) => {
                s.lifetime = Some(until);
                true
            }
            _ => false,
        }
    }

    /// Set the class of a local flow, waiting or sending. False if there is no such flow.
    pub(super) fn set_source_priority(&mut self, key: FlowKey, priority: u8) -> bool {
        if let Some(w) = self.waiting.flows.get_mut(&key) {
            w.priority = priority;
            return true;
        }
        match self.flows.get_mut(&key) {
            Some(f) if f.source().is_some() => {
                f.priority = priority;
                true
            }
            _ => false,
        }
    }

    /// Waiting flows whose lifetime passed: they fail without having sent anything.
    pub(super) fn expire_waiting(&mut self, now: Instant) {
        let expired: Vec<FlowKey> = self
            .waiting
            .flows
            .iter()
            .filter(|(_, w)| w.lifetime.is_some_and(|u| u <= now))
            .map(|(k, _)| *k)
            .collect();
        for k in expired {
            self.abort_waiting(k);
            self.events.push_back(Event::SendFailed {
                flow: k,
                reason: FailReason::Expired,
            });
        }
    }
}
