//! Backpressure (§3.3) and ack withholding (§3.5): whether a BSYN's block is admitted now,
//! the BSYNs withheld until their reason clears, and the turns upstream senders take.

use super::*;

/// The receiving side's turns (§3.5) and the BSYNs it holds back (§3.3, §3.5).
#[derive(Debug, Default)]
pub(super) struct Withholding {
    /// Upstream blocks this node is receiving now, by (flow, block).
    pub(super) admitted: BTreeMap<(FlowKey, u32), Admitted>,
    /// BSYNs withheld, answered when their reason clears.
    pub(super) waiting: Vec<Waiting>,
    /// The sender whose block completed last (ack withholding hands the next turn to the
    /// others first).
    pub(super) last_holder: Option<NodeId>,
}

/// Why a BSYN was not answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Withhold {
    /// Backpressure: H blocks held, or custody storage full (§3.3).
    Backpressure,
    /// Another upstream sender holds the receiver (§3.5).
    AckWithholding,
}

/// A BSYN that was withheld, answered when the reason clears.
#[derive(Debug, Clone)]
pub(super) struct Waiting {
    pub(super) from: NodeId,
    pub(super) key: FlowKey,
    pub(super) dst: NodeId,
    pub(super) block: u32,
    pub(super) offset: u64,
    pub(super) geom: BlockGeom,
    pub(super) flags: u8,
    pub(super) ttl: u8,
    /// Latest BSYN for this block (the sender's retries refresh it).
    pub(super) at: Instant,
    /// First BSYN for this block that was withheld: turns go in this order.
    pub(super) since: Instant,
    pub(super) reason: Withhold,
}

/// An upstream block this node is receiving (ack withholding bookkeeping).
#[derive(Debug, Clone, Copy)]
pub(super) struct Admitted {
    /// When the sender was last heard (a silent sender loses its turn after
    /// `withhold_timeout`).
    pub(super) last_heard: Instant,
    /// When the turn began, and the packets of the block held then (`turn_horizon`).
    pub(super) since: Instant,
    pub(super) held_at_start: u32,
}

impl HopTransport {
    /// Complete blocks this node holds as a relay and has not moved downstream, per next
    /// hop, over all flows (`next_hop_backpressure`).
    pub(super) fn relayed_unmoved(&self, routing: &dyn Routing) -> BTreeMap<NodeId, usize> {
        let mut held = BTreeMap::new();
        for f in self.flows.values().filter(|f| f.is_relay()) {
            let n = f.held_unmoved();
            if n > 0 {
                if let Some(next_hop) = routing.next_hop(f.dst) {
                    *held.entry(next_hop).or_insert(0) += n;
                }
            }
        }
        held
    }

    /// Complete blocks held as a relay toward `dst`'s next hop, from a count per next hop.
    pub(super) fn held_toward(
        relayed: &BTreeMap<NodeId, usize>,
        routing: &dyn Routing,
        dst: NodeId,
    ) -> usize {
        routing
            .next_hop(dst)
            .and_then(|nh| relayed.get(&nh).copied())
            .unwrap_or(0)
    }

