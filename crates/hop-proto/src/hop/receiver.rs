//! Per-hop block transfer, receiving side (§3.1): answering BSYNs, taking DATA (and caching
//! overheard DATA, §3.2), and BACKs with their deferral.

use super::*;

impl HopTransport {
    pub(super) fn send_back(&mut self, key: FlowKey, n: u32, to: NodeId, now: Instant) {
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let dst = f.dst;
        let delivered = f.dest().is_some_and(|d| n < d.next_deliver) || n < f.e2e_cum || f.e2e_fin;
        let (len, bits, complete, fin, duplicates) = match f.blocks.get_mut(&n) {
            Some(b) => {
                b.last_used = now;
                b.last_back = Some(now);
                if let Some(a) = self.withholding.admitted.get_mut(&(key, n)) {
                    a.base = b.have.count();
                }
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
        let mut flags = if complete { FLAG_COMPLETE } else { 0 };
        if fin {
            flags |= FLAG_FIN;
        }
        let (packets, bitmap) = bits;
        let msg = HopMessage {
            header: Self::header(key, dst, n, flags, 0),
            body: HopBody::Back {
                block_len: len,
                packets: packets as u16,
                duplicates,
                bitmap: &bitmap,
            },
        };
        self.push_ctrl(to, &msg);
    }

    /// Answer a BSYN now, or remember it if withheld.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_bsyn(
        &mut self,
        ctx: &mut Ctx<'_>,
        from: NodeId,
        h: &HopHeader,
        offset: u64,
        geom: BlockGeom,
        packet_num: u16,
        expect: u16,
        payload: &[u8],
        retry: bool,
    ) {
        let now = ctx.now;
        let key = FlowKey {
            src: h.src,
            id: h.flow_id,
        };
        let n = h.block_num;
        let micro = h.flags & FLAG_MICRO != 0;
        let vtx = h.flags & FLAG_VTX != 0;
        if !self.ensure_flow(key, h.dst, ctx.local, now) {
            return;
        }
        let is_dest = h.dst == ctx.local;
        // Already delivered at the destination: acknowledge again, hop and end to end.
        let delivered = self
            .flows
            .get(&key)
            .and_then(|f| f.dest())
            .is_some_and(|d| n < d.next_deliver || d.finished);
        if delivered {
            self.send_back(key, n, from, now);
            self.send_e2e(ctx, key, n);
            return;
        }
        // A relay that saw the end-to-end BACK answers for the destination: this is how the
        // acknowledgement crosses a partition that swallowed it (the source's virtual
        // retransmission probes for it hop by hop).
        let known = self
            .flows
            .get(&key)
            .filter(|f| f.is_relay())
            .filter(|f| n < f.e2e_cum || f.e2e_fin)
            .map(|f| (f.e2e_cum, f.e2e_fin, f.dst));
        if let Some((cum, fin, dst)) = known {
            self.send_back(key, n, from, now);
            let msg = HopMessage {
                header: Self::header(key, dst, n, if fin { FLAG_FIN } else { 0 }, 0),
                body: HopBody::E2eBack { cum_blocks: cum },
            };
            self.push_ctrl(from, &msg);
            return;
        }
        let existing_ok = self
            .flows
            .get(&key)
            .and_then(|f| f.blocks.get(&n))
            .map(|b| (b.geom == geom, b.complete()));
        if existing_ok.is_some_and(|(same, _)| !same) {
            // Geometry changed (a restarted source): start the block afresh.
            self.drop_block(key, n);
        }
        let complete_here = existing_ok.is_some_and(|(same, c)| same && c);
        if !retry && !complete_here {
            self.end_long_turn(ctx, key, n, from, geom, expect);
        }
        if vtx && !retry {
            // A virtual retransmission served (wholly or partly) from this node's cache.
            let held = self
                .flows
                .get(&key)
                .and_then(|f| f.blocks.get(&n))
                .is_some_and(|b| b.geom == geom && b.have.count() > 0);
            if held {
                self.extra("cache_hits");
            }
        }
        if !complete_here {
            if let Err(w) = self.may_admit(key, n, from, geom, h.flags) {
                if !retry {
                    self.extra(match w {
                        Withhold::Backpressure => "backpressure_withheld",
                        Withhold::AckWithholding => "acks_withheld",
                    });
                    let since = self
                        .withholding
                        .waiting
                        .iter()
                        .find(|x| x.key == key && x.block == n && x.from == from)
                        .map_or(now, |x| x.since);
                    self.withholding
                        .waiting
                        .retain(|x| !(x.key == key && x.block == n && x.from == from));
                    self.withholding.waiting.push(Waiting {
                        since,
                        from,
                        key,
                        dst: h.dst,
                        block: n,
                        offset,
                        geom,
                        flags: h.flags,
                        ttl: h.ttl,
                        at: now,
                        reason: w,
                    });
                }
                if self.cfg.wait_notice {
                    // Tell the sender it is queued, so it does not keep asking; its BACK
                    // comes when its turn does (`service_waiting`).
                    let msg = HopMessage {
                        header: Self::header(key, h.dst, n, FLAG_WAIT, 0),
                        body: HopBody::Back {
                            block_len: geom.block_len,
                            packets: 0,
                            duplicates: 0,
                            bitmap: &[],
                        },
                    };
                    self.push_ctrl(from, &msg);
                }
                // Keep a micro payload anyway if the block is known; it costs nothing more.
                return;
            }
        }
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        if !f.blocks.contains_key(&n) {
            self.cache_bytes += u64::from(geom.block_len);
        }
        let b = f
            .blocks
            .entry(n)
            .or_insert_with(|| Block::new(offset, geom, h.flags & FLAG_FIN != 0, now));
        b.offset = offset;
        b.fin |= h.flags & FLAG_FIN != 0;
        b.last_used = now;
        if b.admitted_from.is_none() || b.admitted_from != Some(from) {
            b.admitted_from = Some(from);
        }
        if vtx && !is_dest && h.ttl > 1 {
            // Forward the repair; a block already moved downstream is served from the cache
            // without taking custody again (the source still holds it until the end-to-end
            // BACK).
            b.vtx_fwd = Some(h.ttl - 1);
        }
        let mut ask = !micro || h.flags & FLAG_ASK != 0;
        if micro && !payload.is_empty() {
            let was = b.complete();
            b.store(u32::from(packet_num), payload);
            b.last_data = now;
            if b.complete() && !was {
                ask = true;
            }
        }
        let complete = b.complete();
        if !complete {
            let base = b.have.count();
            self.withholding
                .admitted
                .entry((key, n))
                .and_modify(|a| a.last_heard = now)
                .or_insert(Admitted {
                    last_heard: now,
                    sent: 0,
                    base,
                });
        }
        self.note_cache();
        if complete {
            self.block_completed(ctx, key, n, from);
            if ask || !micro {
                self.send_back_checked(ctx, key, n, from);
            }
        } else if ask {
            // Answer at once when every packet the sender handed to its link is here;
            // otherwise wait for the data still behind this BSYN, until it has paused for
            // `back_quiet` (then the BACK reports the packets lost).
            let quiet = self.cfg.back_quiet;
            let Some(f) = self.flows.get_mut(&key) else {
                return;
            };
            let (held, last, data_this_round) = f
                .blocks
                .get(&n)
                .map(|b| {
                    let fresh = b.last_back.map_or(true, |t| b.last_data > t);
                    (b.have.count(), b.last_data, fresh)
                })
                .unwrap_or((0, Instant::ZERO, false));
            // Data of this round that has already paused for `back_quiet` was lost, not
            // delayed; with none yet, it is still queued behind the BSYN.
            let due = if data_this_round {
                last + quiet
            } else {
                now + quiet
            };
            if !micro && held < u32::from(expect) && due > now {
                f.deferred.insert(n, (from, due, expect));
            } else {
                f.deferred.remove(&n);
                self.send_back(key, n, from, now);
            }
        }
        self.evict();
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_data(
        &mut self,
        ctx: &mut Ctx<'_>,
        rx: &Received<'_>,
        h: &HopHeader,
        offset: u64,
        geom: BlockGeom,
        packet_num: u16,
        payload: &[u8],
    ) {
        let now = ctx.now;
        let key = FlowKey {
            src: h.src,
            id: h.flow_id,
        };
        let n = h.block_num;
        if rx.overheard && !self.cfg.cache_overheard {
            return;
        }
        if rx.overheard && (h.src == ctx.local) {
            return;
        }
        if !self.flows.contains_key(&key) && (rx.overheard || h.dst != ctx.local) {
            // Only cache what fits without displacing custody.
            if self.protected_bytes() + u64::from(geom.block_len) > self.cfg.cache_limit_bytes {
                return;
            }
        }
        if !self.ensure_flow(key, h.dst, ctx.local, now) {
            return;
        }
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        if f.dest().is_some_and(|d| n < d.next_deliver || d.finished) {
            return;
        }
        if f.source().is_some() {
            return;
        }
        if f.dest().is_none() && (n < f.e2e_cum || f.e2e_fin) && !f.blocks.contains_key(&n) {
            // Late copies of a block already delivered end to end (its BACK overtook them):
            // keeping them would start a new transfer of a finished block.
            return;
        }
        if f.blocks.get(&n).is_some_and(|b| b.geom != geom) {
            if rx.overheard {
                return;
            }
            self.drop_block(key, n);
        }
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let new_block = !f.blocks.contains_key(&n);
        let b = f
            .blocks
            .entry(n)
            .or_insert_with(|| Block::new(offset, geom, false, now));
        if new_block {
            self.cache_bytes += u64::from(geom.block_len);
        }
        // Every DATA packet of a flow's last block carries FIN: the block may complete here
        // from DATA alone (its BSYN was withheld, and the sender sent the packets that
        // follow a BSYN at once), and without it the destination would never finish.
        b.fin |= h.flags & FLAG_FIN != 0;
        let was_complete = b.complete();
        let fresh = b.store(u32::from(packet_num), payload);
        b.last_used = now;
        if !rx.overheard {
            b.last_data = now;
            if !fresh && b.overheard.get(u32::from(packet_num)) {
                // First copy from its sender; the one held was overheard.
                b.overheard.unset(u32::from(packet_num));
            } else if !fresh {
                // A copy of a packet already here: its sender gave up one that was late.
                b.dups = b.dups.saturating_add(1);
                bump(&mut self.stats.extra, "data_duplicates");
            }
            if b.admitted_from.is_none() {
                b.admitted_from = Some(rx.link_src);
            }
        } else if fresh {
            b.overheard.set(u32::from(packet_num));
            self.stats
                .extra
                .entry("overheard_cached")
                .and_modify(|x| *x += 1)
                .or_insert(1);
        }
        let complete = b.complete();
        let upstream = b.admitted_from;
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
            // A deferred BACK goes as soon as the packets its BSYN announced are here;
            // otherwise its deadline stays `back_quiet` after the newest packet.
            let quiet = self.cfg.back_quiet;
            let held = self
                .flows
                .get(&key)
                .and_then(|f| f.blocks.get(&n))
                .map(|b| b.have.count())
                .unwrap_or(0);
            let mut answer = None;
            if let Some(f) = self.flows.get_mut(&key) {
                if let Some(d) = f.deferred.get_mut(&n) {
                    if held >= u32::from(d.2) {
                        answer = Some(d.0);
                    } else {
                        d.1 = now + quiet;
                    }
                }
                if answer.is_some() {
                    f.deferred.remove(&n);
                }
            }
            if let Some(up) = answer {
                self.send_back(key, n, up, now);
            }
        }
        self.evict();
    }
}
