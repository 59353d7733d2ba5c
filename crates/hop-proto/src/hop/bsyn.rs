//! Sending BSYNs (§3.1): when a transfer asks its next hop what it holds, route changes (§3.4),
//! and micro-block BSYN trains (§3.6).

use super::*;

impl HopTransport {
    /// Packets handed to the link after which a transfer sends its BSYN early (half a link
    /// window, `early_bsyn`); 0 = never early.
    pub(super) fn early_bsyn_at(&self) -> usize {
        if self.cfg.early_bsyn {
            self.window.window / 2
        } else {
            0
        }
    }

    /// Send a BSYN (or micro-block BSYNs) for a transfer that needs one.
    pub(super) fn drive_xfer(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, n: u32) {
        let now = ctx.now;
        let sending = self
            .flows
            .get(&key)
            .and_then(|f| f.outs.get(&n))
            .is_some_and(|x| x.state == TransferState::Sending && !x.micro);
        let window_full = sending && self.window_full();
        let early_half = self.early_bsyn_at();
        let rounds = self.cfg.round_per_next_hop;
        // With rounds per next hop, a round ends at half the window when another transfer
        // waits to start its round to the same next hop: its BACK then returns while the
        // next round's packets are still on the link.
        let half_round = sending && rounds && self.round_half_done(key, n);
        // Of this transfer's packets, those still queued here (what its BACK would take
        // out of a full window).
        let queued = self
            .flows
            .get(&key)
            .and_then(|f| f.outs.get(&n))
            .map_or(0, |x| self.queued(x));
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let dst = f.dst;
        let (Some(x), Some(b)) = (f.outs.get_mut(&n), f.blocks.get(&n)) else {
            return;
        };
        let mut why = "bsyn_start";
        let need = match x.state {
            TransferState::NeedBsyn => true,
            TransferState::AwaitBack { .. } => false,
            TransferState::Sending => {
                if x.micro {
                    true
                } else {
                    let left = b.have.count_in_not(&x.peer, &x.sent_round);
                    if left > 0 && !self.round_robin.contains(&key) {
                        self.round_robin.push_back(key);
                    }
                    // Ask when everything was handed to the link, or when the link window
                    // is full and this transfer has packets in it (the BACK opens it).
                    let in_flight = queued;
                    let round_done = left == 0 && b.complete();
                    if rounds && window_full && in_flight > 0 && !round_done && x.attempts == 0 {
                        // A full window asks for a BACK once this transfer has handed at
                        // least a txop (or half the window, if smaller) to the link since
                        // its last BSYN; with less, the window is full of packets still
                        // queued here (its BACK would report next to nothing), so it asks a
                        // loss age (the tail rule of the BACK handling) after its last BSYN.
                        let enough = self.txop_packets.min(self.window.window as u32 / 2).max(1);
                        if x.sent_since_bsyn < enough {
                            let t = x.bsyn_at
                                + tail_age(
                                    self.link_queue.delivery_delay,
                                    self.link_queue.tail_ext,
                                    &self.cfg,
                                );
                            if t > now {
                                x.not_before = Some(x.not_before.map_or(t, |u| u.max(t)));
                            }
                        }
                    }
                    let due = x.not_before.map_or(true, |t| t <= now);
                    // Early BSYN: half a window handed over since the last one.
                    let half = early_half > 0 && x.sent_since_bsyn as usize >= early_half;
                    let need =
                        due && (round_done || (window_full && in_flight > 0) || half || half_round);
                    if need {
                        why = if round_done {
                            "bsyn_round_done"
                        } else if half_round {
                            "bsyn_half_round"
                        } else if half {
                            "bsyn_early"
                        } else {
                            "bsyn_window_full"
                        };
                    }
                    need
                }
            }
        };
        if !need {
            return;
        }
        // Follow route changes (§3.4): the next hop is looked up whenever a BSYN is sent.
        let Some(next_hop) = ctx.routing.next_hop(dst) else {
            return;
        };
        if next_hop != x.next_hop {
            let (vtx, ttl, micro) = (x.vtx, x.ttl, x.micro);
            *x = Self::new_xfer(next_hop, b.geom, vtx, ttl, micro);
        }
        let mut flags = if b.fin { FLAG_FIN } else { 0 };
        if x.vtx {
            flags |= FLAG_VTX;
        }
        let ttl = if x.vtx { x.ttl } else { 0 };
        let repeat = x.attempts > 0;
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
        let mut msgs: Vec<Vec<u8>> = Vec::new();
        let mut retx = 0u64;
        if x.micro {
            flags |= FLAG_MICRO;
            // Every packet the next hop lacks rides on its own BSYN; the last one asks for
            // the BACK. A repeat (no BACK since the last send) carries only the last of
            // them, which asks (§3.6 piggybacks the micro-block on the initial BSYN): the
            // packets of the last send may only be queued behind a busy link, and sending
            // all of them again on every timeout fed a collapse at a lossy hub
            // (docs/reproduce.md); the BACK then says which are missing.
            let mut missing: Vec<u32> = (0..b.geom.packets())
                .filter(|i| !x.peer.get(*i) && b.have.get(*i))
                .collect();
            if repeat && missing.len() > 1 {
                missing.drain(..missing.len() - 1);
            }
            if missing.is_empty() || !b.complete() {
                let msg = HopMessage {
                    header: Self::header(key, dst, n, flags | FLAG_ASK, ttl),
                    body: HopBody::Bsyn {
                        offset: b.offset,
                        geom: b.geom,
                        packet_num: 0,
                        expect: 0,
                        payload: &[],
                    },
                };
                let mut out = Vec::new();
                if msg.emit(&mut out).is_ok() {
                    msgs.push(out);
                }
            } else {
                for (i, p) in missing.iter().enumerate() {
                    let last = i + 1 == missing.len();
                    let fl = if last { flags | FLAG_ASK } else { flags };
                    let msg = HopMessage {
                        header: Self::header(key, dst, n, fl, ttl),
                        body: HopBody::Bsyn {
                            offset: b.offset,
                            geom: b.geom,
                            packet_num: *p as u16,
                            expect: 0,
                            payload: b.packet(*p),
                        },
                    };
                    let mut out = Vec::new();
                    if msg.emit(&mut out).is_ok() {
                        msgs.push(out);
                    }
                    if !x.ever_sent.set(*p) {
                        retx += 1;
                    }
                }
            }
        } else {
            // The next hop holds what it reported plus what this round handed to the link,
            // once that arrives; the BSYN overtakes the data still queued here.
            // A repeated BSYN follows data that had the whole first wait to arrive: it asks
            // for an answer at once.
            let in_flight = if repeat {
                0
            } else {
                x.sent_round.count_in_not(&x.peer, &Bitmap::new(0))
            };
            let expect = (x.peer.count() + in_flight).min(u32::from(u16::MAX)) as u16;
            let msg = HopMessage {
                header: Self::header(key, dst, n, flags, ttl),
                body: HopBody::Bsyn {
                    offset: b.offset,
                    geom: b.geom,
                    packet_num: 0,
                    expect,
                    payload: &[],
                },
            };
            let mut out = Vec::new();
            if msg.emit(&mut out).is_ok() {
                msgs.push(out);
            }
        }
        let name = name_of(MsgType::Bsyn, flags);
        let nh = x.next_hop;
        bump(
            &mut self.stats.extra,
            if repeat { "bsyn_repeat" } else { why },
        );
        self.stats.data_retransmissions += retx;
        for body in msgs {
            bump(&mut self.stats.sent_by_type, name);
            self.control.push_back(Outgoing {
                next_hop: nh,
                class: Class::Control,
                body,
            });
        }
    }
}
