//! §II-B the receiver: data arriving (forwarded by a relay or reassembled at the destination),
//! the D_max average, and feedback every epoch, on a probe and on the adaptive triggers.

use bytes::Bytes;
use hop_wire::atp::{self as wire, Message};

use super::delay::Queued;
use super::{us_from_secs, AtpTransport};
use crate::stream::reassembly::Reassembly;
use crate::time::Instant;
use crate::transport::{Ctx, Received};
use crate::{Event, FlowKey};

#[derive(Debug)]
pub(super) struct Receiver {
    pub(super) reasm: Reassembly,
    pub(super) d_avg: Option<f64>,
    pub(super) hops: u8,
    pub(super) epoch_at: Instant,
    pub(super) last_data: Instant,
    /// Last data packet or quick-start probe of the flow: the source is still there.
    pub(super) last_heard: Instant,
    pub(super) missing_known: u32,
    pub(super) new_drops: u32,
    pub(super) above_run: u32,
    pub(super) below_run: u32,
}

impl Receiver {
    pub(super) fn missing_count(&self, limit: usize) -> u32 {
        self.reasm.missing(limit).iter().map(|(s, e)| e - s).sum()
    }
}

impl AtpTransport {
    pub(super) fn feedback(
        &self,
        key: FlowKey,
        flags: u8,
        r: Option<&Receiver>,
        d_us: u32,
    ) -> Message<'static> {
        let (cum, blocks, hops) = match r {
            Some(r) => (
                r.reasm.cum(),
                r.reasm
                    .received_runs(self.cfg.max_sack_blocks.min(wire::MAX_SACK_BLOCKS)),
                r.hops,
            ),
            None => (0, Vec::new(), 0),
        };
        let flags = if blocks.is_empty() {
            flags
        } else {
            flags | wire::FLAG_SACK_OPT
        };
        Message::Feedback(wire::Feedback {
            flags,
            hops,
            src: key.src,
            id: key.id,
            cum,
            d_avg_us: d_us,
            blocks,
        })
    }

    /// Receiver: feedback for one flow now (§II-B), restarting its epoch.
    pub(super) fn emit_feedback(&mut self, ctx: &Ctx<'_>, key: FlowKey, extra_flags: u8) {
        let Some(r) = self.receivers.get_mut(&key) else {
            return;
        };
        let mut flags = extra_flags;
        // SACK-MORE: nothing arrived for half an epoch (§III-C).
        if ctx.now >= r.last_data + self.cfg.epoch / 2 {
            flags |= wire::FLAG_SACK_MORE;
        }
        r.epoch_at = ctx.now + self.cfg.epoch;
        r.new_drops = 0;
        r.above_run = 0;
        r.below_run = 0;
        let d = us_from_secs(r.d_avg.unwrap_or(0.0));
        let r = self.receivers.get(&key);
        let msg = self.feedback(key, flags, r, d);
        self.send_control(ctx, key.src, msg);
    }

    pub(super) fn on_data(&mut self, ctx: &mut Ctx<'_>, rx: &Received<'_>, d: wire::Data<'_>) {
        let key = FlowKey {
            src: d.src,
            id: d.id,
        };
        if d.dst != ctx.local {
            // Intermediate node: queue for forwarding (stamped when it leaves).
            if d.src == ctx.local {
                return;
            }
            let Some(nh) = ctx.routing.next_hop(d.dst) else {
                self.bump("no_route_drops", 1);
                return;
            };
            if self.out.len() >= self.cfg.queue_limit_packets {
                self.bump("queue_drops", 1);
                return;
            }
            self.out.push_back(Queued {
                body: rx.body.to_vec(),
                next_hop: nh,
                ready_at: ctx.now,
            });
            return;
        }
        let now = ctx.now;
        if self.abandoned.get(&key).is_some() {
            self.bump("abandoned_drops", 1);
            return;
        }
        if let Some(&(cum, hops)) = self.finished.get(&key) {
            // A late packet or probe for a flow already delivered: tell the sender.
            let mut flags = wire::FLAG_FIN;
            if d.flags & wire::FLAG_SACK_REQ != 0 {
                flags |= wire::FLAG_SACK_REQ;
            }
            let msg = Message::Feedback(wire::Feedback {
                flags,
                hops,
                src: key.src,
                id: key.id,
                cum,
                d_avg_us: d.d_max_us,
                blocks: Vec::new(),
            });
            self.send_control(ctx, key.src, msg);
            return;
        }
        if d.is_probe() {
            // Quick-start: answer at once with the raw path delay (§II-C). A source that
            // probes is alive: its receiver state is kept however long data takes.
            if let Some(r) = self.receivers.get_mut(&key) {
                r.last_heard = now;
            }
            let r = self.receivers.get(&key);
            // SACK-MORE as in the epoch feedback (§III-C) when no data arrived for half an
            // epoch, also when none ever did: a restarted source whose every packet was lost
            // (an empty flow's lone FIN, say) learns of no hole from SACK blocks and would
            // otherwise probe until it gives up.
            let mut flags = wire::FLAG_SACK_REQ;
            if r.is_none_or(|r| now >= r.last_data + self.cfg.epoch / 2) {
                flags |= wire::FLAG_SACK_MORE;
            }
            let mut msg = self.feedback(key, flags, r, d.d_max_us);
            if let Message::Feedback(f) = &mut msg {
                f.hops = d.hops;
            }
            self.bump("probe_replies", 1);
            self.send_control(ctx, key.src, msg);
            return;
        }
        if !self.receivers.contains_key(&key) {
            if self.receivers.len() + self.senders.len() >= self.cfg.max_flows {
                self.bump("flow_limit_drops", 1);
                return;
            }
            self.receivers.insert(
                key,
                Receiver {
                    reasm: Reassembly::default(),
                    d_avg: None,
                    hops: d.hops,
                    epoch_at: now + self.cfg.epoch,
                    last_data: now,
                    last_heard: now,
                    missing_known: 0,
                    new_drops: 0,
                    above_run: 0,
                    below_run: 0,
                },
            );
            self.events.push_back(Event::FlowOpened { flow: key });
        }
        let cfg = &self.cfg;
        let Some(r) = self.receivers.get_mut(&key) else {
            return;
        };
        r.last_data = now;
        r.last_heard = now;
        r.hops = d.hops;
        let dmax = d.d_max_us as f64 / 1e6;
        r.d_avg = Some(match r.d_avg {
            Some(a) => cfg.beta * a + (1.0 - cfg.beta) * dmax,
            None => dmax,
        });
        let fin = d.flags & wire::FLAG_FIN != 0;
        let fresh = r.reasm.insert(
            key,
            d.seq,
            Bytes::copy_from_slice(d.payload),
            fin,
            &mut self.events,
        );
        if r.reasm.complete() {
            let (cum, hops, bytes) = (r.reasm.cum(), r.hops, r.reasm.delivered_bytes());
            self.emit_feedback(ctx, key, wire::FLAG_FIN);
            self.receivers.remove(&key);
            self.events
                .push_back(Event::FlowFinished { flow: key, bytes });
            self.finished
                .insert(key, (cum, hops), self.cfg.finished_memory);
            return;
        }
        if !fresh {
            *self.stats.extra.entry("duplicates").or_insert(0) += 1;
        }
        let mut immediate = d.flags & wire::FLAG_SACK_REQ != 0;
        if cfg.immediate_feedback {
            // §V-A3 triggers.
            let missing = r.missing_count(usize::MAX);
            if missing > r.missing_known {
                r.new_drops += missing - r.missing_known;
            }
            r.missing_known = missing;
            let ds = d.d_s_us as f64 / 1e6;
            if ds > 0.0 && dmax > ds {
                r.above_run += 1;
                r.below_run = 0;
            } else if ds > 0.0 && dmax < ds / cfg.phi {
                r.below_run += 1;
                r.above_run = 0;
            } else {
                r.above_run = 0;
                r.below_run = 0;
            }
            if r.new_drops >= cfg.adaptive_drops
                || r.above_run >= cfg.adaptive_run
                || r.below_run >= cfg.adaptive_run
            {
                immediate = true;
                *self.stats.extra.entry("immediate_feedback").or_insert(0) += 1;
            }
        }
        if immediate {
            self.emit_feedback(ctx, key, 0);
        }
    }
}