    /// Admission of a BSYN's block (backpressure, custody room, ack withholding);
    /// `around.held_toward(dst)`: complete blocks this node holds as a relay toward `dst`'s
    /// next hop (see `relayed_unmoved`), looked up only when backpressure per next hop
    /// applies; `around.exit_of`: a destination's distance for `nearest_exit_first`.
    pub(super) fn may_admit(
        &self,
        key: FlowKey,
        n: u32,
        from: NodeId,
        geom: BlockGeom,
        flags: u8,
        around: &Around<'_>,
    ) -> Result<(), Withhold> {
        let (held_toward, exit_of) = (around.held_toward, around.exit_of);
        let micro = flags & FLAG_MICRO != 0;
        // A block older than every block held here repairs a block the destination is
        // missing (a virtual retransmission, or a relay's transfer started again after its
        // next hop lost the block in a crash); holding it back behind H blocks that wait for
        // exactly this repair would deadlock the flow. (A newer block, premature VTX or not,
        // obeys H like any other.)
        let repair = self.flows.get(&key).is_some_and(|f| {
            f.blocks
                .iter()
                .filter(|(_, b)| b.custody && !b.moved && b.complete())
                .all(|(m, _)| n < *m)
        });
        let Some(f) = self.flows.get(&key) else {
            return Ok(());
        };
        if let Some(b) = f.blocks.get(&n) {
            // The block this node is receiving from `from` now. One admitted earlier and
            // released since (its sender went silent) asks again like any other.
            let current =
                b.admitted_from == Some(from) && self.withholding.admitted.contains_key(&(key, n));
            if current || b.complete() {
                return Ok(());
            }
        }
        let unblocks_delivery = f.dest().is_some_and(|d| d.next_deliver == n);
        if f.dest().is_some_and(|d| d.blocked || d.write_failing) && !unblocks_delivery {
            return Err(Withhold::Backpressure);
        }
        if self.cfg.backpressure
            && !unblocks_delivery
            && !repair
            && f.held_unmoved() >= self.cfg.backpressure_limit.max(1)
        {
            return Err(Withhold::Backpressure);
        }
        // Backpressure per next hop: a relay takes no more blocks for a next hop than H over
        // all flows. (A flow that holds no complete block here repairs nothing.) A micro-block
        // passes: §3.6 keeps small transfers from waiting behind large blocks, and a flow's
        // opening block is one, so a flow starts behind a relay whose quota is held by blocks
        // that move slowly. H per flow still bounds what each flow holds here.
        if self.cfg.backpressure
            && self.cfg.next_hop_backpressure
            && !micro
            && f.is_relay()
            && !(repair && f.held_unmoved() > 0)
            && held_toward(f.dst) >= self.cfg.backpressure_limit.max(1)
        {
            return Err(Withhold::Backpressure);
        }
        let have = f
            .blocks
            .get(&n)
            .map(|b| u64::from(b.geom.block_len))
            .unwrap_or(0);
        // A block held under another geometry (a waiting BSYN from before the source
        // restarted) is replaced, so it may hold more than the BSYN asks for.
        if !self.protected_fit(u64::from(geom.block_len), have) {
            return Err(Withhold::Backpressure);
        }
        if self.cfg.ack_withholding && !micro {
            // One block at a time (§3.5: the receiver "is only receiving one block from any
            // sender at a given time"), also from the sender it is serving: a sender with
            // blocks of many flows for this node (a bridge relay) would otherwise keep
            // several in progress and never let the others' turn come.
            if !self.withholding.admitted.is_empty() {
                return Err(Withhold::AckWithholding);
            }
            // Fairness: a sender that just finished does not jump ahead of waiting senders;
            // no block goes ahead of a waiting block of a higher class, nor (with
            // `nearest_exit_first`) of one nearer its destination.
            let rank = self.rank(key);
            // Only the rule reads how long this block has waited (a walk of the waiters).
            let my_since = self.cfg.nearest_exit_first.then(|| {
                self.withholding
                    .waiting
                    .iter()
                    .find(|w| w.key == key && w.block == n)
                    .map(|w| w.since)
            });
            let my_since = my_since.flatten();
            let mine = exit_of(f.dst, my_since);
            let waiting_first = self.withholding.waiting.iter().any(|w| {
                let theirs = self.rank(w.key);
                let their_exit = exit_of(w.dst, Some(w.since));
                w.reason == Withhold::AckWithholding
                    && (theirs > rank
                        || (theirs == rank && their_exit < mine)
                        || (theirs == rank
                            && their_exit == mine
                            && w.from != from
                            && size_rank(&self.cfg, w.geom.block_len)
                                <= size_rank(&self.cfg, geom.block_len)))
            });
            if waiting_first {
                return Err(Withhold::AckWithholding);
            }
        }
        Ok(())
    }

