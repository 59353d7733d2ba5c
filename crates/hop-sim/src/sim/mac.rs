//! The 802.11-like MAC: DCF backoff and its freeze while the medium is busy, txop bursts,
//! link-layer ACK and retries, collisions and half duplex on the shared medium, and the
//! point-to-point variant.

use bytes::Bytes;
use hop_proto::Class;
use hop_wire::BROADCAST_NODE;
use rand::Rng;

use super::{ns_from_us, Ev, Simulation};
use crate::scenario::QueueMode;

/// 802.11 ACK frame: 14 bytes.
pub(super) const ACK_BYTES: f64 = 14.0;

#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub(super) next_hop: u32,
    pub(super) class: Class,
    pub(super) payload: Bytes,
    pub(super) retries: u32,
    pub(super) cw: u32,
    pub(super) seq: u64,
    /// When the frame entered the interface queue (push model: queue delay limit).
    pub(super) enqueued: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MacState {
    Idle,
    Contend,
    Tx,
    WaitAck,
    /// Between two frames of a txop burst.
    Burst,
}

#[derive(Debug)]
pub(super) struct Frame {
    pub(super) sender: usize,
    /// What the frame carries, for the loss counts (`losses_at_next_hop`).
    pub(super) label: &'static str,
    /// The node meant to process it: the link destination, or for a broadcast the next hop
    /// its envelope names.
    pub(super) next_hop: u32,
    /// Link destination (may be BROADCAST_NODE).
    pub(super) dst: u32,
    /// None for an ACK. One buffer however many nodes receive the frame: they keep
    /// references to its data (`Node::handle_shared_datagram`), not copies.
    pub(super) payload: Option<Bytes>,
    pub(super) seq: u64,
    pub(super) need_ack: bool,
    /// Outstanding events that refer to this frame.
    pub(super) refs: u32,
    /// The nodes an `RxStartAll`/`RxEndAll` event delivers it to, in order.
    pub(super) receivers: Vec<u32>,
}

impl Simulation {
    pub(super) fn medium_idle(&self, n: usize) -> bool {
        let sn = &self.nodes[n];
        if self.shared {
            sn.busy == 0 && !sn.transmitting && self.now >= sn.nav_until
        } else {
            !sn.transmitting
        }
    }

    pub(super) fn start_next(&mut self, n: usize) {
        self.expire_queued(n);
        let sn = &mut self.nodes[n];
        let data_first = !self.sc.medium.control_priority
            && match (sn.data_q.front(), sn.ctrl_q.front()) {
                (Some(d), Some(c)) => d.seq < c.seq,
                _ => false,
            };
        let popped = if data_first {
            sn.data_q.pop_front()
        } else {
            sn.ctrl_q.pop_front().or_else(|| sn.data_q.pop_front())
        };
        let Some(mut p) = popped else {
            return;
        };
        p.cw = match p.class {
            Class::Control => self.sc.medium.control_cw_min,
            Class::Data | Class::Acked => self.sc.medium.cw_min,
        };
        sn.cur = Some(p);
        self.contend(n);
    }

    /// Push model: drop frames at the head of the class queues that waited longer than
    /// `mac_queue_max_delay_ms` (ns-3 `WifiMacQueue` `MaxDelay`).
    pub(super) fn expire_queued(&mut self, n: usize) {
        let m = &self.sc.medium;
        if m.queue_mode != QueueMode::Push || m.mac_queue_max_delay_ms <= 0.0 {
            return;
        }
        let limit = ns_from_us(m.mac_queue_max_delay_ms * 1000.0);
        let now = self.now;
        let sn = &mut self.nodes[n];
        let mut expired = 0u64;
        for q in [&mut sn.ctrl_q, &mut sn.data_q] {
            while q
                .front()
                .is_some_and(|p| now.saturating_sub(p.enqueued) > limit)
            {
                q.pop_front();
                expired += 1;
            }
        }
        sn.mac.queue_expired += expired;
        self.medium.queue_expired += expired;
    }

