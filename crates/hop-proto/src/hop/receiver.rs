//! Per-hop block transfer, receiving side (§3.1): answering BSYNs, taking DATA (and caching
//! overheard DATA, §3.2), and BACKs with their deferral.

use super::*;

/// A DATA packet as the receiving side takes it.
#[derive(Debug, Clone, Copy)]
pub(super) struct DataIn<'a> {
    pub(super) header: HopHeader,
    pub(super) offset: u64,
    pub(super) geom: BlockGeom,
    pub(super) packet_num: u16,
    pub(super) payload: &'a [u8],
}

/// A BSYN as the receiving side takes it: from the link, or again from the list of withheld
/// BSYNs when its turn comes (`retry`).
#[derive(Debug, Clone, Copy)]
pub(super) struct BsynIn<'a> {
    /// The upstream neighbour that sent it.
    pub(super) from: NodeId,
    pub(super) header: HopHeader,
    pub(super) offset: u64,
    pub(super) geom: BlockGeom,
    /// A micro-block's packet number and payload (empty otherwise).
    pub(super) packet_num: u16,
    pub(super) payload: &'a [u8],
    /// Packets the sender handed to its link (§3.1 rounds; 0 for a micro-block).
    pub(super) expect: u16,
    /// The last DATA packet the sender handed to its link before this BSYN (not for a
    /// micro-block): once it is here, the round's data has arrived or is lost.
    pub(super) round_end: Option<u32>,
    pub(super) retry: bool,
}

impl HopTransport {
    pub(super) fn send_back(&mut self, key: FlowKey, n: u32, to: NodeId, now: Instant) {
        self.send_back_flagged(key, n, to, now, 0);
    }

    /// `send_back` with more flags (`END_HEARD`).
    fn send_back_flagged(&mut self, key: FlowKey, n: u32, to: NodeId, now: Instant, more: u8) {
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let dst = f.dst;
        let delivered = f.dest().is_some_and(|d| n < d.next_deliver) || n < f.e2e_cum || f.e2e_fin;
        let (len, bits, complete, fin, duplicates) = match f.blocks.get_mut(&n) {
            Some(b) => {
                b.last_used = now;
                b.last_back = Some(now);
                let mut bits = Vec::with_capacity(b.have.len().div_ceil(8) as usize);
                b.have.write_bytes(&mut bits);
                let dups = std::mem::take(&mut b.dups);
                (
                    b.geom.block_len,
                    (b.have.len(), bits),
                    b.complete(),
                    b.fin,
                    dups,
                )
            }
            None if delivered => (0, (0, Vec::new()), true, false, 0),
            None => return,
        };
        let mut flags = more | if complete { FLAG_COMPLETE } else { 0 };
        if fin {
            flags |= FLAG_FIN;
        }
        let (packets, bitmap) = bits;
        // Blocks sized to shared turns: this node's ask, or a smaller one from beyond it.
        let downstream = f.block_hint.filter(|_| f.dest().is_none());
        let own = self.shared_turns.own_hint(&self.cfg, now);
        let block_hint_kib = hint_to_kib(smaller_hint(own, downstream));
        let msg = HopMessage {
            header: Self::header(key, dst, n, flags, 0),
            body: HopBody::Back {
                block_len: len,
                packets: packets as u16,
                duplicates,
                block_hint_kib,
                ctl: ControlSeq::default(),
                bitmap: &bitmap,
            },
        };
        self.push_ctrl(to, &msg);
    }

