//! §II-C the sender: rate-based pacing, quick-start, the rate update from the path's
//! feedback, and retransmission of SACK holes before new data (§III-C).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use hop_wire::atp::{self as wire, Message};
use hop_wire::NodeId;

use super::{instant_minus, us_from_secs, AtpTransport};
use crate::stream::sendbuf::SendBuffer;
use crate::time::Instant;
use crate::transport::{Class, Ctx, Outgoing};
use crate::{Event, FlowKey};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Waiting for the answer to a quick-start probe.
    QuickStart {
        /// When an unanswered probe is sent again (None: not sent yet).
        retry_at: Option<Instant>,
        due: bool,
    },
    Running,
}

#[derive(Debug)]
pub(super) struct Sender {
    pub(super) dst: NodeId,
    pub(super) buf: SendBuffer,
    pub(super) phase: Phase,
    /// Packets per second.
    pub(super) rate: f64,
    pub(super) next_send: Instant,
    pub(super) pace_ready: bool,
    pub(super) retx: BTreeSet<u32>,
    pub(super) last_sent: HashMap<u32, Instant>,
    pub(super) last_feedback: Instant,
    pub(super) feedback_deadline: Instant,
    pub(super) missed: u32,
    pub(super) writable_pending: bool,
    pub(super) quick_starts: u64,
}

impl Sender {
    pub(super) fn interval(&self) -> Duration {
        let x = 1.0 / self.rate;
        if x.is_finite() && x > 0.0 {
            Duration::try_from_secs_f64(x).unwrap_or(Duration::MAX)
        } else {
            Duration::ZERO
        }
    }

    pub(super) fn has_packet(&self) -> bool {
        !self.retx.is_empty() || self.buf.has_pending_new()
    }

    /// A sender that had nothing to send got a packet: the pacing clock restarts now, so
    /// neither a burst nor a stale "ready" instant (which would read as link delay) follows.
    pub(super) fn wake(&mut self, had_packet: bool, now: Instant) {
        if !had_packet && self.has_packet() {
            self.next_send = self.next_send.max(now);
            self.pace_ready = false;
        }
    }
}

impl AtpTransport {
    pub(super) fn on_feedback(&mut self, ctx: &mut Ctx<'_>, f: wire::Feedback) {
        let key = FlowKey {
            src: f.src,
            id: f.id,
        };
        if f.src != ctx.local {
            // Relay feedback toward the source.
            self.send_control(ctx, f.src, Message::Feedback(f));
            return;
        }
        let now = ctx.now;
        let cfg = self.cfg.clone();
        let min_d = cfg.min_delay.as_secs_f64();
        let max_d = cfg.max_delay.as_secs_f64();
        let Some(s) = self.senders.get_mut(&key) else {
            return;
        };
        let had = s.has_packet();
        s.last_feedback = now;
        s.missed = 0;
        s.feedback_deadline = now + cfg.feedback_interval();
        // Reliability: cumulative ACK and SACK blocks (§III-C).
        s.buf.ack(f.cum);
        let acked = s.buf.acked();
        let mut highest = acked;
        for &(a, b) in &f.blocks {
            for seq in a.max(acked)..b.min(s.buf.next_new()) {
                s.buf.sack(seq);
            }
            highest = highest.max(b);
        }
        let guard = cfg.feedback_interval();
        let candidates: Vec<u32> = if f.flags & wire::FLAG_SACK_MORE != 0 {
            s.buf.unacked_sent().collect()
        } else {
            s.buf.unacked_sent().take_while(|&q| q < highest).collect()
        };
        let mut added = 0u64;
        for seq in candidates {
            let recent = s.last_sent.get(&seq).is_some_and(|&t| now < t + guard);
            if !recent && s.retx.insert(seq) {
                added += 1;
            }
        }
        let live: BTreeSet<u32> = s.buf.unacked_sent().collect();
        s.retx.retain(|q| live.contains(q));
        s.last_sent.retain(|q, _| live.contains(q));
        // Rate control (§II-C).
        if f.flags & wire::FLAG_SACK_REQ != 0 {
            if matches!(s.phase, Phase::QuickStart { .. }) {
                let mut d = f.d_avg_us as f64 / 1e6;
                if cfg.hop_scaled_eta && f.hops > 0 {
                    // §V-A3: the hop count refines the idle multiplier at initiation.
                    d *= (cfg.eta + cfg.eta_per_hop * f64::from(f.hops - 1)) / cfg.eta;
                }
                s.rate = 1.0 / d.clamp(min_d, max_d);
                s.phase = Phase::Running;
                s.next_send = now;
            }
        } else if matches!(s.phase, Phase::Running) && f.d_avg_us > 0 {
            let fb_rate = 1.0 / (f.d_avg_us as f64 / 1e6).clamp(min_d, max_d);
            if fb_rate > cfg.phi * s.rate {
                s.rate += cfg.kappa * (fb_rate - s.rate);
            } else if fb_rate < s.rate {
                s.rate = fb_rate;
            }
        }
        // The buffer holds what the new rate sends until feedback can free it.
        s.buf.set_limit(cfg.send_buffer_for_rate(s.rate));
        if s.writable_pending && s.buf.has_room() {
            s.writable_pending = false;
            self.events.push_back(Event::Writable { flow: key });
        }
        s.wake(had, now);
        let done = s.buf.complete().then(|| s.buf.total());
        self.bump("sack_retransmissions_queued", added);
        if let Some(bytes) = done {
            self.senders.remove(&key);
            self.events
                .push_back(Event::SendComplete { flow: key, bytes });
        }
    }