    /// Draw a backoff for the current frame and start counting down when the medium is idle.
    pub(super) fn contend(&mut self, n: usize) {
        let cw = self.nodes[n].cur.as_ref().map(|p| p.cw).unwrap_or(0);
        let slots = if self.shared {
            self.rng.gen_range(0..=cw)
        } else {
            0
        };
        let sn = &mut self.nodes[n];
        sn.state = MacState::Contend;
        sn.backoff_left = u64::from(slots) * self.slot;
        sn.countdown_start = None;
        sn.gen += 1;
        self.resume(n);
    }

    pub(super) fn resume(&mut self, n: usize) {
        if self.nodes[n].state != MacState::Contend
            || self.nodes[n].countdown_start.is_some()
            || !self.medium_idle(n)
        {
            return;
        }
        let sn = &mut self.nodes[n];
        let start = self.now + if sn.eifs { self.eifs } else { self.difs };
        sn.countdown_start = Some(start);
        sn.gen += 1;
        let (gen, t) = (sn.gen, start + sn.backoff_left);
        self.push(t, Ev::ContendDone { n, gen });
    }

    /// The backoff counted down to zero: the current frame goes on the air and opens a txop.
    pub(super) fn contend_done(&mut self, n: usize, gen: u64) {
        let sn = &self.nodes[n];
        if sn.gen == gen && sn.state == MacState::Contend && sn.node.is_some() {
            self.nodes[n].countdown_start = None;
            self.nodes[n].burst_start = self.now;
            self.transmit(n);
        }
    }

    /// A SIFS after a data frame of a txop burst: send the next data frame without contending.
    pub(super) fn burst_next(&mut self, n: usize, gen: u64) {
        let sn = &self.nodes[n];
        if sn.gen == gen && sn.state == MacState::Burst && sn.node.is_some() {
            if sn.transmitting {
                // An ACK went out in the gap: the burst is over, contend again.
                self.nodes[n].state = MacState::Idle;
                self.kick(n);
            } else {
                self.expire_queued(n);
                if let Some(p) = self.nodes[n].data_q.pop_front() {
                    self.nodes[n].cur = Some(p);
                    self.transmit(n);
                } else {
                    self.nodes[n].state = MacState::Idle;
                    self.kick(n);
                }
            }
        }
    }

    pub(super) fn freeze(&mut self, n: usize) {
        let slot = self.slot.max(1);
        let now = self.now;
        let sn = &mut self.nodes[n];
        if sn.state != MacState::Contend {
            return;
        }
        if let Some(start) = sn.countdown_start.take() {
            let elapsed = now.saturating_sub(start) / slot * slot;
            sn.backoff_left = sn.backoff_left.saturating_sub(elapsed);
            sn.gen += 1;
        }
    }

    pub(super) fn airtime(&self, n: usize, dst: u32, len: usize) -> u64 {
        let rate = self
            .edge_ix
            .get(&(n as u32, dst))
            .map(|&i| self.edges[i].rate_mbps)
            .unwrap_or(self.sc.topology.rate_mbps);
        let bits = (len as f64 + f64::from(self.sc.medium.header_bytes)) * 8.0;
        self.preamble + ns_from_us(bits / rate)
    }

    pub(super) fn new_frame(&mut self, f: Frame) -> u64 {
        self.next_frame += 1;
        self.frames.insert(self.next_frame, f);
        self.next_frame
    }

