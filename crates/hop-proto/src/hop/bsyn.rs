//! Sending BSYNs (§3.1): when a transfer asks its next hop what it holds, following route
//! changes (§3.4), and the BSYN timer's wait (bsyn_timer.rs). A micro-block's BSYNs carry its
//! packets (micro.rs).

use super::*;

impl HopTransport {
    /// Send a BSYN (or a micro-block's BSYNs) for transfer (`key`, `n`) if it needs one now.
    pub(super) fn drive_transfer(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, n: u32) {
        let now = ctx.now;
        let Some(why) = self.bsyn_due(now, key, n) else {
            return;
        };
        let Some(dst) = self.flows.get(&key).map(|f| f.dst) else {
            return;
        };
        // Follow route changes (§3.4): the next hop is looked up whenever a BSYN is sent.
        let Some(next_hop) = ctx.routing.next_hop(dst) else {
            return;
        };
        // A silent next hop is asked by its probe only (neighbours.rs).
        if !self.may_ask(next_hop, now) {
            return;
        }
        if !self.micro_turn(key, n, next_hop) {
            return;
        }
        // Packets of the round still queued here, ahead of a round's first BSYN
        // (rounds_behind.rs); a repeat needs no count.
        let queued = self
            .flows
            .get(&key)
            .and_then(|f| f.outs.get(&n))
            .filter(|x| x.attempts == 0)
            .map_or(0, |x| self.queued(x));
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let (Some(x), Some(b)) = (f.outs.get_mut(&n), f.blocks.get(&n)) else {
            return;
        };
        if next_hop != x.next_hop {
            let (vtx, ttl, micro) = (x.vtx, x.ttl, x.micro);
            *x = Self::new_transfer(next_hop, b.geom, vtx, ttl, micro);
        }
        let mut flags = if b.fin { FLAG_FIN } else { 0 };
        if x.vtx {
            flags |= FLAG_VTX;
        }
        let ttl = if x.vtx { x.ttl } else { 0 };
        let repeat = x.attempts > 0;
        if !repeat {
            // A round's first BSYN: what it names and whether it goes behind its data
            // (rounds_behind.rs); the repeats say the same.
            x.round_end = if x.micro { None } else { round_end_of(x) };
            x.round_behind = x.round_end.is_some() && self.round_order.behind(&self.cfg, next_hop);
            x.round_handed = self.link_queue.handed;
            x.round_queued = queued > 0;
            if x.round_behind {
                bump(&mut self.stats.extra, "bsyn_behind");
            }
        }
        if x.round_behind {
            flags |= FLAG_BEHIND;
        }
        let wait = bsyn_wait(
            &self.cfg,
            self.bsyn_rtt.get(&next_hop),
            self.link_queue.delivery_delay,
            x.attempts,
            x.micro,
        );
        // Up to 25 % jitter so senders withheld by the same receiver, or hidden from each
        // other, do not retry in lockstep.
        let jitter = u64::try_from(wait.as_nanos() / 4).unwrap_or(u64::MAX);
        let wait = wait + Duration::from_nanos(ctx.rng.gen_range(0..=jitter));
        x.state = TransferState::AwaitBack {
            deadline: now + wait,
        };
        x.attempts = x.attempts.saturating_add(1);
        x.not_before = None;
        x.bsyn_at = now;
        x.sent_since_bsyn = 0;
        let (msgs, retx) = if x.micro {
            flags |= FLAG_MICRO;
            let header = Self::header(key, dst, n, flags, ttl);
            micro_bsyns(header, x, b, repeat)
        } else {
            let header = Self::header(key, dst, n, flags, ttl);
            (vec![block_bsyn(header, x, b, repeat)], 0)
        };
        let next_hop = x.next_hop;
        bump(
            &mut self.stats.extra,
            if repeat { "bsyn_repeat" } else { why },
        );
        self.stats.data_retransmissions += retx;
        if retx > 0 {
            *self.retx_to.entry(next_hop).or_default() += retx;
        }
        let name = name_of(MsgType::Bsyn, flags);
        let mut first_seq = 0;
        for body in msgs.into_iter().flatten() {
            bump(&mut self.stats.sent_by_type, name);
            let seq = self.queue_control(next_hop, body);
            if first_seq == 0 {
                first_seq = seq;
            }
        }
        if !repeat {
            if let Some(x) = self.flows.get_mut(&key).and_then(|f| f.outs.get_mut(&n)) {
                x.round_seq = first_seq;
            }
        }
    }