    /// The source flow whose packet is due earliest, with the instant it became due.
    pub(super) fn due_sender(&self, ctx: &Ctx<'_>) -> Option<(Instant, FlowKey, NodeId)> {
        let now = ctx.now;
        let mut best: Option<(Instant, FlowKey, NodeId)> = None;
        for (&k, s) in &self.senders {
            let Some(nh) = ctx.routing.next_hop(s.dst) else {
                continue;
            };
            let due =
                match s.phase {
                    Phase::QuickStart { due: true, .. }
                    | Phase::QuickStart { retry_at: None, .. } => Some(now),
                    Phase::QuickStart { .. } => None,
                    Phase::Running => (s.has_packet() && (s.pace_ready || s.next_send <= now))
                        .then_some(s.next_send),
                };
            if let Some(t) = due {
                if best.is_none_or(|(b, ..)| t < b) {
                    best = Some((t, k, nh));
                }
            }
        }
        best
    }

    pub(super) fn sender_packet(
        &mut self,
        now: Instant,
        key: FlowKey,
        ready_at: Instant,
        next_hop: NodeId,
        jitter: f64,
    ) -> Option<Outgoing> {
        let s = self.senders.get_mut(&key)?;
        let d_s = us_from_secs(1.0 / s.rate);
        if let Phase::QuickStart { .. } = s.phase {
            s.phase = Phase::QuickStart {
                // Retry after 1.1 E plus a random 0-50 %: probes lost together (e.g. to
                // hidden terminals) are not sent again together.
                retry_at: Some(now + self.cfg.feedback_interval().mul_f64(1.0 + 0.5 * jitter)),
                due: false,
            };
            s.quick_starts += 1;
            let dst = s.dst;
            let mut body = Message::Data(wire::Data {
                flags: wire::FLAG_SACK_REQ,
                hops: 0,
                src: key.src,
                id: key.id,
                dst,
                seq: s.buf.next_new(),
                d_max_us: 0,
                d_s_us: 0,
                payload: &[],
            })
            .to_vec();
            self.stamp(now, &mut body, ready_at);
            self.bump("probes", 1);
            *self.stats.sent_by_type.entry("probe").or_insert(0) += 1;
            return Some(Outgoing {
                next_hop,
                class: Class::Data,
                body,
                head: 0,
            });
        }
        // Retransmissions before new data (§III-C).
        let (seq, payload, fin, retx) = if let Some(seq) = s.retx.pop_first() {
            let (p, fin) = s.buf.get(seq)?;
            (seq, p, fin, true)
        } else {
            let (seq, p, fin) = s.buf.take_new()?;
            (seq, p, fin, false)
        };
        s.last_sent.insert(seq, now);
        let interval = s.interval();
        let base = s.next_send.max(instant_minus(now, interval));
        s.next_send = base + interval;
        s.pace_ready = false;
        let dst = s.dst;
        let mut body = Message::Data(wire::Data {
            flags: if fin { wire::FLAG_FIN } else { 0 },
            hops: 0,
            src: key.src,
            id: key.id,
            dst,
            seq,
            d_max_us: 0,
            d_s_us: d_s,
            payload: &payload,
        })
        .to_vec();
        self.stamp(now, &mut body, ready_at);
        if retx {
            self.stats.data_retransmissions += 1;
        }
        *self.stats.sent_by_type.entry("data").or_insert(0) += 1;
        Some(Outgoing {
            next_hop,
            class: Class::Data,
            body,
            head: 0,
        })
    }
}