    /// Put a frame on the air from `n` to every neighbour that can hear it.
    pub(super) fn emit(&mut self, n: usize, frame: u64, dst: u32, air: u64) {
        let mut rx = std::mem::take(&mut self.emit_scratch);
        rx.clear();
        for k in 0..self.out[n].len() {
            let e = &self.edges[self.out[n][k]];
            if !e.up || (!self.shared && dst != BROADCAST_NODE && e.to != dst) {
                continue;
            }
            if self.nodes[e.to as usize].node.is_none() {
                continue;
            }
            rx.push((e.to, e.delay_ns));
        }
        if self.shared {
            for s in &self.sense_out[n] {
                if !s.up || self.nodes[s.to as usize].node.is_none() {
                    continue;
                }
                rx.push((s.to, s.delay_ns));
            }
        }
        let refs = 1 + rx.len() as u32;
        let same_delay = rx
            .first()
            .map(|&(_, d)| d)
            .filter(|&d| rx.iter().all(|r| r.1 == d));
        match same_delay {
            // Every receiver hears the frame after the same delay: one event starts it at all
            // of them, in order, and one ends it. The events of one frame lie next to each
            // other in the queue's order (same time, consecutive sequence numbers), so the
            // run is the same as with an event per receiver.
            Some(delay) if rx.len() > 1 => {
                if let Some(f) = self.frames.get_mut(&frame) {
                    f.receivers.clear();
                    f.receivers.extend(rx.iter().map(|&(to, _)| to));
                }
                self.push(self.now + delay, Ev::RxStartAll { frame });
                self.push(self.now + air + delay, Ev::RxEndAll { frame });
            }
            _ => {
                for &(to, delay) in &rx {
                    let to = to as usize;
                    self.push(self.now + delay, Ev::RxStart { n: to, frame });
                    self.push(self.now + air + delay, Ev::RxEnd { n: to, frame });
                }
            }
        }
        self.emit_scratch = rx;
        if let Some(f) = self.frames.get_mut(&frame) {
            f.refs = refs;
        }
        self.push(self.now + air, Ev::TxEnd { n, frame });
        if self.shared {
            // Half duplex: whatever this node was receiving is lost.
            for r in &mut self.nodes[n].rx {
                r.corrupted = true;
                r.cause.get_or_insert(LossCause::ReceiverSending);
            }
        }
    }

    pub(super) fn transmit(&mut self, n: usize) {
        let Some(p) = self.nodes[n].cur.clone() else {
            self.nodes[n].state = MacState::Idle;
            return;
        };
        let air = self.airtime(n, p.next_hop, p.payload.len());
        let need_ack = match p.class {
            Class::Control | Class::Acked => true,
            Class::Data => self.sc.medium.data_arq,
        } && p.next_hop != BROADCAST_NODE
            && self.sc.medium.link_acks;
        let (label, next_hop) = frame_label(p.class, p.next_hop, &p.payload);
        let frame = self.new_frame(Frame {
            sender: n,
            label,
            next_hop,
            dst: p.next_hop,
            payload: Some(p.payload.clone()),
            seq: p.seq,
            need_ack,
            refs: 0,
            receivers: Vec::new(),
        });
        let sn = &mut self.nodes[n];
        sn.state = MacState::Tx;
        sn.transmitting = true;
        sn.mac.frames_sent += 1;
        match p.class {
            Class::Control => sn.mac.control_frames += 1,
            // The baselines' segments (and their end-to-end ACKs) are their data: counted as
            // data air so that air per delivered byte-hop compares with Hop's.
            Class::Data | Class::Acked => {
                sn.mac.data_frames += 1;
                sn.mac.data_airtime_ns += air;
                self.medium.data_airtime_ns += air;
            }
        }
        sn.mac.airtime_ns += air;
        self.medium.frames_sent += 1;
        self.medium.airtime_ns += air;
        self.emit(n, frame, p.next_hop, air);
    }

    pub(super) fn release(&mut self, frame: u64) {
        if let Some(f) = self.frames.get_mut(&frame) {
            f.refs = f.refs.saturating_sub(1);
            if f.refs == 0 {
                self.frames.remove(&frame);
            }
        }
    }