    /// Answer withheld BSYNs whose reason cleared: the highest class first (an extension),
    /// then (with `nearest_exit_first`) the blocks nearest their destination, then small
    /// blocks, smallest first (§3.6, see `size_rank`), then the senders other than the one
    /// just served, then in the order they first asked (§3.5).
    pub(super) fn service_waiting(&mut self, ctx: &mut Ctx<'_>) {
        if self.withholding.waiting.is_empty() {
            return;
        }
        let mut list = std::mem::take(&mut self.withholding.waiting);
        let last = self.withholding.last_holder;
        let rule = NearestExit::of(&self.cfg);
        let (local, routing, now) = (ctx.local, ctx.routing, ctx.now);
        let exit_of = |dst, since| rule.distance(local, routing, now, dst, since);
        list.sort_by_key(|w| {
            (
                std::cmp::Reverse(self.rank(w.key)),
                exit_of(w.dst, Some(w.since)),
                size_rank(&self.cfg, w.geom.block_len),
                Some(w.from) == last,
                w.since,
            )
        });
        // Each is evaluated against the waiters kept so far, which are put back as it goes.
        // What relays hold per next hop is counted once, and again after each admission.
        let mut relayed = self.relayed_unmoved(ctx.routing);
        for w in list {
            if self
                .may_admit(
                    w.key,
                    w.block,
                    w.from,
                    w.geom,
                    w.flags & !FLAG_MICRO,
                    &Around {
                        held_toward: &|dst| Self::held_toward(&relayed, ctx.routing, dst),
                        exit_of: &exit_of,
                    },
                )
                .is_ok()
            {
                let bsyn = BsynIn {
                    from: w.from,
                    header: Self::header(w.key, w.dst, w.block, w.flags & !FLAG_MICRO, w.ttl),
                    offset: w.offset,
                    geom: w.geom,
                    packet_num: 0,
                    payload: &[],
                    expect: 0,
                    round_end: None,
                    retry: true,
                };
                self.extra("turns_given");
                self.on_bsyn(ctx, &bsyn);
                let k = w.key;
                self.pump_flow(ctx, k);
                relayed = self.relayed_unmoved(ctx.routing);
            } else {
                self.withholding.waiting.push(w);
            }
        }
    }
}

/// A waiting block's place in the turn order by size: a small block (at most 1/16 of the
/// block size: a short transfer's whole block, or the first block of a flow under the block
/// ramp) goes first, smallest first, after the paper's block-size based policy (§3.6); every
/// larger block ranks the same, so turns among them go in the order first asked (§3.5).
/// Ordering those by size too would hold a flow's whole first block back behind every
/// smaller block of the flows already running, which cut blocks sized to shared turns.
fn size_rank(cfg: &HopConfig, block_len: u32) -> u32 {
    let small = u32::try_from(smallest_ask(cfg)).unwrap_or(u32::MAX);
    if block_len <= small {
        block_len
    } else {
        u32::MAX
    }
}

/// What admission looks up beyond the flow: complete blocks held as a relay toward a
/// destination's next hop, and a destination's distance for `nearest_exit_first`.
pub(super) struct Around<'a> {
    pub(super) held_toward: &'a dyn Fn(NodeId) -> usize,
    pub(super) exit_of: &'a dyn Fn(NodeId, Option<Instant>) -> u8,
}

/// `nearest_exit_first` and its age, copied out of the configuration.
#[derive(Debug, Clone, Copy)]
pub(super) struct NearestExit {
    on: bool,
    age: Duration,
}

impl NearestExit {
    pub(super) fn of(cfg: &HopConfig) -> Self {
        NearestExit {
            on: cfg.nearest_exit_first,
            age: cfg.nearest_exit_age,
        }
    }

    /// How far a withheld block of a flow to `dst` is from leaving the mesh: 0 when this
    /// node (`local`) is its destination, 1 when its next hop is, 2 otherwise. 0 for every
    /// block when the rule is off, and for a block withheld since `since` for the rule's age
    /// or longer: it then takes its turn in the order asked.
    pub(super) fn distance(
        self,
        local: NodeId,
        routing: &dyn Routing,
        now: Instant,
        dst: NodeId,
        since: Option<Instant>,
    ) -> u8 {
        let aged = !self.age.is_zero()
            && since.is_some_and(|s| now.saturating_duration_since(s) >= self.age);
        if !self.on || aged || dst == local {
            0
        } else if routing.next_hop(dst) == Some(dst) {
            1
        } else {
            2
        }
    }
}
