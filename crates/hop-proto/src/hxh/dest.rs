//! The destination: reassembly, gaps NACKed once they outlive the usual reordering
//! (§3.3.1), explicit ACKs on request (§3.3.2), and the memory of finished flows.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use hop_wire::hxh::{self as wire, Message};
use hop_wire::NodeId;

use super::per_hop::{Fwd, HOP_DELAY_VAR_GAIN};
use super::{duration_from_secs, Expired, Flow, HxhConfig, HxhTransport, Role};
use crate::stream::reassembly::{self, Reassembly};
use crate::time::Instant;
use crate::transport::Ctx;
use crate::{Event, FlowKey};

/// Upper bound on NACK timer backoff (multiples of `nack_timeout`).
pub(super) const NACK_BACKOFF_MAX: u32 = 8;

/// Open gaps a destination tracks per flow before forgetting the oldest.
pub(super) const GAPS_MAX: usize = 4096;

#[derive(Debug)]
pub(super) struct Dst {
    pub(super) reasm: Reassembly,
    pub(super) upstream: NodeId,
    pub(super) last_activity: Instant,
    /// Gaps not yet NACKed, oldest first: `(hi, t)` says that packets below `hi` still
    /// missing were first seen missing at `t` (the earliest entry with `hi` above them).
    pub(super) gaps: VecDeque<(u32, Instant)>,
    /// Every missing packet below this was NACKed at least once.
    pub(super) nacked_upto: u32,
    /// When the NACK of packets below `nacked_upto` still missing is sent again.
    pub(super) nack_at: Option<Instant>,
    pub(super) nack_backoff: u32,
    /// Time a reordered packet takes to fill its gap (EWMA and mean deviation, seconds).
    pub(super) reorder_delay: f64,
    pub(super) reorder_var: f64,
    pub(super) last_explicit_ack: Option<Instant>,
}

impl Dst {
    /// How long a gap may stay open before it is NACKed: per-hop retransmissions reorder
    /// packets (deviation 3), so a gap is a loss only once it outlives the usual reordering.
    pub(super) fn nack_holdoff(&self, cfg: &HxhConfig) -> Duration {
        if !cfg.nack_holdoff {
            return Duration::ZERO;
        }
        duration_from_secs(
            self.reorder_delay + self.reorder_var * f64::from(cfg.hop_rto_multiplier),
        )
        .clamp(cfg.hop_rto_min, cfg.hop_rto_max)
    }

    /// When the oldest gap not yet NACKed is due.
    pub(super) fn first_nack_due(&self, cfg: &HxhConfig) -> Option<Instant> {
        self.gaps.front().map(|&(_, t)| t + self.nack_holdoff(cfg))
    }

    /// Missing runs within `[lo, hi)`.
    pub(super) fn missing_within(&self, lo: u32, hi: u32) -> Vec<(u32, u32)> {
        self.reasm
            .missing(usize::MAX)
            .into_iter()
            .filter_map(|(a, b)| {
                let (a, b) = (a.max(lo), b.min(hi));
                (a < b).then_some((a, b))
            })
            .take(wire::MAX_NACK_RANGES)
            .collect()
    }

    /// §3.3.1: NACK the gaps that stayed open past the hold-off (each once; the NACK
    /// timer repeats them) and arm the timer. Returns the runs to NACK, if any.
    pub(super) fn due_nack(&mut self, cfg: &HxhConfig, now: Instant) -> Option<Vec<(u32, u32)>> {
        let cum = self.reasm.cum();
        while self
            .gaps
            .front()
            .is_some_and(|&(hi, _)| hi <= cum.max(self.nacked_upto))
        {
            self.gaps.pop_front();
        }
        let hold = self.nack_holdoff(cfg);
        let mut upto = None;
        while let Some(&(hi, t)) = self.gaps.front() {
            if t + hold > now {
                break;
            }
            upto = Some(hi);
            self.gaps.pop_front();
        }
        let hi = upto?;
        let lo = self.nacked_upto.max(cum);
        self.nacked_upto = hi;
        let ranges = self.missing_within(lo, hi);
        if ranges.is_empty() {
            return None;
        }
        if self.nack_at.is_none() {
            self.nack_backoff = 1;
            self.nack_at = Some(now + cfg.nack_timeout);
        }
        Some(ranges)
    }