    pub(super) fn tx_end(&mut self, n: usize, frame: u64) {
        let (is_ack, need_ack) = match self.frames.get(&frame) {
            Some(f) => (f.payload.is_none(), f.need_ack),
            None => (true, false),
        };
        self.release(frame);
        if is_ack && !self.shared {
            // A point-to-point ACK travels on the reverse link and never occupied the
            // node's transmitter.
            return;
        }
        self.nodes[n].transmitting = false;
        if self.nodes[n].node.is_none() {
            return;
        }
        if is_ack {
            self.resume(n);
            return;
        }
        if need_ack {
            let sn = &mut self.nodes[n];
            sn.state = MacState::WaitAck;
            sn.gen += 1;
            let gen = sn.gen;
            let t = self.now + self.sifs + self.ack_air + 2 * self.max_delay + self.slot.max(1000);
            self.push(t, Ev::AckTimeout { n, gen });
            return;
        }
        // Data: no link-layer acknowledgement.
        let was_data = self.nodes[n].cur.as_ref().map(|p| p.class) == Some(Class::Data);
        self.nodes[n].cur = None;
        self.nodes[n].state = MacState::Idle;
        if was_data && self.txop > 0 {
            // Refill, then continue the burst if the next data frame fits in the txop.
            self.nodes[n].state = MacState::Burst;
            self.kick(n);
            let sn = &self.nodes[n];
            let control_waits = match (sn.ctrl_q.front(), sn.data_q.front()) {
                (None, _) => false,
                (Some(c), Some(d)) => self.sc.medium.control_priority || c.seq < d.seq,
                (Some(_), None) => true,
            };
            let fits = !control_waits
                && sn.data_q.front().is_some_and(|p| {
                    // Only unacknowledged data continues a burst (an acked frame waits for
                    // its link ACK and contends again).
                    p.class == Class::Data && {
                        let air = self.airtime(n, p.next_hop, p.payload.len());
                        self.now + self.sifs + air <= sn.burst_start + self.txop
                    }
                });
            if fits {
                let sn = &mut self.nodes[n];
                sn.gen += 1;
                let gen = sn.gen;
                self.push(self.now + self.sifs, Ev::BurstNext { n, gen });
                return;
            }
            self.nodes[n].state = MacState::Idle;
        }
        self.kick(n);
    }

    pub(super) fn ack_timeout(&mut self, n: usize, gen: u64) {
        let (limit, acked_limit) = (self.sc.medium.retry_limit, self.sc.medium.acked_retry_limit);
        let (cw_max, control_cw_max) = (self.sc.medium.cw_max, self.sc.medium.control_cw_max);
        let sn = &mut self.nodes[n];
        if sn.gen != gen || sn.state != MacState::WaitAck {
            return;
        }
        let Some(p) = sn.cur.as_mut() else {
            sn.state = MacState::Idle;
            return;
        };
        p.retries += 1;
        let limit = match p.class {
            Class::Acked => acked_limit,
            Class::Control | Class::Data => limit,
        };
        if p.retries > limit {
            sn.mac.link_drops += 1;
            self.medium.link_drops += 1;
            sn.cur = None;
            sn.state = MacState::Idle;
            self.kick(n);
            return;
        }
        let ceiling = match p.class {
            Class::Control => control_cw_max,
            Class::Data | Class::Acked => cw_max,
        };
        p.cw = ((p.cw + 1) * 2 - 1).min(ceiling);
        sn.mac.link_retries += 1;
        self.medium.link_retries += 1;
        self.contend(n);
    }

    pub(super) fn send_ack(&mut self, n: usize, to: usize, seq: u64) {
        if self.nodes[n].node.is_none() || (self.shared && self.nodes[n].transmitting) {
            return;
        }
        let frame = self.new_frame(Frame {
            sender: n,
            label: "ack",
            next_hop: to as u32,
            dst: to as u32,
            payload: None,
            seq,
            need_ack: false,
            refs: 0,
            receivers: Vec::new(),
        });
        self.medium.acks_sent += 1;
        self.nodes[n].mac.acks_sent += 1;
        if self.shared {
            self.freeze(n);
            self.nodes[n].transmitting = true;
        }
        let air = self.ack_air;
        self.medium.airtime_ns += air;
        self.emit(n, frame, to as u32, air);
    }

    /// A frame ended at `n` that it could not decode (a collision, or lost on its link):
    /// with `eifs`, its next deferral is EIFS. The medium went idle at this instant and
    /// `rx_end` may already have started the countdown after DIFS: it starts again.
    fn undecoded(&mut self, n: usize) {
        if !self.sc.medium.eifs {
            return;
        }
        self.nodes[n].eifs = true;
        if self.nodes[n].countdown_start.is_some() {
            self.freeze(n);
            self.resume(n);
        }
    }

    pub(super) fn rx_start_all(&mut self, frame: u64) {
        self.each_receiver(frame, Self::rx_start, true);
    }

    pub(super) fn rx_end_all(&mut self, frame: u64) {
        self.each_receiver(frame, Self::rx_end, false);
    }

