//! Per-hop block transfer, sending side (§3.1): what a BACK tells the sender (the bitmap
//! merge, custody moving downstream, round-trip and delivery-delay samples, losses).

use super::*;

impl HopTransport {
    pub(super) fn on_back(
        &mut self,
        ctx: &mut Ctx<'_>,
        from: NodeId,
        h: &HopHeader,
        packets: u16,
        (duplicates, block_hint_kib, echo): (u16, u16, u16),
        bitmap: &[u8],
    ) {
        let now = ctx.now;
        let key = flow_key(h);
        let n = h.block_num;
        if n == 0
            && h.flags & (FLAG_WAIT | FLAG_COMPLETE) == 0
            && self.recut_first_block_alone(ctx, key, from, block_hint_kib)
        {
            return;
        }
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        f.last_activity = now;
        let Some(b) = f.blocks.get_mut(&n) else {
            f.outs.remove(&n);
            return;
        };
        let Some(x) = f.outs.get_mut(&n) else {
            return;
        };
        if x.next_hop != from {
            return;
        }
        // The next hop's ask for smaller blocks (shared_turns.rs): the latest one holds.
        f.block_hint = (block_hint_kib > 0).then(|| usize::from(block_hint_kib) * 1024);
        if h.flags & FLAG_WAIT != 0 {
            // A wait notice (a BACK that says "your BSYN is held", sent by earlier versions as
            // an option): it carries no bitmap, and the BSYN timer asks again as usual.
            bump(&mut self.stats.extra, "waits_ignored");
            return;
        }
        let complete = h.flags & FLAG_COMPLETE != 0;
        if !complete && u32::from(packets) != b.geom.packets() {
            return;
        }
        b.last_used = now;
        if duplicates > 0 {
            *self.stats.extra.entry("duplicates_reported").or_insert(0) += u64::from(duplicates);
            if self.cfg.duplicate_feedback && self.cfg.queue_aware {
                let step = self
                    .link_queue
                    .delivery_delay
                    .unwrap_or(self.cfg.bsyn_timeout);
                if self.link_queue.on_duplicates(now, step) {
                    bump(&mut self.stats.extra, "tail_age_raised");
                }
            }
        }
        // The round's answer: a BACK while one is awaited, sent after the next hop heard a
        // BSYN of this round. A copy of the previous round's BACK (or that BACK delayed)
        // arriving after the next BSYN left is only news of packets held
        // (control_copies.rs); 0: the next hop names nothing it heard.
        let heard_round = echo == 0 || x.round_seq == 0 || seq_at_or_after(echo, x.round_seq);
        let answer = matches!(x.state, TransferState::AwaitBack { .. }) && heard_round;
        if !heard_round {
            bump(&mut self.stats.extra, "backs_before_round");
        }
        let newly = x.merge_back(complete, answer, bitmap);
        self.window.note(&self.cfg, now, newly);
        if let Role::Source(s) = &mut f.role {
            // A source progresses when its next hop takes new packets of a block. A virtual
            // retransmission's BACK is no progress: a relay answering it from its cache says
            // nothing of the destination, and a source that counted it would never give up
            // a flow whose destination no longer answers.
            if newly > 0 && !x.vtx {
                s.last_progress = now;
            }
        }
        // Only the answer to a BSYN sent once gives samples (Karn's rule): the answer to a
        // repeat came a timer's wait after the first BSYN, and the packets it reports had
        // arrived long before it.
        let sample = x.attempts == 1 && answer;
        if sample {
            // A round-trip sample.
            let r = now.saturating_duration_since(x.bsyn_at);
            let e = RttEstimate::update(self.bsyn_rtt.get(&from).copied(), r);
            self.bsyn_rtt.insert(from, e);
        }
        if answer {
            // Did the round's BSYN come behind its end (rounds_behind.rs)? Only the answer
            // to the round's first BSYN tells: a repeat names no round end.
            let first_try = x.attempts == 1;
            x.attempts = 0;
            if let (Some(e), true) = (x.round_end, first_try) {
                // Only a round with data queued ahead of its BSYN shows the link's order.
                let end_heard = h.flags & FLAG_END_HEARD != 0 && x.round_queued;
                let held = complete
                    || bitmap
                        .get(e as usize / 8)
                        .is_some_and(|b| b >> (e % 8) & 1 != 0);
                let overtaken = duplicates > 0 || (held && !end_heard && !x.round_behind);
                self.round_order
                    .learn(&self.cfg, from, end_heard, overtaken);
                if overtaken {
                    bump(&mut self.stats.extra, "rounds_overtaken");
                }
            }
        }
        let arrivals = x.arrivals();
        if arrivals.progress || x.progress_at == Instant::ZERO {
            x.progress_at = now;
        }
        if self.cfg.queue_aware {
            // Arrived packets are no longer in flight (a late BACK counts too).
            x.sent_round.subtract(&x.peer);
        }
        self.link_queue
            .on_arrivals(&arrivals, x.bsyn_at, now, self.cfg.back_quiet, sample);
        if x.peer.is_full() {
            // The next hop holds the whole block: custody moves downstream (§3.1, §3.3).
            let (vtx, micro) = (x.vtx, x.micro);
            f.outs.remove(&n);
            if let (Role::Source(s), Some(cut), false) = (&mut f.role, b.first_sent, vtx) {
                super::source::pace_next_block(&self.cfg, s, b.geom.block_len as usize, cut, now);
            }
            b.moved = true;
            b.vtx_fwd = None;
            if matches!(f.role, Role::Relay) && b.custody {
                b.custody = false;
                self.store.release(key, n);
            }
            self.expect_fin_back(now, key, n, from);
            self.service_waiting(ctx);
            self.pump_flow(ctx, key);
            if micro {
                self.micro_turn_ended(ctx, from);
            }
            return;
        }
        if answer {
            // The round's BACK: the next round sends what is missing and not in flight.
            x.state = TransferState::Sending;
            x.cursor = 0;
            x.not_before = None;
            if self.cfg.queue_aware {
                // A round behind its data: what the BACK lacks of it was lost.
                let behind_upto = if x.round_behind { x.round_handed } else { 0 };
                let losses = self.link_queue.judge(
                    x,
                    (arrivals.progress, behind_upto),
                    duplicates,
                    now,
                    &self.cfg,
                );
                for (k, v) in [
                    ("lost_after_newer", losses.fifo),
                    ("lost_tail", losses.tail),
                    ("kept_in_flight", losses.kept),
                ] {
                    if v > 0 {
                        *self.stats.extra.entry(k).or_insert(0) += v;
                    }
                }
            } else {
                // The paper (§3.1): every packet the BACK reports missing is sent again.
                x.sent_round.clear();
            }
        }
        self.pump_flow(ctx, key);
    }
}

impl Transfer {
    /// Merge a BACK's bitmap into what the next hop is known to hold: all of it if the BACK
    /// says the block is complete; the answer to our BSYN (`answer`) replaces what was known
    /// (a restarted next hop may hold less); a late duplicate BACK can only add. Returns the
    /// packets of ours in flight that the BACK newly reports (a block the next hop completes
    /// from elsewhere adds only what we had sent), the delivery the link window counts.
    fn merge_back(&mut self, complete: bool, answer: bool, bitmap: &[u8]) -> u64 {
        let none = Bitmap::new(0);
        let before = self.sent_round.count_in_not(&self.peer, &none);
        if complete {
            self.peer.fill();
        } else if answer {
            self.peer.clear();
            self.peer.union_bytes(bitmap);
        } else {
            self.peer.union_bytes(bitmap);
        }
        let after = self.sent_round.count_in_not(&self.peer, &none);
        u64::from(before.saturating_sub(after))
    }
}