    /// Answer a BSYN now, or remember it if withheld (§3.1, §3.3, §3.5); a micro-block's
    /// BSYN also carries one of its packets (§3.6).
    pub(super) fn on_bsyn(&mut self, ctx: &mut Ctx<'_>, bsyn: &BsynIn<'_>) {
        let now = ctx.now;
        let (h, from) = (&bsyn.header, bsyn.from);
        let (key, n) = (flow_key(h), h.block_num);
        if h.dst == ctx.local && self.answer_closed(ctx, key, n, from) {
            return;
        }
        if !self.ensure_flow(key, h.dst, ctx.local, now) {
            return;
        }
        if h.flags & FLAG_MICRO == 0 {
            self.shared_turns.note(key, now);
        }
        if self.answer_delivered(ctx, key, n, from)
            || self.answer_for_destination(now, key, n, from)
        {
            return;
        }
        let complete_here = self.check_geometry(key, n, bsyn.geom);
        if h.flags & FLAG_VTX != 0 && !bsyn.retry {
            // A virtual retransmission served (wholly or partly) from this node's cache.
            let held = self
                .flows
                .get(&key)
                .and_then(|f| f.blocks.get(&n))
                .is_some_and(|b| b.geom == bsyn.geom && b.have.count() > 0);
            if held {
                self.extra("cache_hits");
            }
        }
        if !complete_here {
            let routing = ctx.routing;
            let held_toward = |dst| Self::held_toward(&self.relayed_unmoved(routing), routing, dst);
            let (rule, local) = (NearestExit::of(&self.cfg), ctx.local);
            let exit_of = |dst, since| rule.distance(local, routing, now, dst, since);
            let around = Around {
                held_toward: &held_toward,
                exit_of: &exit_of,
            };
            if let Err(reason) = self.may_admit(key, n, from, bsyn.geom, h.flags, &around) {
                if !bsyn.retry {
                    self.withhold(now, bsyn, reason);
                }
                return;
            }
        }
        let Some((complete, ask)) = self.take_bsyn(now, ctx.local, bsyn) else {
            return;
        };
        self.note_cache();
        let micro = h.flags & FLAG_MICRO != 0;
        if complete {
            self.block_completed(ctx, key, n, from);
            if ask || !micro {
                self.send_back_checked(ctx, key, n, from);
            }
        } else if ask {
            self.answer_or_defer(
                now,
                (key, n, from),
                (!micro).then_some((bsyn.expect, bsyn.round_end)),
                h.flags & FLAG_BEHIND != 0,
            );
        }
        self.evict();
    }

    /// At the destination, a block already delivered is acknowledged again, hop and end to
    /// end. True if the BSYN was answered so.
    fn answer_delivered(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, n: u32, from: NodeId) -> bool {
        let delivered = self
            .flows
            .get(&key)
            .and_then(|f| f.dest())
            .is_some_and(|d| n < d.next_deliver || d.finished);
        if delivered {
            self.send_back(key, n, from, ctx.now);
            self.send_e2e(ctx, key, n);
        }
        delivered
    }

    /// At the destination, a BSYN of a flow it finished and no longer holds is answered as
    /// while it held it: the block arrived (hop BACK) and the flow is delivered (end-to-end
    /// BACK with FIN), so the relay asking releases its custody and the source completes.
    /// True if the flow is closed (a BSYN of an abandoned flow gets no answer).
    fn answer_closed(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, n: u32, from: NodeId) -> bool {
        let Some(how) = self.closed_flow(key, ctx.now) else {
            return false;
        };
        let Closed::Finished { blocks } = how else {
            self.extra("closed_flow_refused");
            return true;
        };
        self.extra("closed_flow_answered");
        if n < blocks {
            let back = HopMessage {
                header: Self::header(key, ctx.local, n, FLAG_COMPLETE, 0),
                body: HopBody::Back {
                    block_len: 0,
                    packets: 0,
                    duplicates: 0,
                    block_hint_kib: 0,
                    ctl: ControlSeq::default(),
                    bitmap: &[],
                },
            };
            self.push_ctrl(from, &back);
        }
        let e2e = HopMessage {
            header: Self::header(key, ctx.local, n, FLAG_FIN, 0),
            body: HopBody::E2eBack { cum_blocks: blocks },
        };
        if let Some(next_hop) = ctx.routing.next_hop(key.src) {
            self.push_ctrl(next_hop, &e2e);
        }
        true
    }