    /// `step` for each of the frame's receivers in order; `keep`: the list stays with the
    /// frame (its end is still to come).
    fn each_receiver(&mut self, frame: u64, step: fn(&mut Self, usize, u64), keep: bool) {
        let Some(f) = self.frames.get_mut(&frame) else {
            return;
        };
        let receivers = std::mem::take(&mut f.receivers);
        for &n in &receivers {
            // The run stops after the event that ends it, as with one event per receiver.
            if self.stopped {
                break;
            }
            step(self, n as usize, frame);
        }
        if keep {
            if let Some(f) = self.frames.get_mut(&frame) {
                f.receivers = receivers;
            }
        }
    }

    pub(super) fn rx_start(&mut self, n: usize, frame: u64) {
        let Some(f) = self.frames.get(&frame) else {
            return;
        };
        let sender = f.sender;
        let up = self
            .edge_ix
            .get(&(sender as u32, n as u32))
            .is_some_and(|&i| self.edges[i].up);
        // Within carrier sense range only: the frame keeps the medium busy and spoils what
        // else this node receives, but is never decoded (it counts as corrupted from the
        // start, and rx_end finds no link to deliver it over).
        let sensed_only = !up && self.shared && self.senses(sender, n);
        if self.nodes[n].node.is_none() || !(up || sensed_only) {
            return;
        }
        let shared = self.shared;
        let label = f.label;
        // What each frame being received overlaps, and whether the two senders hear each
        // other (a hidden pair when they do not).
        let hears = |a: usize, b: usize| {
            self.edge_ix
                .get(&(a as u32, b as u32))
                .is_some_and(|&i| self.edges[i].up)
                || self.senses(a, b)
        };
        let mut cause = self.nodes[n]
            .transmitting
            .then_some(LossCause::ReceiverSending);
        let mut theirs = Vec::with_capacity(self.nodes[n].rx.len());
        for r in &self.nodes[n].rx {
            let Some(other) = self.frames.get(&r.frame) else {
                theirs.push(None);
                continue;
            };
            cause.get_or_insert(LossCause::Overlap {
                by: other.label,
                hidden: !hears(other.sender, sender),
            });
            theirs.push(Some(LossCause::Overlap {
                by: label,
                hidden: !hears(sender, other.sender),
            }));
        }
        let sn = &mut self.nodes[n];
        if shared {
            let corrupted = sn.transmitting || !sn.rx.is_empty() || sensed_only;
            for (r, c) in sn.rx.iter_mut().zip(theirs) {
                r.corrupted = true;
                if let Some(c) = c {
                    r.cause.get_or_insert(c);
                }
            }
            sn.rx.push(Rx {
                frame,
                corrupted,
                cause,
            });
            sn.busy += 1;
            if sn.busy == 1 {
                self.freeze(n);
            }
        } else {
            sn.rx.push(Rx {
                frame,
                corrupted: false,
                cause: None,
            });
        }
    }

