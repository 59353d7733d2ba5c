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
    /// Copies of a transfer's packets the tail rule gave up that may still be queued here:
    /// no packet handed to the link after them, and not the packet itself, has been
    /// reported arrived (copies older than `link_queue_lifetime` are dropped from the list
    /// by `expire_tail_held`).
    pub(super) fn tail_held(&self, x: &Transfer) -> usize {
        x.tail_held
            .iter()
            .filter(|&&(p, sq, _)| sq > self.link_queue.arrived && !x.peer.get(p))
            .count()
    }

    /// Forget the held tail losses that left the queue or outlived `link_queue_lifetime`.
    pub(super) fn expire_tail_held(&mut self, now: Instant) {
        let (arrived, life) = (self.link_queue.arrived, self.cfg.link_queue_lifetime);
        for f in self.flows.values_mut() {
            for x in f.outs.values_mut() {
                let peer = &x.peer;
                x.tail_held
                    .retain(|&(p, sq, at)| sq > arrived && !peer.get(p) && now < at + life);
            }
        }
    }

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
        let mut n = 0;
        let mut from = 0;
        while let Some(p) = x.sent_round.next_in_not(&x.peer, &none, from) {
            if x.sent_seq
                .get(p as usize)
                .is_some_and(|&sq| sq > self.link_queue.arrived)
            {
                n += 1;
            }
            from = p + 1;
        }
        n
    }
}
