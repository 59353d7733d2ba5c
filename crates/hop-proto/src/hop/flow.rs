//! Flows and blocks: what a node holds of each flow it is the source, a relay or the
//! destination of, opening and removing flows, and the memory of closed incoming flows.

use super::*;

#[derive(Debug)]
pub(super) struct Block {
    pub(super) offset: u64,
    pub(super) geom: BlockGeom,
    pub(super) fin: bool,
    pub(super) data: BlockData,
    pub(super) have: Bitmap,
    /// The node must not drop it: it accepted it from upstream (complete) or is its source.
    pub(super) custody: bool,
    /// Fully acknowledged by the next hop (or delivered, at the destination).
    pub(super) moved: bool,
    /// The upstream neighbour whose BSYN we answered (on-path block).
    pub(super) admitted_from: Option<NodeId>,
    pub(super) last_used: Instant,
    pub(super) last_data: Instant,
    /// When this node last sent a BACK for the block (None: never).
    pub(super) last_back: Option<Instant>,
    /// DATA packets of the block received again from upstream since the last BACK.
    pub(super) dups: u16,
    /// Number of the newest DATA packet from the sender (at `last_data`): with a BSYN's
    /// round end it tells that the round's data has arrived.
    pub(super) newest_data: Option<u32>,
    /// Packets held only from overheard frames: their sender did not know we had them, so
    /// its copy is no duplicate.
    pub(super) overheard: Bitmap,
    /// A virtual retransmission with this TTL must be forwarded.
    pub(super) vtx_fwd: Option<u8>,
    /// When custody was taken (expiry).
    pub(super) custody_since: Instant,
    /// The store is writing the block ([`Persist::Later`]); the completing BACK goes to this
    /// upstream neighbour once it is durable.
    pub(super) persisting: Option<NodeId>,
    /// Source only: first BSYN (round-trip measurement) and virtual retransmission timer.
    pub(super) first_sent: Option<Instant>,
    pub(super) vtx_deadline: Option<Instant>,
    pub(super) vtx_count: u32,
}

impl Block {
    pub(super) fn new(offset: u64, geom: BlockGeom, fin: bool, now: Instant) -> Self {
        let n = geom.packets();
        Block {
            offset,
            geom,
            fin,
            data: BlockData::Empty,
            have: Bitmap::new(n),
            custody: false,
            moved: false,
            admitted_from: None,
            last_used: now,
            last_data: Instant::ZERO,
            last_back: None,
            dups: 0,
            newest_data: None,
            overheard: Bitmap::new(n),
            vtx_fwd: None,
            custody_since: now,
            persisting: None,
            first_sent: None,
            vtx_deadline: None,
            vtx_count: 0,
        }
    }

    pub(super) fn complete(&self) -> bool {
        self.have.is_full()
    }

    /// Store packet `n`; returns true if it was new. `shared`: the buffer `payload` lies
    /// in, when the runtime shares its datagrams (see [`BlockData`]).
    pub(super) fn store(&mut self, n: u32, payload: &[u8], shared: Option<&Bytes>) -> bool {
        match self.geom.packet_range(n) {
            Some(r) if r.len() == payload.len() && !self.have.get(n) => {
                self.data.store(&self.geom, n, r, payload, shared);
                self.have.set(n)
            }
            _ => false,
        }
    }

    /// Payload bytes of the packets held.
    pub(super) fn held_bytes(&self) -> u64 {
        (0..self.geom.packets())
            .filter(|&i| self.have.get(i))
            .filter_map(|i| self.geom.packet_range(i))
            .map(|r| r.len() as u64)
            .sum()
    }