    pub(super) fn rx_end(&mut self, n: usize, frame: u64) {
        let pos = self.nodes[n].rx.iter().position(|r| r.frame == frame);
        let Some(pos) = pos else {
            self.release(frame);
            return;
        };
        let Rx {
            corrupted, cause, ..
        } = self.nodes[n].rx.swap_remove(pos);
        if self.shared {
            let sn = &mut self.nodes[n];
            sn.busy = sn.busy.saturating_sub(1);
            if sn.busy == 0 {
                self.resume(n);
            }
        }
        let Some(f) = self.frames.get(&frame) else {
            return;
        };
        let (sender, dst, seq, need_ack) = (f.sender, f.dst, f.seq, f.need_ack);
        let (label, meant_here) = (f.label, f.next_hop == n as u32);
        let payload = f.payload.clone();
        self.release(frame);
        let intended = dst == n as u32 || dst == BROADCAST_NODE;
        let edge = self.edge_ix.get(&(sender as u32, n as u32)).copied();
        let Some(ei) = edge else { return };
        if !self.edges[ei].up || self.nodes[n].node.is_none() {
            return;
        }
        if corrupted {
            self.undecoded(n);
            self.nodes[n].mac.rx_collisions += 1;
            if intended {
                self.medium.collisions += 1;
            }
            if meant_here {
                if let Some(c) = cause {
                    *self
                        .medium
                        .losses_at_next_hop
                        .entry(c.key(label))
                        .or_insert(0) += 1;
                }
            }
            return;
        }
        let loss = if payload.is_none() && self.sc.medium.lossless_acks {
            0.0
        } else {
            self.edges[ei].loss
        };
        if loss > 0.0 && self.rng.gen::<f64>() < loss {
            self.undecoded(n);
            if intended {
                self.medium.random_losses += 1;
            }
            return;
        }
        self.nodes[n].eifs = false;
        if self.sc.medium.nav && need_ack && dst != n as u32 && dst != BROADCAST_NODE {
            // The frame's Duration covers its ACK: defer until then (NAV).
            let until = self.now + self.sifs + self.ack_air;
            if until > self.nodes[n].nav_until {
                self.nodes[n].nav_until = until;
                self.freeze(n);
                self.push(until, Ev::NavEnd { n });
            }
        }
        let Some(payload) = payload else {
            // An ACK.
            let sn = &mut self.nodes[n];
            if dst == n as u32
                && sn.state == MacState::WaitAck
                && sn.cur.as_ref().is_some_and(|p| p.seq == seq)
            {
                sn.cur = None;
                sn.state = MacState::Idle;
                sn.gen += 1;
                self.kick(n);
            }
            return;
        };
        if need_ack && dst == n as u32 {
            let t = self.now + self.sifs;
            self.push(t, Ev::SendAck { n, to: sender, seq });
            let last = self.nodes[n].last_seq.insert(sender, seq);
            if last == Some(seq) {
                // A retry of a frame we already passed up (our ACK was lost).
                self.nodes[n].mac.duplicates_filtered += 1;
                return;
            }
        }
        let now = self.inst();
        if let Some(node) = self.nodes[n].node.as_mut() {
            let _ = node.handle_shared_datagram(now, &payload);
        }
        self.kick(n);
    }
}

/// A frame being received at a node.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rx {
    pub(super) frame: u64,
    pub(super) corrupted: bool,
    /// What spoilt it first (for `losses_at_next_hop`).
    pub(super) cause: Option<LossCause>,
}

/// Why a frame was lost at a receiver on the shared medium.
#[derive(Debug, Clone, Copy)]
pub(super) enum LossCause {
    /// The receiver was transmitting (half duplex).
    ReceiverSending,
    /// Another frame overlapped it; `hidden`: its sender cannot hear that frame's sender.
    Overlap { by: &'static str, hidden: bool },
}

impl LossCause {
    fn key(self, lost: &str) -> String {
        match self {
            LossCause::ReceiverSending => format!("{lost}: receiver sending"),
            LossCause::Overlap { by, hidden } => {
                format!(
                    "{lost} by {by} ({})",
                    if hidden { "hidden" } else { "heard" }
                )
            }
        }
    }
}

/// A frame's label and the node meant to process it, from its class and envelope (read
/// without its checksum: a node of this simulator wrote it, and its nodes leave it out, see
/// `fresh_node`).
pub(super) fn frame_label(class: Class, link_dst: u32, payload: &[u8]) -> (&'static str, u32) {
    let env = hop_wire::envelope::Envelope::parse_authenticated(payload).ok();
    let next_hop = match &env {
        Some(e) if link_dst == BROADCAST_NODE => e.repr.link_dst,
        _ => link_dst,
    };
    let label = match class {
        Class::Data => "data",
        Class::Acked => "acked",
        Class::Control => match env {
            Some(e) if e.repr.transport == hop_wire::envelope::TransportId::Hop => {
                match (e.body.first(), e.body.get(1)) {
                    (Some(2), Some(f)) if f & hop_wire::hop::FLAG_MICRO != 0 => "micro",
                    (Some(2), _) => "bsyn",
                    (Some(3), _) => "back",
                    (Some(4), _) => "e2e_back",
                    (Some(5), _) => "fin",
                    _ => "control",
                }
            }
            _ => "control",
        },
    };
    (label, next_hop)
}
