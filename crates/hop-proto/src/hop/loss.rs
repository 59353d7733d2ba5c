//! Queue-aware loss inference (not in the paper): which unreported packets have left this
//! node's FIFO link queue, and the loss age of the tail (RFC 8985's RACK and tail rule).

use super::*;

/// This node's stream of data packets handed to the link, as the next hops' BACKs reveal it.
#[derive(Debug, Default)]
pub(super) struct LinkQueue {
    /// Data packets handed to the link so far (sequence of the latest).
    pub(super) handed: u64,
    /// Every data packet up to this sequence has left the link's queue: a packet with this
    /// sequence was reported by a BACK (the data queue is FIFO) or judged lost.
    pub(super) left: u64,
    /// The newest position of that stream known to have arrived at a next hop (judged
    /// lost packets excluded): every copy handed to the link before it has left the link.
    pub(super) arrived: u64,
    /// Smoothed time from handing a packet to the link to the BACK that reports it.
    pub(super) delivery_delay: Option<Duration>,
    /// Delivery delays added to the tail rule's loss age because next hops reported
    /// duplicate data (`duplicate_feedback`), when it last grew, and the BACKs since then
    /// whose tail losses came without duplicates.
    pub(super) tail_ext: u32,
    pub(super) tail_ext_at: Instant,
    pub(super) tail_clean: u32,
}

impl LinkQueue {
    /// The next position in the stream: a data packet is being handed to the link.
    pub(super) fn stamp(&mut self) -> u64 {
        self.handed += 1;
        self.handed
    }
}

impl LinkQueue {
    /// A next hop reported copies of packets it already held: the tail rule gave up packets
    /// that were only queued. Wait one delivery delay (`step`) longer before the next such
    /// judgement, at most once per delivery delay (RACK's reordering window grows the same way
    /// on D-SACKs, RFC 8985 §6.2 step 4). True if the loss age grew.
    pub(super) fn on_duplicates(&mut self, now: Instant, step: Duration) -> bool {
        let raised = self.tail_ext == 0 || now >= self.tail_ext_at + step;
        if raised {
            self.tail_ext = self.tail_ext.saturating_add(1);
            self.tail_ext_at = now;
        }
        self.tail_clean = 0;
        raised
    }

    /// Learn from a BACK's arrivals: every data packet handed to the link before the newest
    /// arrived one (or before the oldest live copy of an arrived resent packet) has left the
    /// FIFO queue, and the newest one's age is a delivery-delay sample when the BACK answers
    /// a BSYN sent once (`sample`) that followed the packet at once (within `back_quiet`:
    /// the next hop then answered when the packet arrived, not whenever it was asked). The
    /// answer to a repeated BSYN comes a timer's wait after the packets arrived: counted, a
    /// lost BACK would raise the delay (which rises at once) to that wait, and with it the
    /// BSYN timer's floor and the tail's loss age, which cost further waits.
    pub(super) fn on_arrivals(
        &mut self,
        a: &Arrivals,
        bsyn_at: Instant,
        now: Instant,
        back_quiet: Duration,
        sample: bool,
    ) {
        if a.floor > 0 {
            self.left = self.left.max(a.floor);
            self.arrived = self.arrived.max(a.floor);
        }
        let Some((seq, at)) = a.newest else {
            return;
        };
        self.left = self.left.max(seq);
        self.arrived = self.arrived.max(seq);
        if sample && bsyn_at.saturating_duration_since(at) <= back_quiet {
            let sample = now.saturating_duration_since(at);
            // Rises at once, decays slowly: a packet is not judged lost while packets sent as
            // long ago are still being delivered.
            self.delivery_delay = Some(match self.delivery_delay {
                Some(d) if d > sample => (d * 7 + sample) / 8,
                _ => sample,
            });
        }
    }

    /// Judge the packets of transfer `x`'s round that its next hop's BACK did not report.
    /// Those handed to the link before one that arrived are lost: the link's data queue is
    /// FIFO (RACK, RFC 8985 §6.2, with the send order in place of time). The rest are
    /// probably still queued here and are not sent again; only when nothing arrived since the
    /// last BACK (`progress` false) are those older than the loss age given up (the tail,
    /// RFC 8985 §7). The tail also needs the transfer to have stalled that long: while the
    /// queue drains, a BACK without news only means the next hop heard a pause.
    pub(super) fn judge(
        &mut self,
        x: &mut Transfer,
        (progress, behind_upto): (bool, u64),
        duplicates: u16,
        now: Instant,
        cfg: &HopConfig,
    ) -> Losses {
        let age = tail_age(self.delivery_delay, self.tail_ext, cfg);
        let stalled = now >= x.progress_at + age;
        let mut lost_upto = 0u64;
        let mut losses = Losses::default();
        for p in 0..x.sent_seq.len() as u32 {
            if !x.sent_round.get(p) {
                continue;
            }
            let (seq, at) = (x.sent_seq[p as usize], x.sent_at[p as usize]);
            if x.peer.get(p) {
                x.sent_round.unset(p);
                continue;
            }
            if seq < self.left || seq <= behind_upto || (!progress && stalled && now >= at + age) {
                x.sent_round.unset(p);
                if seq < self.left || seq <= behind_upto {
                    losses.fifo += 1;
                } else {
                    losses.tail += 1;
                }
                lost_upto = lost_upto.max(seq);
                if seq < self.arrived {
                    x.lost_known.set(p);
                }
                continue;
            }
            losses.kept += 1;
            if !progress {
                // Nothing arrived since the last BACK: ask again when the oldest packet in
                // flight is due, not at once.
                let t = (at + age).max(x.progress_at + age);
                x.not_before = Some(x.not_before.map_or(t, |u| u.min(t)));
            }
        }
        self.left = self.left.max(lost_upto);
        if losses.tail > 0 && duplicates == 0 && self.tail_ext > 0 {
            // Tail losses without duplicates: after enough of them the loss age returns to
            // twice the delivery delay.
            self.tail_clean += 1;
            if self.tail_clean >= TAIL_EXT_RESET_AFTER {
                self.tail_ext = 0;
                self.tail_clean = 0;
            }
        }
        losses
    }
}