    /// A packet arrives: note a new gap it opens, or the reordering delay of a gap it fills.
    pub(super) fn note_arrival(&mut self, cfg: &HxhConfig, now: Instant, seq: u32, retx: bool) {
        let cum = self.reasm.cum();
        if self.reasm.has(seq) || seq.wrapping_sub(cum) >= reassembly::MAX_AHEAD {
            return;
        }
        let next_expected = self.reasm.highest().map_or(cum, |h| h + 1);
        if seq > next_expected {
            self.gaps.push_back((seq, now));
            while self.gaps.len() > GAPS_MAX {
                // Forgetting the oldest gap only delays its NACK to the next gap's time.
                self.gaps.pop_front();
            }
        } else if seq < next_expected && !retx {
            // The original copy filled a gap: a reordering sample.
            let opened = self.gaps.iter().find(|&&(hi, _)| hi > seq).map(|&(_, t)| t);
            if let Some(t) = opened {
                let sample = (now - t).as_secs_f64();
                let g = cfg.hop_delay_gain;
                let dev = (sample - self.reorder_delay).abs();
                self.reorder_var =
                    (1.0 - HOP_DELAY_VAR_GAIN) * self.reorder_var + HOP_DELAY_VAR_GAIN * dev;
                self.reorder_delay = (1.0 - g) * self.reorder_delay + g * sample;
            }
        }
    }
    /// The destination's timers: it gives up after `give_up` without a packet; otherwise it
    /// NACKs the gaps past their hold-off, and the NACK timer repeats the NACK of packets
    /// still missing, backing off (§3.3.1).
    pub(super) fn on_timeout(
        &mut self,
        cfg: &HxhConfig,
        now: Instant,
        key: FlowKey,
        due: &mut Expired,
    ) {
        if self.last_activity + cfg.give_up <= now {
            due.remove.push((key, None));
            return;
        }
        if let Some(ranges) = self.due_nack(cfg, now) {
            due.control.push((
                self.upstream,
                Message::Nack(wire::Nack {
                    src: key.src,
                    id: key.id,
                    cum: self.reasm.cum(),
                    ranges,
                }),
            ));
        }
        let renack = self.nack_at.is_some_and(|t| t <= now);
        let ranges = if renack {
            self.missing_within(self.reasm.cum(), self.nacked_upto)
        } else {
            Vec::new()
        };
        if renack && ranges.is_empty() {
            self.nack_at = None;
        } else if renack {
            self.nack_backoff = (self.nack_backoff * 2).clamp(1, NACK_BACKOFF_MAX);
            self.nack_at = Some(now + cfg.nack_timeout.saturating_mul(self.nack_backoff));
            due.control.push((
                self.upstream,
                Message::Nack(wire::Nack {
                    src: key.src,
                    id: key.id,
                    cum: self.reasm.cum(),
                    ranges,
                }),
            ));
        }
    }
}

