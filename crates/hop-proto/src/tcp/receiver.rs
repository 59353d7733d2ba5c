//! The destination: in-order delivery, cumulative ACKs with SACK blocks (RFC 2018), and
//! delayed ACKs (RFC 5681 §4.2, RFC 1122 §4.2.3.2).

use bytes::Bytes;
use hop_wire::tcp::{self as wire, Message};

use super::TcpTransport;
use crate::stream::reassembly::Reassembly;
use crate::time::Instant;
use crate::transport::Ctx;
use crate::{Event, FlowKey};

#[derive(Debug)]
pub(super) struct Receiver {
    pub(super) reasm: Reassembly,
    /// In-order segments received since the last ACK.
    unacked: u32,
    /// The delayed-ACK timer.
    pub(super) ack_at: Option<Instant>,
    /// The most recent segment, whose SACK block goes first (RFC 2018 §4).
    latest: u32,
    pub(super) last_heard: Instant,
}

impl Receiver {
    /// Up to three SACK blocks: the one holding the most recent segment first (RFC 2018
    /// §4), then the others from the highest down (in a bulk transfer, the most recently
    /// changed). The sender keeps a scoreboard, so blocks left out are not lost to it.
    fn sack_blocks(&self) -> Vec<(u32, u32)> {
        let mut runs = self.reasm.received_runs(usize::MAX);
        let mut out = Vec::with_capacity(wire::MAX_SACK_BLOCKS);
        if let Some(i) = runs
            .iter()
            .position(|&(s, e)| (s..e).contains(&self.latest))
        {
            out.push(runs.remove(i));
        }
        out.extend(runs.iter().rev().take(wire::MAX_SACK_BLOCKS - out.len()));
        out
    }
}

impl TcpTransport {
    fn send_ack(&mut self, ctx: &Ctx<'_>, key: FlowKey, ack: u32, blocks: Vec<(u32, u32)>) {
        let body = Message::Ack(wire::Ack {
            src: key.src,
            id: key.id,
            ack,
            wnd: self.cfg.receive_window_segments,
            blocks,
        })
        .to_vec();
        self.enqueue(ctx, key.src, body, "ack");
    }

    /// Acknowledge now what a receiver holds, stopping its delayed-ACK timer.
    fn ack_now(&mut self, ctx: &Ctx<'_>, key: FlowKey) {
        let Some(r) = self.receivers.get_mut(&key) else {
            return;
        };
        r.unacked = 0;
        r.ack_at = None;
        let (cum, blocks) = (r.reasm.cum(), r.sack_blocks());
        self.send_ack(ctx, key, cum, blocks);
    }

    pub(super) fn on_segment(&mut self, ctx: &mut Ctx<'_>, seg: wire::Segment<'_>) {
        let key = FlowKey {
            src: seg.src,
            id: seg.id,
        };
        let now = ctx.now;
        if self.abandoned.get(&key).is_some() {
            self.bump("abandoned_drops", 1);
            return;
        }
        if let Some(&cum) = self.finished.get(&key) {
            // A late retransmission of a delivered flow: its ACK was lost; repeat it.
            self.send_ack(ctx, key, cum, Vec::new());
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
                    unacked: 0,
                    ack_at: None,
                    latest: seg.seq,
                    last_heard: now,
                },
            );
            self.events.push_back(Event::FlowOpened { flow: key });
        }
        let delayed_ack = self.cfg.delayed_ack;
        let Some(r) = self.receivers.get_mut(&key) else {
            return;
        };
        r.last_heard = now;
        r.latest = seg.seq;
        let in_order = seg.seq == r.reasm.cum();
        let had_gap = r.reasm.highest().is_some();
        let fresh = r.reasm.insert(
            key,
            seg.seq,
            Bytes::copy_from_slice(seg.payload),
            seg.fin(),
            &mut self.events,
        );
        if r.reasm.complete() {
            let (cum, bytes) = (r.reasm.cum(), r.reasm.delivered_bytes());
            self.ack_now(ctx, key);
            self.receivers.remove(&key);
            self.events
                .push_back(Event::FlowFinished { flow: key, bytes });
            self.finished.insert(key, cum, self.cfg.finished_memory);
            return;
        }
        // RFC 5681 §4.2: ACK at once a duplicate or out-of-order segment (the sender counts
        // duplicate ACKs) and one that fills a gap; otherwise at least every second
        // segment, and within the delayed-ACK time.
        r.unacked += 1;
        if !fresh || !in_order || had_gap || r.unacked >= 2 || delayed_ack.is_zero() {
            if !fresh {
                self.bump("duplicates", 1);
            }
            self.ack_now(ctx, key);
        } else if r.ack_at.is_none() {
            r.ack_at = Some(now + delayed_ack);
        }
    }

    /// Delayed ACKs that are due, and flows whose source went silent for too long.
    pub(super) fn receiver_timeouts(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        let give_up = self.cfg.give_up_after;
        let keys: Vec<FlowKey> = self.receivers.keys().copied().collect();
        for k in keys {
            let Some(r) = self.receivers.get(&k) else {
                continue;
            };
            if now >= r.last_heard + give_up {
                self.receivers.remove(&k);
                self.events.push_back(Event::FlowAbandoned { flow: k });
                self.abandoned.insert(k, (), self.cfg.finished_memory);
                self.bump("receivers_expired", 1);
            } else if r.ack_at.is_some_and(|t| now >= t) {
                self.ack_now(ctx, k);
            }
        }
    }
}