/// What a BACK showed of the packets a transfer handed to the link in its round.
#[derive(Debug, Default)]
pub(super) struct Arrivals {
    /// The newest (stream position, when handed over) of the arrived packets sent once.
    pub(super) newest: Option<(u64, Instant)>,
    /// The newest oldest-live-copy position among arrived packets sent more than once.
    pub(super) floor: u64,
    /// Some packet of the round arrived.
    pub(super) progress: bool,
}

/// Packets of a round a BACK left out: lost behind a newer arrival (FIFO), lost at the
/// tail, or kept as still in flight.
#[derive(Debug, Default)]
pub(super) struct Losses {
    pub(super) fifo: u64,
    pub(super) tail: u64,
    pub(super) kept: u64,
}

impl Transfer {
    /// The packets of this round the next hop now holds. A packet sent more than once gives
    /// no delay sample (the copy that arrived may be an old one, Karn's rule), but it still
    /// proves that its oldest live copy has left the queue.
    pub(super) fn arrivals(&self) -> Arrivals {
        let mut a = Arrivals::default();
        for p in 0..self.sent_seq.len() as u32 {
            if !(self.sent_round.get(p) && self.peer.get(p)) {
                continue;
            }
            a.progress = true;
            if self.resent.get(p) {
                a.floor = a.floor.max(self.live_seq[p as usize]);
                continue;
            }
            let seq = self.sent_seq[p as usize];
            if seq > 0 && a.newest.is_none_or(|(q, _)| seq > q) {
                a.newest = Some((seq, self.sent_at[p as usize]));
            }
        }
        a
    }

    /// Record that packet `p` was handed to the link as position `seq` of the node's stream
    /// at `now`; true if it had been sent on this hop before (a retransmission).
    pub(super) fn stamp(&mut self, p: u32, seq: u64, now: Instant) -> bool {
        self.sent_seq[p as usize] = seq;
        self.sent_at[p as usize] = now;
        let again = !self.ever_sent.set(p);
        if again && !self.lost_known.get(p) {
            // Ambiguous only while an earlier copy may still arrive.
            self.resent.set(p);
        } else {
            self.resent.unset(p);
            self.live_seq[p as usize] = seq;
        }
        self.lost_known.unset(p);
        again
    }
}

/// How long after it was handed to the link an unreported packet is judged lost (the tail,
/// RFC 8985 §7): twice the delivery delay (the BSYN timeout before the first sample), plus
/// one delay per step of `ext` (next hops reported duplicate data, `duplicate_feedback`),
/// but once extended no longer than `link_queue_lifetime`: a copy still missing after the
/// link queue's delay limit was dropped there, so waiting longer cannot save a duplicate.
pub(super) fn tail_age(delivery_delay: Option<Duration>, ext: u32, cfg: &HopConfig) -> Duration {
    // Without a delay sample yet: the BSYN timeout, extended by halves of it.
    let (base, step) = match delivery_delay {
        Some(d) => (d * 2, d),
        None => (cfg.bsyn_timeout, cfg.bsyn_timeout / 2),
    };
    if ext == 0 {
        return base;
    }
    (base + step.saturating_mul(ext))
        .min(cfg.link_queue_lifetime)
        .max(base)
}

impl HopTransport {
    /// A transfer's packets handed to the link and not yet known to have left it. With
    /// `queue_aware`, a packet handed over before one that arrived (any transfer's, as
    /// the next hops' BACKs report them) has left this node's FIFO queue, arrived or lost,
    /// whether or not its own next hop has answered yet; without, every packet of the
    /// round not reported.
    pub(super) fn queued(&self, x: &Transfer) -> u32 {
        let none = Bitmap::new(0);
        if !self.cfg.queue_aware {
            return x.sent_round.count_in_not(&x.peer, &none);
        }
        let arrived = self.link_queue.arrived;
        x.sent_round
            .ones_not(&x.peer)
            .filter(|&p| x.sent_seq.get(p as usize).is_some_and(|&sq| sq > arrived))
            .count() as u32
    }
}