    pub(super) fn packet(&self, n: u32) -> &[u8] {
        match self.geom.packet_range(n) {
            Some(r) => self.data.packet(n, r),
            None => &[],
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct SourceState {
    pub(super) pending: VecDeque<Bytes>,
    pub(super) pending_bytes: usize,
    pub(super) next_block: u32,
    pub(super) next_offset: u64,
    pub(super) finish: bool,
    pub(super) fin_block: Option<u32>,
    pub(super) rto: Duration,
    pub(super) last_progress: Instant,
    pub(super) blocked: bool,
    pub(super) had_route: bool,
    /// The application's lifetime: tried until then, whatever the progress.
    pub(super) lifetime: Option<Instant>,
    /// With `block_time`: the size of the next block cut (0: not measured yet).
    pub(super) block_limit: usize,
    /// With `block_time`: when the first hop last took a whole block of this flow.
    pub(super) hop_done_at: Option<Instant>,
    /// The application has handed the flow a block's worth of bytes or more: it holds no
    /// flow back, and keeps the next small ones to its destination from holding each other
    /// back (admission.rs).
    pub(super) long: bool,
    /// With `ramp_while_shared`: the first hop answered the first block's BSYN without
    /// reporting shared turns, so the first block is cut whole (once: later blocks follow
    /// what the path reports, so that a flow that came first to a relay others join later
    /// does not keep whole turns while theirs ramp).
    pub(super) alone_at_start: bool,
}

#[derive(Debug, Default)]
pub(super) struct DestState {
    pub(super) next_deliver: u32,
    pub(super) delivered: u64,
    pub(super) finished: bool,
    /// The store refused the next block (no room): its end-to-end BACK and new blocks of
    /// the flow are withheld until a retry succeeds.
    pub(super) blocked: bool,
    /// Blocks handed to the store that it is still writing ([`Persist::Later`]), and the
    /// blocks after them: end-to-end BACKs acknowledge only the blocks below the first of
    /// them, since the source drops its copy on that acknowledgement (§3.2: custody moves
    /// only to durable storage), and the application gets them, in order, once durable.
    pub(super) writing: BTreeMap<u32, Writing>,
    /// The store reported a write failing (and retries it): new blocks of the flow are
    /// withheld, as for a refused delivery, until a write succeeds.
    pub(super) write_failing: bool,
}

/// A delivered block on its way to durable storage.
#[derive(Debug)]
pub(super) struct Writing {
    pub(super) offset: u64,
    pub(super) data: Bytes,
    /// The store reported it durable (it waits for a block before it).
    pub(super) durable: bool,
}

impl DestState {
    /// Blocks acknowledged end to end: delivered in order and durable in the store.
    pub(super) fn durable(&self) -> u32 {
        self.writing
            .first_key_value()
            .map_or(self.next_deliver, |(n, _)| *n)
    }

    /// The flow's last block is delivered and durable: the end-to-end BACK carries FIN.
    pub(super) fn finished_durably(&self) -> bool {
        self.finished && self.writing.is_empty()
    }
}

/// A BACK held until the data its BSYN announced has arrived.
#[derive(Debug, Clone, Copy)]
pub(super) struct DeferredBack {
    /// The upstream neighbour that asked.
    pub(super) to: NodeId,
    /// Sent by then at the latest: `back_quiet` after the newest DATA of the round.
    pub(super) due: Instant,
    /// Packets the upstream's BSYN said the block would hold here.
    pub(super) expect: u16,
}

#[derive(Debug)]
pub(super) struct Flow {
    pub(super) dst: NodeId,
    pub(super) blocks: BTreeMap<u32, Block>,
    pub(super) outs: BTreeMap<u32, Transfer>,
    /// Deferred BACKs by block.
    pub(super) deferred: BTreeMap<u32, DeferredBack>,
    pub(super) last_activity: Instant,
    /// The destination reported the flow finished; waiting for FIN or idle timeout.
    pub(super) finished: bool,
    /// End-to-end acknowledgement seen passing (relays): blocks below `e2e_cum` are delivered,
    /// and with `e2e_fin` the whole flow is.
    pub(super) e2e_cum: u32,
    pub(super) e2e_fin: bool,
    pub(super) role: Role,
    /// The flow's class (hop-wire `PRIORITY_*`): set by the source's application, learnt by
    /// the other nodes from the BSYNs and DATA they receive; data of a higher class goes
    /// first (scheduler.rs).
    pub(super) priority: u8,
    /// The largest block the next hop last asked for in a BACK of this flow, for itself and
    /// the nodes beyond it (blocks sized to shared turns); `None`: no limit.
    pub(super) block_hint: Option<usize>,
    /// The end-to-end BACK with FIN this node, the destination's last hop, waits for
    /// (fin_probe.rs).
    pub(super) fin_probe: Option<FinProbe>,
}

/// What a node is to a flow: its source, a relay on its path, or its destination (a node is
/// never both ends of one flow).
#[derive(Debug)]
pub(super) enum Role {
    Source(SourceState),
    Relay,
    Destination(DestState),
}

impl Flow {
    pub(super) fn new(dst: NodeId, now: Instant) -> Self {
        Flow {
            dst,
            blocks: BTreeMap::new(),
            outs: BTreeMap::new(),
            deferred: BTreeMap::new(),
            last_activity: now,
            finished: false,
            e2e_cum: 0,
            e2e_fin: false,
            role: Role::Relay,
            priority: PRIORITY_NORMAL,
            block_hint: None,
            fin_probe: None,
        }
    }

    pub(super) fn source(&self) -> Option<&SourceState> {
        match &self.role {
            Role::Source(s) => Some(s),
            _ => None,
        }
    }

    pub(super) fn source_mut(&mut self) -> Option<&mut SourceState> {
        match &mut self.role {
            Role::Source(s) => Some(s),
            _ => None,
        }
    }

    pub(super) fn dest(&self) -> Option<&DestState> {
        match &self.role {
            Role::Destination(d) => Some(d),
            _ => None,
        }
    }

    pub(super) fn is_relay(&self) -> bool {
        matches!(self.role, Role::Relay)
    }

    /// Complete blocks held and not yet moved downstream (§3.3).
    pub(super) fn held_unmoved(&self) -> usize {
        self.blocks
            .values()
            .filter(|b| (b.custody || b.persisting.is_some()) && !b.moved && b.complete())
            .count()
    }

    pub(super) fn has_custody(&self) -> bool {
        self.blocks.values().any(|b| b.custody && !b.moved)
            || self.dest().is_some_and(|d| !d.writing.is_empty())
    }
}

/// At most this many closed incoming flows are remembered (about 60 bytes each): a bound
/// on memory when flows close faster than [`ClosedFlows`] may forget them.
pub(super) const CLOSED_FLOW_MEMORY: usize = 1 << 16;

/// How an incoming flow ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Closed {
    /// Every block was delivered: blocks `0..blocks`.
    Finished { blocks: u32 },
    /// Aborted by its source, or given up idle before it finished.
    Abandoned,
}

/// Flows this node was the destination of and no longer holds. A late BSYN or DATA of one
/// must not open it again from block 0, which would hold the source's later blocks forever
/// without delivering them; and a relay that still holds a block of a finished flow in
/// custody (its BACKs were lost) must hear that the block arrived, or it asks until its
/// custody expires while the source, served from the relay's cache, never gives up. So a
/// flow is remembered for as long as any node may still ask: until custody expires and
/// sources give up (see `HopTransport::housekeeping`), at most [`CLOSED_FLOW_MEMORY`] of them.
#[derive(Debug, Default)]
pub(super) struct ClosedFlows {
    order: VecDeque<(Instant, FlowKey)>,
    flows: BTreeMap<FlowKey, Closed>,
}

impl ClosedFlows {
    pub(super) fn insert(&mut self, key: FlowKey, now: Instant, how: Closed) {
        if self.flows.insert(key, how).is_none() {
            self.order.push_back((now, key));
            while self.order.len() > CLOSED_FLOW_MEMORY {
                self.forget_oldest();
            }
        }
    }

    pub(super) fn get(&self, key: &FlowKey) -> Option<Closed> {
        self.flows.get(key).copied()
    }

    /// Forget the flows closed `keep` or longer before `now`.
    pub(super) fn expire(&mut self, now: Instant, keep: Duration) {
        while self.order.front().is_some_and(|(at, _)| *at + keep <= now) {
            self.forget_oldest();
        }
    }

    fn forget_oldest(&mut self) {
        if let Some((_, old)) = self.order.pop_front() {
            self.flows.remove(&old);
        }
    }
}

impl HopTransport {
    pub(super) fn drop_block(&mut self, key: FlowKey, num: u32) {
        self.deadlines.dirty.insert(key);
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        if let Some(b) = f.blocks.remove(&num) {
            self.cache_bytes = self.cache_bytes.saturating_sub(u64::from(b.geom.block_len));
            if (b.custody || b.persisting.is_some()) && !b.moved && f.source().is_none() {
                self.store.release(key, num);
            }
        }
        f.outs.remove(&num);
        f.deferred.remove(&num);
        self.withholding.admitted.remove(&(key, num));
        self.note_cache();
    }

    pub(super) fn remove_flow(&mut self, key: FlowKey, now: Instant) {
        self.deadlines.dirty.insert(key);
        let nums: Vec<u32> = match self.flows.get(&key) {
            Some(f) => f.blocks.keys().copied().collect(),
            None => return,
        };
        for n in nums {
            self.drop_block(key, n);
        }
        if let Some(f) = self.flows.remove(&key) {
            // Room for a waiting flow of this node's own (admission.rs).
            self.waiting.recheck = true;
            match f.role {
                Role::Source(s) => {
                    self.waiting.ended(f.dst, key, s.long);
                    self.cache_bytes = self.cache_bytes.saturating_sub(s.pending_bytes as u64);
                    self.app_bytes = self.app_bytes.saturating_sub(s.pending_bytes as u64);
                    self.note_cache();
                }
                Role::Destination(d) => {
                    // Deliveries still being written (the store keeps their bytes).
                    let writing: u64 = d.writing.values().map(|w| w.data.len() as u64).sum();
                    self.cache_bytes = self.cache_bytes.saturating_sub(writing);
                    let how = if d.finished {
                        Closed::Finished {
                            blocks: d.durable(),
                        }
                    } else {
                        self.store.abandon(key);
                        self.extra("flows_abandoned");
                        self.events.push_back(Event::FlowAbandoned { flow: key });
                        Closed::Abandoned
                    };
                    self.closed.insert(key, now, how);
                }
                Role::Relay => {}
            }
        }
        self.withholding.admitted.retain(|(k, _), _| *k != key);
        self.withholding.waiting.retain(|w| w.key != key);
        self.round_robin.retain(|k| *k != key);
    }

    /// How incoming flow `key` ended, if it is closed and still remembered: closed flows
    /// are remembered while a relay may still hold their blocks in custody or a source may
    /// still try (see [`ClosedFlows`]).
    pub(super) fn closed_flow(&mut self, key: FlowKey, now: Instant) -> Option<Closed> {
        self.forget_old_closed_flows(now);
        self.closed.get(&key)
    }

    /// Forget the closed flows no node can still ask about.
    pub(super) fn forget_old_closed_flows(&mut self, now: Instant) {
        let keep = self.cfg.custody_expiry.max(self.cfg.give_up_after);
        self.closed.expire(now, keep);
    }

    /// At the flow limit, the incoming flow that finished first and holds nothing in custody
    /// (nor a delivery being written) gives up its state. A finished flow waits only for the
    /// source's FIN, which a lost frame, or a flow opened again on a relay by a late virtual
    /// retransmission, never brings: such flows would hold their slots for
    /// `flow_idle_timeout` while new flows are refused. A destination remembers the flow as
    /// closed and answers its late BSYNs as before (`answer_closed`). True if a flow was
    /// reclaimed.
    fn reclaim_finished_flow(&mut self, now: Instant) -> bool {
        let mut unready = Vec::new();
        let mut reclaimed = None;
        while let Some(k) = self.finished_flows.pop_front() {
            let Some(f) = self.flows.get(&k) else {
                continue;
            };
            let done = match f.dest() {
                Some(d) => d.finished_durably(),
                None => f.e2e_fin && f.is_relay(),
            };
            if done && !f.has_custody() {
                reclaimed = Some(k);
                break;
            }
            unready.push(k);
        }
        for k in unready.into_iter().rev() {
            self.finished_flows.push_front(k);
        }
        let Some(k) = reclaimed else {
            return false;
        };
        self.extra("finished_flows_reclaimed");
        self.remove_flow(k, now);
        true
    }

    pub(super) fn ensure_flow(
        &mut self,
        key: FlowKey,
        dst: NodeId,
        local: NodeId,
        now: Instant,
    ) -> bool {
        if let Some(f) = self.flows.get_mut(&key) {
            f.last_activity = now;
            return true;
        }
        if key.src == local {
            // A flow of ours we no longer know: finished or aborted.
            return false;
        }
        if dst == local && self.closed_flow(key, now).is_some() {
            self.extra("closed_flow_refused");
            return false;
        }
        if self.flows.len() >= self.cfg.max_flows && !self.reclaim_finished_flow(now) {
            self.extra("flows_refused");
            return false;
        }
        let mut f = Flow::new(dst, now);
        if dst == local {
            f.role = Role::Destination(DestState::default());
            self.events.push_back(Event::FlowOpened { flow: key });
        }
        self.flows.insert(key, f);
        self.stats.flows = self.flows.len() as u64;
        true
    }

    pub(super) fn on_fin(&mut self, ctx: &mut Ctx<'_>, h: &HopHeader, from: NodeId, total: u64) {
        let key = flow_key(h);
        if h.flags & FLAG_ABORT != 0 {
            let ack = h.flags & FLAG_COMPLETE != 0;
            if self.abort_received(key, h, from, total, ack) {
                return;
            }
        }
        let known = self.flows.contains_key(&key);
        self.remove_flow(key, ctx.now);
        self.stats.flows = self.flows.len() as u64;
        if h.dst == ctx.local {
            return;
        }
        if h.flags & FLAG_ABORT != 0 {
            // Passed on whether or not this node held the flow: a node further down may
            // hold its blocks (abort.rs).
            self.start_abort(ctx, key, h.dst, total);
        } else if known {
            if let Some(nh) = ctx.routing.next_hop(h.dst) {
                let msg = HopMessage {
                    header: *h,
                    body: HopBody::Fin { total_bytes: total },
                };
                self.push_ctrl(nh, &msg);
            }
        }
    }
}
