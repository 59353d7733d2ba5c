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
        duplicates: u16,
        bitmap: &[u8],
    ) {
        let now = ctx.now;
        let key = FlowKey {
            src: h.src,
            id: h.flow_id,
        };
        let n = h.block_num;
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        f.last_activity = now;
        if let Some(s) = f.source_mut() {
            s.last_progress = now;
        }
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
        if h.flags & FLAG_WAIT != 0 {
            // The next hop holds our BSYN and will answer when our turn comes: ask again only
            // after `wait_hold`, in case that answer is lost or the next hop forgets us.
            if matches!(x.state, TransferState::AwaitBack { .. }) {
                let hold = self.cfg.wait_hold;
                let jitter = u64::try_from(hold.as_nanos() / 4).unwrap_or(u64::MAX);
                let hold = hold + Duration::from_nanos(ctx.rng.gen_range(0..=jitter));
                x.state = TransferState::AwaitBack {
                    deadline: now + hold,
                };
                x.told_wait = true;
                bump(&mut self.stats.extra, "waits_heard");
            }
            return;
        }
        let complete = h.flags & FLAG_COMPLETE != 0;
        if !complete && u32::from(packets) != b.geom.packets() {
            return;
        }
        x.told_wait = false;
        b.last_used = now;
        if duplicates > 0 {
            *self.stats.extra.entry("duplicates_reported").or_insert(0) += u64::from(duplicates);
            if self.cfg.duplicate_feedback && self.cfg.queue_aware {
                // The next hop got copies of packets it already held: the tail rule gave up
                // packets that were only queued. Wait one delivery delay longer before the
                // next such judgement, at most once per delivery delay (RACK's reordering
                // window grows the same way on D-SACKs, RFC 8985 §6.2 step 4).
                let step = self
                    .link_queue
                    .delivery_delay
                    .unwrap_or(self.cfg.bsyn_timeout);
                if self.link_queue.tail_ext == 0 || now >= self.link_queue.tail_ext_at + step {
                    self.link_queue.tail_ext = self.link_queue.tail_ext.saturating_add(1);
                    self.link_queue.tail_ext_at = now;
                    bump(&mut self.stats.extra, "tail_age_raised");
                }
                self.link_queue.tail_clean = 0;
            }
        }
        // Packets of ours in flight before and after this BACK: the difference arrived (a
        // block the next hop completes from elsewhere adds only what we had sent).
        let none = Bitmap::new(0);
        let in_flight_before = x.sent_round.count_in_not(&x.peer, &none);
        if complete {
            x.peer.fill();
        } else if matches!(x.state, TransferState::AwaitBack { .. }) {
            // The answer to our BSYN is authoritative (a restarted next hop may hold less).
            x.peer.clear();
            x.peer.union_bytes(bitmap);
        } else {
            // A late duplicate BACK: it can only add information.
            x.peer.union_bytes(bitmap);
        }
        let in_flight_after = x.sent_round.count_in_not(&x.peer, &none);
        let newly = u64::from(in_flight_before.saturating_sub(in_flight_after));
        self.window.note(&self.cfg, now, newly);
        if x.attempts == 1 && matches!(x.state, TransferState::AwaitBack { .. }) {
            // Answer to a BSYN sent once (Karn's rule): a round-trip sample.
            let r = now.saturating_duration_since(x.bsyn_at);
            let e = RttEstimate::update(self.bsyn_rtt.get(&from).copied(), r);
            self.bsyn_rtt.insert(from, e);
        }
        x.attempts = 0;
        // The newest of our packets the next hop now holds: every data packet handed to the
        // link before it has left the link's FIFO queue; its age is a delivery-delay sample.
        // A packet sent more than once gives no sample (the copy that arrived may be an old
        // one), but it still proves that its oldest live copy has left the queue.
        let mut newest: Option<(u64, Instant)> = None;
        let mut floor = 0u64;
        let mut progress = false;
        for p in 0..x.sent_seq.len() as u32 {
            if !(x.sent_round.get(p) && x.peer.get(p)) {
                continue;
            }
            progress = true;
            if x.resent.get(p) {
                floor = floor.max(x.live_seq[p as usize]);
                continue;
            }
            let sq = x.sent_seq[p as usize];
            if sq > 0 && newest.map_or(true, |(q, _)| sq > q) {
                newest = Some((sq, x.sent_at[p as usize]));
            }
        }
        if floor > 0 {
            self.link_queue.left = self.link_queue.left.max(floor);
            self.link_queue.arrived = self.link_queue.arrived.max(floor);
        }
        if progress || x.progress_at == Instant::ZERO {
            x.progress_at = now;
        }
        if self.cfg.queue_aware {
            // Arrived packets are no longer in flight (a late BACK counts too).
            for p in 0..x.sent_seq.len() as u32 {
                if x.peer.get(p) {
                    x.sent_round.unset(p);
                }
            }
        }
        if let Some((sq, at)) = newest {
            self.link_queue.left = self.link_queue.left.max(sq);
            self.link_queue.arrived = self.link_queue.arrived.max(sq);
            // A delay sample only when the BSYN followed the packet at once: the next hop
            // then answered when the packet arrived, not whenever it was asked.
            if x.bsyn_at.saturating_duration_since(at) <= self.cfg.back_quiet {
                let sample = now.saturating_duration_since(at);
                // Rises at once, decays slowly: a packet is not judged lost while packets
                // sent as long ago are still being delivered.
                self.link_queue.delivery_delay = Some(match self.link_queue.delivery_delay {
                    Some(d) if d > sample => (d * 7 + sample) / 8,
                    _ => sample,
                });
            }
        }
        if x.peer.is_full() {
            // The next hop holds the whole block: custody moves downstream (§3.1, §3.3).
            f.outs.remove(&n);
            b.moved = true;
            b.vtx_fwd = None;
            let relay = matches!(f.role, Role::Relay);
            if relay && b.custody {
                b.custody = false;
                self.store.release(key, n);
            }
            self.expire_tail_held(now);
            self.service_waiting(ctx);
            self.pump_flow(ctx, key);
            return;
        }
        if matches!(x.state, TransferState::AwaitBack { .. }) {
            x.state = TransferState::Sending;
            x.cursor = 0;
            x.not_before = None;
            if self.cfg.queue_aware {
                // Missing packets handed to the link before one that arrived are lost: the
                // link's data queue is FIFO (RACK, RFC 8985 §6.2, with the send order in
                // place of time). The rest are probably still queued here and are not sent
                // again; only when nothing arrived since the last BACK are those older than
                // the loss age given up (the tail, RFC 8985 §7).
                // The tail also needs the transfer to have stalled that long: while the queue
                // drains, a BACK without news only means the next hop heard a pause.
                let age = tail_age(
                    self.link_queue.delivery_delay,
                    self.link_queue.tail_ext,
                    &self.cfg,
                );
                let stalled = now >= x.progress_at + age;
                let left = self.link_queue.left;
                let mut lost_upto = 0u64;
                let (mut fifo, mut tail, mut kept) = (0u64, 0u64, 0u64);
                for p in 0..x.sent_seq.len() as u32 {
                    if !x.sent_round.get(p) {
                        continue;
                    }
                    let (sq, at) = (x.sent_seq[p as usize], x.sent_at[p as usize]);
                    if x.peer.get(p) {
                        x.sent_round.unset(p);
                        continue;
                    }
                    if sq < left || (!progress && stalled && now >= at + age) {
                        x.sent_round.unset(p);
                        if sq < left {
                            fifo += 1;
                            lost_upto = lost_upto.max(sq);
                        } else {
                            tail += 1;
                            if self.cfg.hold_tail_losses {
                                // Maybe still queued here: it keeps its place in the window,
                                // and says nothing of the packets handed over before it.
                                x.tail_held.push((p, sq, at));
                            } else {
                                lost_upto = lost_upto.max(sq);
                            }
                        }
                        if sq < self.link_queue.arrived {
                            x.lost_known.set(p);
                        }
                        continue;
                    }
                    kept += 1;
                    if !progress {
                        // Nothing arrived since the last BACK: ask again when the oldest
                        // packet in flight is due, not at once.
                        let t = (at + age).max(x.progress_at + age);
                        x.not_before = Some(x.not_before.map_or(t, |u| u.min(t)));
                    }
                }
                self.link_queue.left = self.link_queue.left.max(lost_upto);
                if tail > 0 && duplicates == 0 && self.link_queue.tail_ext > 0 {
                    // Tail losses without duplicates: after enough of them the loss age
                    // returns to twice the delivery delay.
                    self.link_queue.tail_clean += 1;
                    if self.link_queue.tail_clean >= TAIL_EXT_RESET_AFTER {
                        self.link_queue.tail_ext = 0;
                        self.link_queue.tail_clean = 0;
                    }
                }
                for (k, v) in [
                    ("lost_after_newer", fifo),
                    ("lost_tail", tail),
                    ("kept_in_flight", kept),
                ] {
                    if v > 0 {
                        *self.stats.extra.entry(k).or_insert(0) += v;
                    }
                }
            } else {
                x.sent_round.clear();
            }
        }
        self.expire_tail_held(now);
        self.pump_flow(ctx, key);
    }
}