impl HxhTransport {
    pub(super) fn on_data_at_destination(
        &mut self,
        ctx: &mut Ctx<'_>,
        from: NodeId,
        key: FlowKey,
        d: wire::Data<'_>,
    ) {
        let now = ctx.now;
        let sync = d.flags & wire::DATA_SYNC != 0;
        if self.finished_set.contains(&key) {
            let cum = self
                .finished
                .iter()
                .find(|(k, _)| *k == key)
                .map_or(0, |(_, c)| *c);
            let flags = if sync { wire::HOPACK_SYNC_REPLY } else { 0 };
            self.push_control(
                from,
                Message::HopAck(wire::HopAck {
                    flags,
                    credits: self.cfg.buffer_packets,
                    src: key.src,
                    id: key.id,
                    seq: d.seq,
                    rev_ack: cum,
                }),
            );
            if d.flags & wire::DATA_ACK_REQ != 0 {
                self.push_control(
                    from,
                    Message::Ack(wire::Ack {
                        src: key.src,
                        id: key.id,
                        cum,
                    }),
                );
            }
            return;
        }
        if self.abandoned_set.contains(&key) {
            self.bump("abandoned_drops");
            return;
        }
        if !self.flows.contains_key(&key) {
            if self.flows.len() >= self.cfg.max_flows {
                self.bump("flow_limit_drops");
                return;
            }
            self.flows.insert(
                key,
                Flow {
                    dst: ctx.local,
                    rev_ack: 0,
                    fwd: Fwd::new(&self.cfg, now, self.vclock),
                    role: Role::Dest(Box::new(Dst {
                        reasm: Reassembly::default(),
                        upstream: from,
                        last_activity: now,
                        gaps: VecDeque::new(),
                        nacked_upto: 0,
                        nack_at: None,
                        nack_backoff: 0,
                        reorder_delay: self.cfg.hop_delay_initial.as_secs_f64(),
                        reorder_var: self.cfg.hop_delay_initial.as_secs_f64() / 2.0,
                        last_explicit_ack: None,
                    })),
                },
            );
            self.events.push_back(Event::FlowOpened { flow: key });
        }
        let cfg = self.cfg.clone();
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        let Role::Dest(dst) = &mut flow.role else {
            return;
        };
        dst.upstream = from;
        dst.last_activity = now;
        let fin = d.flags & wire::DATA_FIN != 0;
        dst.note_arrival(&cfg, now, d.seq, d.flags & wire::DATA_RETX != 0);
        let fresh = dst.reasm.insert(
            key,
            d.seq,
            Bytes::copy_from_slice(d.payload),
            fin,
            &mut self.events,
        );
        if !fresh {
            *self.stats.extra.entry("duplicates").or_insert(0) += 1;
        }
        let cum = dst.reasm.cum();
        flow.rev_ack = cum;
        let credits = cfg
            .buffer_packets
            .saturating_sub(dst.reasm.pending_packets() as u16);
        let mut out: Vec<Message<'static>> = vec![Message::HopAck(wire::HopAck {
            flags: if sync { wire::HOPACK_SYNC_REPLY } else { 0 },
            credits,
            src: key.src,
            id: key.id,
            seq: d.seq,
            rev_ack: if sync { cum } else { 0 },
        })];
        let complete = dst.reasm.complete();
        if complete {
            let bytes = dst.reasm.delivered_bytes();
            out.push(Message::Ack(wire::Ack {
                src: key.src,
                id: key.id,
                cum,
            }));
            self.flows.remove(&key);
            self.events
                .push_back(Event::FlowFinished { flow: key, bytes });
            self.finished.push_back((key, cum));
            self.finished_set.insert(key);
            while self.finished.len() > cfg.finished_memory {
                if let Some((k, _)) = self.finished.pop_front() {
                    self.finished_set.remove(&k);
                }
            }
        } else {
            // §3.3.1: a gap is NACKed (once the hold-off passed) and arms the NACK timer.
            if let Some(ranges) = dst.due_nack(&cfg, now) {
                out.push(Message::Nack(wire::Nack {
                    src: key.src,
                    id: key.id,
                    cum,
                    ranges,
                }));
            }
            // §3.3.2: explicit ACK on request, rate limited.
            if d.flags & wire::DATA_ACK_REQ != 0
                && dst
                    .last_explicit_ack
                    .is_none_or(|t| now >= t + cfg.explicit_ack_interval)
            {
                dst.last_explicit_ack = Some(now);
                out.push(Message::Ack(wire::Ack {
                    src: key.src,
                    id: key.id,
                    cum,
                }));
            }
        }
        for m in out {
            self.push_control(from, m);
        }
    }
    /// The destination gave up on an incomplete flow: report it, and remember it so that its
    /// late packets are ignored and it is never opened (and delivered from) twice.
    pub(super) fn abandon(&mut self, key: FlowKey) {
        self.events.push_back(Event::FlowAbandoned { flow: key });
        self.abandoned.push_back(key);
        self.abandoned_set.insert(key);
        while self.abandoned.len() > self.cfg.finished_memory {
            if let Some(k) = self.abandoned.pop_front() {
                self.abandoned_set.remove(&k);
            }
        }
    }
}