    /// A relay that saw the end-to-end BACK for block `n` answers for the destination: this
    /// is how the acknowledgement crosses a partition that swallowed it (the source's virtual
    /// retransmission probes for it hop by hop, §3.2). True if the BSYN was answered so.
    fn answer_for_destination(&mut self, now: Instant, key: FlowKey, n: u32, from: NodeId) -> bool {
        let known = self
            .flows
            .get(&key)
            .filter(|f| f.is_relay())
            .filter(|f| n < f.e2e_cum || f.e2e_fin)
            .map(|f| (f.e2e_cum, f.e2e_fin, f.dst));
        let Some((cum, fin, dst)) = known else {
            return false;
        };
        self.send_back(key, n, from, now);
        let msg = HopMessage {
            header: Self::header(key, dst, n, if fin { FLAG_FIN } else { 0 }, 0),
            body: HopBody::E2eBack { cum_blocks: cum },
        };
        self.push_ctrl(from, &msg);
        true
    }

    /// A block held under another geometry than the BSYN's (a restarted source) starts
    /// afresh. True if the block is held complete in the BSYN's geometry.
    fn check_geometry(&mut self, key: FlowKey, n: u32, geom: BlockGeom) -> bool {
        let held = self
            .flows
            .get(&key)
            .and_then(|f| f.blocks.get(&n))
            .map(|b| (b.geom == geom, b.complete()));
        if held.is_some_and(|(same, _)| !same) {
            self.drop_block(key, n);
        }
        held.is_some_and(|(same, complete)| same && complete)
    }

    /// Remember a BSYN that may not be answered now (`reason`): it is answered when the
    /// reason clears (`service_waiting`), senders in the order they first asked (§3.5).
    fn withhold(&mut self, now: Instant, bsyn: &BsynIn<'_>, reason: Withhold) {
        let h = &bsyn.header;
        let (key, n, from) = (flow_key(h), h.block_num, bsyn.from);
        self.extra(match reason {
            Withhold::Backpressure => "backpressure_withheld",
            Withhold::AckWithholding => "acks_withheld",
        });
        let waiting = &mut self.withholding.waiting;
        let same = |w: &Waiting| w.key == key && w.block == n && w.from == from;
        let since = waiting.iter().find(|w| same(w)).map_or(now, |w| w.since);
        waiting.retain(|w| !same(w));
        waiting.push(Waiting {
            since,
            from,
            key,
            dst: h.dst,
            block: n,
            offset: bsyn.offset,
            geom: bsyn.geom,
            flags: h.flags,
            ttl: h.ttl,
            at: now,
            reason,
        });
    }

    /// Take an admitted BSYN's block: hold (or refresh) it, note who sends it, mark a
    /// virtual retransmission for forwarding, and store a micro-block's packet. Returns
    /// whether the block is complete here and whether the BSYN asks for a BACK.
    fn take_bsyn(
        &mut self,
        now: Instant,
        local: NodeId,
        bsyn: &BsynIn<'_>,
    ) -> Option<(bool, bool)> {
        let h = &bsyn.header;
        let (key, n, from) = (flow_key(h), h.block_num, bsyn.from);
        let micro = h.flags & FLAG_MICRO != 0;
        let fin = h.flags & FLAG_FIN != 0;
        let f = self.flows.get_mut(&key)?;
        if !f.blocks.contains_key(&n) {
            self.cache_bytes += u64::from(bsyn.geom.block_len);
        }
        let b = f
            .blocks
            .entry(n)
            .or_insert_with(|| Block::new(bsyn.offset, bsyn.geom, fin, now));
        b.offset = bsyn.offset;
        b.fin |= fin;
        b.last_used = now;
        b.admitted_from = Some(from);
        if h.flags & FLAG_VTX != 0 && h.dst != local && h.ttl > 1 {
            // Forward the repair; a block already moved downstream is served from the cache
            // without taking custody again (the source still holds it until the end-to-end
            // BACK).
            b.vtx_fwd = Some(h.ttl - 1);
        }
        let mut ask = !micro || h.flags & FLAG_ASK != 0;
        if micro && !bsyn.payload.is_empty() {
            let was = b.complete();
            b.store(u32::from(bsyn.packet_num), bsyn.payload, None);
            b.last_data = now;
            if b.complete() && !was {
                ask = true;
            }
        }
        let complete = b.complete();
        let held_at_start = b.have.count();
        if !complete {
            self.withholding
                .admitted
                .entry((key, n))
                .and_modify(|a| a.last_heard = now)
                .or_insert(Admitted {
                    last_heard: now,
                    since: now,
                    held_at_start,
                });
        }
        Some((complete, ask))
    }

