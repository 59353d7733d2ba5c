//! §II-A delay measurement: every node keeps EWMAs of the queueing and transmission delay of
//! the data packets it sends and stamps the larger D into each.

use hop_wire::atp as wire;
use hop_wire::NodeId;

use super::{us_from_secs, AtpTransport};
use crate::time::Instant;

/// A data packet waiting in this node's output FIFO.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) body: Vec<u8>,
    pub(super) next_hop: NodeId,
    pub(super) ready_at: Instant,
}

impl AtpTransport {
    /// Record this node's delay samples for a packet leaving now and return the `D` to stamp.
    pub(super) fn measure(&mut self, now: Instant, ready_at: Instant) -> f64 {
        let head_since = self.last_dequeue.map_or(ready_at, |l| l.max(ready_at));
        let q = (head_since - ready_at).as_secs_f64();
        let t = (now - head_since).as_secs_f64();
        let a = self.cfg.alpha;
        self.q_t = a * self.q_t + (1.0 - a) * q;
        self.last_dequeue = Some(now);
        if t > 0.0 {
            self.t_t = a * self.t_t + (1.0 - a) * t;
            self.q_t + self.t_t
        } else {
            // Idle observation (§II-A): the link took the packet at once. The EWMAs are
            // updated for every packet (§II-A), this one with the zero wait it measured, so
            // T_t relaxes once contention ends instead of keeping (and η tripling) the delay
            // of the last busy period for ever.
            self.bump("idle_observations", 1);
            if self.cfg.idle_updates_t {
                self.t_t *= a;
            }
            self.cfg.eta * (self.q_t + self.t_t)
        }
    }

    pub(super) fn stamp(&mut self, now: Instant, body: &mut [u8], ready_at: Instant) {
        let d = us_from_secs(self.measure(now, ready_at));
        if body.len() >= wire::DATA_HEADER_LEN {
            let o = wire::D_MAX_OFFSET;
            let cur = u32::from_be_bytes([body[o], body[o + 1], body[o + 2], body[o + 3]]);
            if d > cur {
                body[o..o + 4].copy_from_slice(&d.to_be_bytes());
            }
            body[wire::HOPS_OFFSET] = body[wire::HOPS_OFFSET].saturating_add(1);
        }
    }
}