    /// Whether transfer (`key`, `n`) asks for a BACK now, and why (the counter to bump). A
    /// transfer sending a round asks when everything was handed to the link, when the link
    /// window is full and it has packets in it (the BACK opens it), or, with rounds per next
    /// hop, at half the window when another transfer waits for the same next hop. Along the
    /// way a sending transfer with packets left takes its place in the round robin, and a full
    /// window may set how long it holds its BSYN back.
    fn bsyn_due(&mut self, now: Instant, key: FlowKey, n: u32) -> Option<&'static str> {
        let sending = self
            .flows
            .get(&key)
            .and_then(|f| f.outs.get(&n))
            .is_some_and(|x| x.state == TransferState::Sending && !x.micro);
        let window_full = sending && self.window_full();
        let rounds = self.cfg.round_per_next_hop;
        // With rounds per next hop, a round ends at half the window when another transfer
        // waits to start its round to the same next hop: its BACK then returns while the
        // next round's packets are still on the link.
        let half_round = sending && rounds && self.round_half_done(key, n);
        // Of this transfer's packets, those still queued here (what its BACK would take
        // out of a full window); counted only when the window is full, the one case that
        // asks, since the count walks the round (a cost per packet handed over).
        let in_flight = if window_full {
            self.flows
                .get(&key)
                .and_then(|f| f.outs.get(&n))
                .map_or(0, |x| self.queued(x))
        } else {
            0
        };
        let loss_age = tail_age(
            self.link_queue.delivery_delay,
            self.link_queue.tail_ext,
            &self.cfg,
        );
        let enough = self.txop_packets.min(self.window.window as u32 / 2).max(1);
        let f = self.flows.get_mut(&key)?;
        let (x, b) = (f.outs.get_mut(&n)?, f.blocks.get(&n)?);
        match x.state {
            TransferState::NeedBsyn => return Some("bsyn_start"),
            TransferState::AwaitBack { .. } => return None,
            TransferState::Sending if x.micro => return Some("bsyn_start"),
            TransferState::Sending => {}
        }
        let left = b.have.count_in_not(&x.peer, &x.sent_round);
        if left > 0 && !self.round_robin.contains(&key) {
            self.round_robin.push_back(key);
        }
        let round_done = left == 0 && b.complete();
        if rounds && window_full && in_flight > 0 && !round_done && x.attempts == 0 {
            // A full window asks for a BACK once this transfer has handed at least a txop
            // (or half the window, if smaller) to the link since its last BSYN; with less,
            // the window is full of packets still queued here (its BACK would report next to
            // nothing), so it asks a loss age (the tail rule of the BACK handling) after its
            // last BSYN.
            if x.sent_since_bsyn < enough {
                let t = x.bsyn_at + loss_age;
                if t > now {
                    x.not_before = Some(x.not_before.map_or(t, |u| u.max(t)));
                }
            }
        }
        let due = x.not_before.is_none_or(|t| t <= now);
        if !due {
            return None;
        }
        if round_done {
            Some("bsyn_round_done")
        } else if half_round {
            Some("bsyn_half_round")
        } else if window_full && in_flight > 0 {
            Some("bsyn_window_full")
        } else {
            None
        }
    }
}

/// The BSYN of a block's round: the next hop holds what it reported plus what this round
/// handed to the link, once that arrives (`expect`); the BSYN overtakes the data still
/// queued here. It also names the round's end, the last packet handed to the link: the data
/// queue is FIFO, so once that packet is there the next hop need not wait for the rest of a
/// round that lost packets. A repeated BSYN follows data that had the whole first wait to
/// arrive: it asks for an answer at once.
fn block_bsyn(header: HopHeader, x: &Transfer, b: &Block, repeat: bool) -> Option<Vec<u8>> {
    let in_flight = if repeat {
        0
    } else {
        x.sent_round.count_in_not(&x.peer, &Bitmap::new(0))
    };
    let expect = (x.peer.count() + in_flight).min(u32::from(u16::MAX)) as u16;
    let round_end = if in_flight == 0 {
        0
    } else {
        // Wire value: 1 + the packet's number (0 names none).
        round_end_of(x).map_or(0, |p| p as u16 + 1)
    };
    emit(&HopMessage {
        header,
        body: HopBody::Bsyn {
            offset: b.offset,
            geom: b.geom,
            packet_num: round_end,
            expect,
            ctl: ControlSeq::default(),
            payload: &[],
        },
    })
}

/// A message's bytes (None if it cannot be encoded, which a well-formed block never causes).
pub(super) fn emit(msg: &HopMessage<'_>) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(msg.encoded_len());
    msg.emit(&mut out).ok().map(|()| out)
}

/// As [`emit`], in a buffer the node frames in place ([`crate::transport::framed_body`]):
/// for data packets, whose payload is then copied once on its way out instead of twice.
pub(super) fn emit_framed(msg: &HopMessage<'_>) -> Option<Vec<u8>> {
    let mut out = crate::transport::framed_body(msg.encoded_len());
    msg.emit(&mut out).ok().map(|()| out)
}