    /// Answer a BSYN of an incomplete block at once when every packet the sender handed to
    /// its link is here (`expect`; None for a micro-block, whose packets ride on its BSYNs),
    /// or when the round's last packet (`round_end`) arrived before the BSYN, since the last
    /// BACK: the sender's data queue is FIFO, so the packets still missing were lost.
    /// Otherwise wait for the data still behind the BSYN, until it has paused for
    /// `back_quiet` (then the BACK reports the packets lost). A BSYN that overtook its data
    /// (802.11's voice queue, §3.6) keeps that wait even when the round's end arrives: the
    /// pause is air for other senders of this node, and a small file next to a hidden bulk
    /// sender gets through in it (docs/design/hop.md#round-end).
    fn answer_or_defer(
        &mut self,
        now: Instant,
        (key, n, from): (FlowKey, u32, NodeId),
        round: Option<(u16, Option<u32>)>,
        behind: bool,
    ) {
        let quiet = self.cfg.back_quiet;
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let (held, last, data_this_round, newest) = f
            .blocks
            .get(&n)
            .map(|b| {
                let fresh = b.last_back.is_none_or(|t| b.last_data > t);
                (b.have.count(), b.last_data, fresh, b.newest_data)
            })
            .unwrap_or((0, Instant::ZERO, false, None));
        // Data of this round that has already paused for `back_quiet` was lost, not delayed;
        // with none yet, it is still queued behind the BSYN.
        let due = if data_this_round {
            last + quiet
        } else {
            now + quiet
        };
        // The round's end is the newest packet here when the BSYN comes: the BSYN came
        // behind its data (also when a BACK went since, to an earlier copy or try of it),
        // which the BACK tells the sender (rounds_behind.rs).
        let round_end = round.and_then(|r| r.1);
        let end_heard = round_end.is_some() && newest == round_end;
        match round {
            // A BSYN behind its data is answered at once: what is missing was lost.
            Some((expect, _))
                if held < u32::from(expect)
                    && due > now
                    && !(data_this_round && end_heard)
                    && !behind =>
            {
                f.deferred.insert(
                    n,
                    DeferredBack {
                        to: from,
                        due,
                        expect,
                    },
                );
            }
            _ => {
                f.deferred.remove(&n);
                let more = if end_heard { FLAG_END_HEARD } else { 0 };
                self.send_back_flagged(key, n, from, now, more);
            }
        }
    }

    /// A DATA packet from the sender of its block, or overheard (cached, §3.2).
    pub(super) fn on_data(&mut self, ctx: &mut Ctx<'_>, rx: &Received<'_>, data: &DataIn<'_>) {
        let now = ctx.now;
        let (key, n) = (flow_key(&data.header), data.header.block_num);
        if !self.data_wanted(ctx, rx, data) {
            return;
        }
        let Some((was_complete, complete, upstream)) = self.store_data(now, rx, data) else {
            return;
        };
        if let Some(a) = self.withholding.admitted.get_mut(&(key, n)) {
            a.last_heard = now;
        }
        self.note_cache();
        if complete && !was_complete {
            if let Some(up) = upstream {
                self.block_completed(ctx, key, n, up);
                // Answer the upstream at once: it is waiting for this BACK.
                self.send_back_checked(ctx, key, n, up);
            }
            self.service_waiting(ctx);
        } else if !rx.overheard && !complete {
            self.release_deferred_back(now, key, n);
        }
        self.evict();
    }

