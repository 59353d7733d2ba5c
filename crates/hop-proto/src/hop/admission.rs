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

    /// One of this node's own flows to `dst` stopped sending.
    pub(super) fn ended(&mut self, dst: NodeId) {
        self.sending = self.sending.saturating_sub(1);
        if let Some(n) = self.sending_to.get_mut(&dst) {
            *n -= 1;
            if *n == 0 {
                self.sending_to.remove(&dst);
            }
        }
        self.recheck = true;
    }

    fn sending_to(&self, dst: NodeId) -> usize {
        self.sending_to.get(&dst).copied().unwrap_or(0)
    }

    /// The destination with room whose waiting head was opened first.
    fn next_to_start(&self, per_dst: usize) -> Option<NodeId> {
        self.by_dst
            .iter()
            .filter(|(d, _)| self.sending_to(**d) < per_dst)
            .filter_map(|(d, q)| Some((self.flows.get(q.front()?)?.seq, *d)))
            .min()
            .map(|(_, d)| d)
    }
}

impl HopTransport {
    /// May a new flow of this node's own start sending now (`dst`: to that destination)?
    fn may_start(&self, dst: Option<NodeId>) -> bool {
        self.waiting.sending < self.cfg.max_sending_flows
            && self.flows.len() < self.cfg.max_flows
            && dst.is_none_or(|d| {
                self.waiting.sending_to(d) < self.cfg.max_sending_flows_per_destination
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
        if !queued_to_dst && self.may_start(Some(dst)) {
            self.start_flow(ctx, key, WaitingFlow::new(dst, seq));
            return Ok(());
        }
        if self.waiting.len() >= self.cfg.max_waiting_flows {
            self.extra("flows_refused_at_open");
            return Err(AppError::TooManyWaitingFlows(self.cfg.max_waiting_flows));
        }
        self.extra("flows_waited");
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
    /// destinations with room.
    pub(super) fn start_waiting(&mut self, ctx: &mut Ctx<'_>) {
        if !std::mem::take(&mut self.waiting.recheck) {
            return;
        }
        let per_dst = self.cfg.max_sending_flows_per_destination;
        while self.may_start(None) {
            let Some(dst) = self.waiting.next_to_start(per_dst) else {
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