    /// Whether this node keeps a DATA packet: not its own overheard, not of a flow it is the
    /// source of or has delivered, not a late copy of a block delivered end to end, and,
    /// cached for a flow it holds nothing of, only if it fits beside custody. A block held
    /// under another geometry is dropped for the sender's (an overheard one is not kept).
    fn data_wanted(&mut self, ctx: &mut Ctx<'_>, rx: &Received<'_>, data: &DataIn<'_>) -> bool {
        let h = &data.header;
        let (key, n, geom) = (flow_key(h), h.block_num, data.geom);
        if rx.overheard && (!self.cfg.cache_overheard || h.src == ctx.local) {
            return false;
        }
        if !self.flows.contains_key(&key)
            && (rx.overheard || h.dst != ctx.local)
            && !self.protected_fit(u64::from(geom.block_len), 0)
        {
            return false;
        }
        if !self.ensure_flow(key, h.dst, ctx.local, ctx.now) {
            return false;
        }
        let Some(f) = self.flows.get(&key) else {
            return false;
        };
        if f.dest().is_some_and(|d| n < d.next_deliver || d.finished) || f.source().is_some() {
            return false;
        }
        if f.dest().is_none() && (n < f.e2e_cum || f.e2e_fin) && !f.blocks.contains_key(&n) {
            // Late copies of a block already delivered end to end (its BACK overtook them):
            // keeping them would start a new transfer of a finished block.
            return false;
        }
        if f.blocks.get(&n).is_some_and(|b| b.geom != geom) {
            if rx.overheard {
                return false;
            }
            self.drop_block(key, n);
        }
        true
    }

    /// Store a DATA packet in its block (created if new). Returns whether the block was
    /// complete before, is complete now, and the upstream neighbour it comes from.
    fn store_data(
        &mut self,
        now: Instant,
        rx: &Received<'_>,
        data: &DataIn<'_>,
    ) -> Option<(bool, bool, Option<NodeId>)> {
        let h = &data.header;
        let (key, n, p) = (flow_key(h), h.block_num, u32::from(data.packet_num));
        let f = self.flows.get_mut(&key)?;
        if !f.blocks.contains_key(&n) {
            self.cache_bytes += u64::from(data.geom.block_len);
        }
        let b = f
            .blocks
            .entry(n)
            .or_insert_with(|| Block::new(data.offset, data.geom, false, now));
        // Every DATA packet of a flow's last block carries FIN: the block may complete here
        // from DATA alone (its BSYN was withheld, and the sender sent the packets that
        // follow a BSYN at once), and without it the destination would never finish.
        b.fin |= h.flags & FLAG_FIN != 0;
        let was_complete = b.complete();
        let fresh = b.store(p, data.payload, rx.shared);
        b.last_used = now;
        if !rx.overheard {
            b.last_data = now;
            b.newest_data = Some(p);
            if !fresh && b.overheard.get(p) {
                // First copy from its sender; the one held was overheard.
                b.overheard.unset(p);
            } else if !fresh {
                // A copy of a packet already here: its sender gave up one that was late.
                b.dups = b.dups.saturating_add(1);
                bump(&mut self.stats.extra, "data_duplicates");
            }
            if b.admitted_from.is_none() {
                b.admitted_from = Some(rx.link_src);
            }
        } else if fresh {
            b.overheard.set(p);
            bump(&mut self.stats.extra, "overheard_cached");
        }
        Some((was_complete, b.complete(), b.admitted_from))
    }

    /// A deferred BACK goes as soon as the packets its BSYN announced are here; otherwise its
    /// deadline stays `back_quiet` after the newest packet.
    fn release_deferred_back(&mut self, now: Instant, key: FlowKey, n: u32) {
        let quiet = self.cfg.back_quiet;
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let held = f.blocks.get(&n).map_or(0, |b| b.have.count());
        let Some(d) = f.deferred.get_mut(&n) else {
            return;
        };
        if held < u32::from(d.expect) {
            d.due = now + quiet;
            return;
        }
        let up = d.to;
        f.deferred.remove(&n);
        self.send_back(key, n, up, now);
    }
}
