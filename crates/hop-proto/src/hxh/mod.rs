//! HxH: credit-based hop-by-hop congestion control with reverse ACKs (HxH paper §3).
//!
//! Every node keeps per-flow state: a small buffer, the credits its next hop advertised for
//! the flow, and a reverse ACK value (§3.1). Data packets carry the HxH shim header (credits,
//! reverse ACK, sync and ACK-request bits). A user-space node cannot see the 802.11 MAC's
//! per-frame success, nor overhear the next hop reliably, so this module uses the explicit
//! variant of §3.4: the next hop answers every data packet with a per-hop acknowledgement
//! ([`hop_wire::hxh::HopAck`]) carrying its free credits and its reverse ACK value. Overheard
//! data from the next hop still refreshes the reverse ACK (passive feedback, §3.3). Data
//! packets are sent as [`Class::Data`], everything else (per-hop acks, credit updates, NACKs,
//! explicit ACKs) as [`Class::Control`]. See `docs/transports.md` for every deviation.

pub mod config;
mod credits;
mod dest;
mod e2e;
mod passive;
mod per_hop;
pub(crate) mod reassembly;
mod relay;
mod scheduler;
pub(crate) mod sendbuf;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use hop_wire::hxh::{self as wire, Message};
use hop_wire::{NodeId, TransportId};
use rand::Rng;

pub use config::HxhConfig;
use sendbuf::SendBuffer;

use crate::time::Instant;
use crate::transport::{Class, Ctx, Outgoing, Received, Transport, TransportStats};
use crate::{AppError, Event, FailReason, FlowKey};
use dest::{Dst, NACK_BACKOFF_MAX};
use e2e::{Src, SOURCE_BACKOFF_MAX_EXP};
use per_hop::{Fwd, Inflight, Pkt, HOP_BACKOFF_MAX_EXP};
use relay::Relay;

/// Seconds as a duration; NaN, negative or huge values saturate instead of panicking.
fn secs(x: f64) -> Duration {
    if x.is_nan() || x <= 0.0 {
        Duration::ZERO
    } else {
        Duration::try_from_secs_f64(x).unwrap_or(Duration::MAX)
    }
}

#[derive(Debug)]
enum Role {
    Source(Box<Src>),
    Relay(Relay),
    Dest(Box<Dst>),
}

#[derive(Debug)]
struct Flow {
    dst: NodeId,
    /// Cumulative sequence acknowledged by the destination, as known here.
    rev_ack: u32,
    fwd: Fwd,
    role: Role,
}

/// The HxH transport module.
pub struct HxhTransport {
    cfg: HxhConfig,
    flows: BTreeMap<FlowKey, Flow>,
    control: VecDeque<Outgoing>,
    events: VecDeque<Event>,
    /// Finished flows at this destination, oldest first, with their final cumulative ACK.
    finished: VecDeque<(FlowKey, u32)>,
    finished_set: HashSet<FlowKey>,
    /// Incomplete flows this destination gave up on, oldest first: their late packets are
    /// ignored so that a flow is never opened (and delivered from) twice.
    abandoned: VecDeque<FlowKey>,
    abandoned_set: HashSet<FlowKey>,
    vclock: u64,
    stats: TransportStats,
}

impl HxhTransport {
    /// A transport with `cfg` ([`HxhConfig::sanitized`] first).
    pub fn new(cfg: HxhConfig) -> Self {
        HxhTransport {
            cfg: cfg.sanitized(),
            flows: BTreeMap::new(),
            control: VecDeque::new(),
            events: VecDeque::new(),
            finished: VecDeque::new(),
            finished_set: HashSet::new(),
            abandoned: VecDeque::new(),
            abandoned_set: HashSet::new(),
            vclock: 0,
            stats: TransportStats::default(),
        }
    }

    pub fn config(&self) -> &HxhConfig {
        &self.cfg
    }

    fn bump(&mut self, name: &'static str) {
        *self.stats.extra.entry(name).or_insert(0) += 1;
    }

    fn push_control(&mut self, next_hop: NodeId, msg: Message<'_>) {
        self.control.push_back(Outgoing {
            next_hop,
            class: Class::Control,
            body: msg.to_vec(),
        });
    }

    /// The next queued control message, counted as sent.
    fn pop_control(&mut self) -> Option<Outgoing> {
        let o = self.control.pop_front()?;
        if let Ok(m) = wire::parse(&o.body) {
            *self.stats.sent_by_type.entry(m.type_name()).or_insert(0) += 1;
        }
        Some(o)
    }

    fn note_usage(&mut self) {
        let mut bytes = 0u64;
        let mut peak_pkts = 0u64;
        for f in self.flows.values() {
            match &f.role {
                Role::Source(s) => bytes += s.buf.bytes() as u64,
                Role::Relay(_) => {
                    bytes += f.fwd.held_bytes();
                    peak_pkts = peak_pkts.max(f.fwd.held() as u64);
                }
                Role::Dest(d) => {
                    bytes += d.reasm.pending_bytes();
                    peak_pkts = peak_pkts.max(d.reasm.pending_packets() as u64);
                }
            }
        }
        self.stats.cache_bytes = bytes;
        self.stats.cache_bytes_peak = self.stats.cache_bytes_peak.max(bytes);
        self.stats.buffered_blocks_peak = self.stats.buffered_blocks_peak.max(peak_pkts);
        self.stats.flows = self.flows.len() as u64;
    }

    fn on_data(&mut self, ctx: &mut Ctx<'_>, rx: &Received<'_>, d: wire::Data<'_>) {
        let key = FlowKey {
            src: d.src,
            id: d.id,
        };
        if rx.overheard {
            // Passive feedback (§3.3): the next hop's shim header carries its reverse ACK.
            let from_next = self.flows.get(&key).is_some_and(|f| {
                !matches!(f.role, Role::Dest(_))
                    && f.fwd.next_hop == Some(rx.link_src)
                    && f.dst != rx.link_src
            });
            if from_next {
                if self.cfg.passive_feedback {
                    self.on_forward_overheard(ctx.now, key, &d);
                }
                self.learn_rev_ack(ctx.now, key, d.rev_ack);
            }
            return;
        }
        if d.src == ctx.local {
            return;
        }
        if d.dst == ctx.local {
            self.on_data_at_destination(ctx, rx.link_src, key, d);
        } else {
            self.on_data_at_relay(ctx, rx.link_src, key, d);
        }
    }

    fn timers(&self, flow: &Flow) -> Option<Instant> {
        let cfg = &self.cfg;
        let mut t: Option<Instant> = None;
        let mut at = |x: Instant| t = Some(t.map_or(x, |y: Instant| y.min(x)));
        if let Some(d) = flow.fwd.inflight.values().map(|i| i.deadline).min() {
            at(d);
        }
        let has_pkt = !flow.fwd.queue.is_empty()
            || matches!(&flow.role, Role::Source(s) if s.buf.has_pending_new());
        if has_pkt && flow.fwd.pool() <= 0 && !flow.fwd.probe_ready {
            at(flow.fwd.last_feedback.max(flow.fwd.stall_clock) + flow.fwd.stall_after(cfg));
        }
        match &flow.role {
            Role::Relay(rl) => at(rl.last_activity + cfg.flow_timeout),
            Role::Dest(d) => {
                if let Some(n) = d.nack_at {
                    at(n);
                }
                if let Some(n) = d.first_nack_due(cfg) {
                    at(n);
                }
                at(d.last_activity + cfg.give_up);
            }
            Role::Source(s) => {
                if s.owes() {
                    at(s.last_progress + cfg.give_up);
                }
                if s.buf.unacked_sent().next().is_some()
                    && flow.fwd.queue.is_empty()
                    && flow.fwd.inflight.is_empty()
                {
                    at(s.last_tail + cfg.source_rto.saturating_mul(1u32 << s.backoff.min(30)));
                }
            }
        }
        t
    }
}

impl Transport for HxhTransport {
    fn id(&self) -> TransportId {
        TransportId::Hxh
    }

    fn open(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, dst: NodeId) -> Result<(), AppError> {
        if self.flows.len() >= self.cfg.max_flows {
            return Err(AppError::TooManyFlows(self.cfg.max_flows));
        }
        let now = ctx.now;
        self.flows.insert(
            key,
            Flow {
                dst,
                rev_ack: 0,
                fwd: Fwd::new(&self.cfg, now, self.vclock),
                role: Role::Source(Box::new(Src {
                    buf: SendBuffer::new(self.cfg.packet_payload_bytes, self.cfg.send_buffer_bytes),
                    last_progress: now,
                    last_tail: now,
                    backoff: 0,
                    writable_pending: false,
                })),
            },
        );
        self.note_usage();
        Ok(())
    }

    fn send(&mut self, ctx: &mut Ctx<'_>, flow: FlowKey, data: Bytes) -> Result<usize, AppError> {
        let f = self
            .flows
            .get_mut(&flow)
            .ok_or(AppError::UnknownFlow(flow))?;
        let Role::Source(s) = &mut f.role else {
            return Err(AppError::UnknownFlow(flow));
        };
        if s.buf.finished() {
            return Err(AppError::FlowFinished(flow));
        }
        if !s.owes() {
            s.last_progress = ctx.now;
            s.last_tail = ctx.now;
        }
        let n = s.buf.accept(&data);
        if n < data.len() {
            s.writable_pending = true;
        }
        self.note_usage();
        Ok(n)
    }

    fn finish(&mut self, ctx: &mut Ctx<'_>, flow: FlowKey) -> Result<(), AppError> {
        let f = self
            .flows
            .get_mut(&flow)
            .ok_or(AppError::UnknownFlow(flow))?;
        let Role::Source(s) = &mut f.role else {
            return Err(AppError::UnknownFlow(flow));
        };
        if s.buf.finished() {
            return Err(AppError::FlowFinished(flow));
        }
        if !s.owes() {
            s.last_progress = ctx.now;
            s.last_tail = ctx.now;
        }
        s.buf.finish();
        Ok(())
    }

    fn abort(&mut self, _ctx: &mut Ctx<'_>, flow: FlowKey) -> Result<(), AppError> {
        match self.flows.get(&flow) {
            Some(Flow {
                role: Role::Source(_),
                ..
            }) => {
                self.flows.remove(&flow);
                self.events.push_back(Event::SendFailed {
                    flow,
                    reason: FailReason::Aborted,
                });
                self.note_usage();
                Ok(())
            }
            _ => Err(AppError::UnknownFlow(flow)),
        }
    }

    fn handle(&mut self, ctx: &mut Ctx<'_>, rx: Received<'_>) -> Result<(), hop_wire::Error> {
        let msg = wire::parse(rx.body)?;
        if !rx.overheard {
            *self
                .stats
                .received_by_type
                .entry(msg.type_name())
                .or_insert(0) += 1;
        }
        match msg {
            Message::Data(d) => self.on_data(ctx, &rx, d),
            _ if rx.overheard => {}
            Message::HopAck(a) => self.on_hop_ack(ctx, rx.link_src, a),
            Message::Credit(c) => self.on_credit(ctx.now, rx.link_src, c),
            Message::Ack(a) => self.on_ack(ctx, a),
            Message::Nack(n) => self.on_nack(ctx, n),
        }
        self.note_usage();
        Ok(())
    }

    fn handle_timeout(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        let cfg = self.cfg.clone();
        let mut remove: Vec<(FlowKey, Option<Event>)> = Vec::new();
        let mut control: Vec<(NodeId, Message<'static>)> = Vec::new();
        let mut hop_retx = 0u64;
        let mut hop_drops = 0u64;
        let mut probes = 0u64;
        for (&key, flow) in self.flows.iter_mut() {
            // Per-hop retransmission: a missing hop ack puts the packet back in the queue
            // (§3.1: "places a copy of the packet back into the flow's queue").
            let expired: Vec<u32> = flow
                .fwd
                .inflight
                .iter()
                .filter(|(_, i)| i.deadline <= now)
                .map(|(&s, _)| s)
                .collect();
            for seq in expired {
                if let Some(mut inf) = flow.fwd.inflight.remove(&seq) {
                    inf.pkt.tries += 1;
                    if inf.pkt.tries > cfg.hop_retry_limit {
                        hop_drops += 1;
                    } else if seq >= flow.rev_ack {
                        hop_retx += 1;
                        flow.fwd.requeue(seq, inf.pkt);
                    }
                }
            }
            match &mut flow.role {
                Role::Relay(rl) => {
                    if rl.last_activity + cfg.flow_timeout <= now {
                        remove.push((key, None));
                    }
                }
                Role::Dest(d) => {
                    if d.last_activity + cfg.give_up <= now {
                        remove.push((key, None));
                    } else {
                        if let Some(ranges) = d.due_nack(&cfg, now) {
                            control.push((
                                d.upstream,
                                Message::Nack(wire::Nack {
                                    src: key.src,
                                    id: key.id,
                                    cum: d.reasm.cum(),
                                    ranges,
                                }),
                            ));
                        }
                        let renack = d.nack_at.is_some_and(|t| t <= now);
                        let ranges = if renack {
                            d.missing_within(d.reasm.cum(), d.nacked_upto)
                        } else {
                            Vec::new()
                        };
                        if renack && ranges.is_empty() {
                            d.nack_at = None;
                        } else if renack {
                            d.nack_backoff = (d.nack_backoff * 2).clamp(1, NACK_BACKOFF_MAX);
                            d.nack_at = Some(now + cfg.nack_timeout.saturating_mul(d.nack_backoff));
                            control.push((
                                d.upstream,
                                Message::Nack(wire::Nack {
                                    src: key.src,
                                    id: key.id,
                                    cum: d.reasm.cum(),
                                    ranges,
                                }),
                            ));
                        }
                    }
                }
                Role::Source(s) => {
                    if s.owes() && s.last_progress + cfg.give_up <= now {
                        let reason = if ctx.routing.next_hop(flow.dst).is_none() {
                            FailReason::NoRoute
                        } else {
                            FailReason::Timeout
                        };
                        remove.push((key, Some(Event::SendFailed { flow: key, reason })));
                        continue;
                    }
                    let outstanding = s.buf.unacked_sent().next();
                    if let Some(first) = outstanding {
                        let idle = flow.fwd.queue.is_empty() && flow.fwd.inflight.is_empty();
                        let tail =
                            s.last_tail + cfg.source_rto.saturating_mul(1u32 << s.backoff.min(30));
                        if idle && tail <= now {
                            // Source retransmission timer: resend the first unacknowledged
                            // packet asking for an explicit ACK (§3.3.2).
                            if let Some((payload, fin)) = s.buf.get(first) {
                                let mut flags = wire::DATA_RETX | wire::DATA_ACK_REQ;
                                if fin {
                                    flags |= wire::DATA_FIN;
                                }
                                flow.fwd.queue.insert(
                                    first,
                                    Pkt {
                                        seq: first,
                                        flags,
                                        payload,
                                        tries: 0,
                                    },
                                );
                            }
                            s.last_tail = now;
                            s.backoff = (s.backoff + 1).min(SOURCE_BACKOFF_MAX_EXP);
                        }
                    }
                }
            }
            // §3.2: probe a stalled flow after 5x the EWMA of previous delays.
            let waiting = Self::has_packet(flow);
            if waiting
                && flow.fwd.pool() <= 0
                && !flow.fwd.probe_ready
                && flow.fwd.last_feedback.max(flow.fwd.stall_clock) + flow.fwd.stall_after(&cfg)
                    <= now
            {
                flow.fwd.probe_ready = true;
                probes += 1;
            }
        }
        for (key, ev) in remove {
            if let Some(Flow {
                role: Role::Dest(_),
                ..
            }) = self.flows.remove(&key)
            {
                self.events.push_back(Event::FlowAbandoned { flow: key });
                self.abandoned.push_back(key);
                self.abandoned_set.insert(key);
                while self.abandoned.len() > self.cfg.finished_memory {
                    if let Some(k) = self.abandoned.pop_front() {
                        self.abandoned_set.remove(&k);
                    }
                }
            }
            match ev {
                Some(e) => self.events.push_back(e),
                None => self.bump("flows_expired"),
            }
        }
        for (to, m) in control {
            self.push_control(to, m);
        }
        *self.stats.extra.entry("hop_retx_timeouts").or_insert(0) += hop_retx;
        *self.stats.extra.entry("hop_drops").or_insert(0) += hop_drops;
        *self.stats.extra.entry("stall_probes").or_insert(0) += probes;
        self.note_usage();
    }

    fn poll_control(&mut self, _ctx: &mut Ctx<'_>) -> Option<Outgoing> {
        self.pop_control()
    }

    fn poll_transmit(&mut self, ctx: &mut Ctx<'_>) -> Option<Outgoing> {
        if let Some(o) = self.pop_control() {
            return Some(o);
        }
        // Per-flow fair queueing (§3.1): serve the eligible flow with the smallest start tag.
        let cfg = &self.cfg;
        let vclock = self.vclock;
        let mut best: Option<(u64, FlowKey)> = None;
        for (&key, flow) in self.flows.iter_mut() {
            if Self::eligible(cfg, ctx, flow) {
                let start = flow.fwd.vtime.max(vclock);
                if best.map_or(true, |(b, _)| start < b) {
                    best = Some((start, key));
                }
            }
        }
        let (start, key) = best?;
        let flow = self.flows.get_mut(&key)?;
        let probe = flow.fwd.pool() <= 0;
        let mut pkt = Self::take_packet(flow)?;
        let next_hop = flow.fwd.next_hop?;
        if let Role::Source(s) = &mut flow.role {
            // §3.3.2: the last packet to leave the source's buffer asks for an explicit ACK.
            if flow.fwd.queue.is_empty() && !s.buf.has_new() {
                pkt.flags |= wire::DATA_ACK_REQ;
            }
        }
        let mut flags = pkt.flags;
        if next_hop == flow.dst {
            flow.fwd.highest_tx = Some(flow.fwd.highest_tx.map_or(pkt.seq, |h| h.max(pkt.seq)));
            if !flow.fwd.in_sync {
                flags |= wire::DATA_SYNC;
            }
        }
        let credits = match &mut flow.role {
            Role::Relay(rl) => {
                // The packet being sent stays ours (in flight) until the next hop has it.
                let c = cfg
                    .buffer_packets
                    .saturating_sub(flow.fwd.held() as u16 + 1);
                if cfg.passive_feedback {
                    // The upstream node overhears this advertisement (§3.2).
                    rl.last_adv_sent = c;
                }
                c
            }
            _ => cfg.buffer_packets,
        };
        let body = Message::Data(wire::Data {
            flags,
            credits,
            src: key.src,
            id: key.id,
            dst: flow.dst,
            seq: pkt.seq,
            rev_ack: flow.rev_ack,
            payload: &pkt.payload,
        })
        .to_vec();
        let len = pkt.payload.len().max(1) as u64;
        flow.fwd.vtime = start + len;
        self.vclock = start;
        if probe {
            flow.fwd.probe_ready = false;
        }
        let retx = pkt.tries > 0;
        let pool_before = flow.fwd.pool();
        flow.fwd.sent_since_sync = flow.fwd.sent_since_sync.saturating_add(1);
        if probe || pool_before <= 1 {
            // This send exhausts the credits (or is a probe): the stall timer starts now.
            flow.fwd.stall_clock = ctx.now;
        }
        // Per-hop timeout: doubled for each earlier try and stretched by a random 0-50 %, so
        // that neighbours that lost frames together (hidden terminals) do not retry together.
        let rto = flow
            .fwd
            .hop_rto(cfg)
            .saturating_mul(1u32 << pkt.tries.min(HOP_BACKOFF_MAX_EXP))
            .min(cfg.hop_rto_max)
            .mul_f64(1.0 + 0.5 * ctx.rng.gen::<f64>());
        flow.fwd.inflight.insert(
            pkt.seq,
            Inflight {
                pkt,
                sent_at: ctx.now,
                deadline: ctx.now + rto,
            },
        );
        if retx {
            self.stats.data_retransmissions += 1;
        }
        *self.stats.sent_by_type.entry("data").or_insert(0) += 1;
        if probe {
            self.bump("probe_packets");
        }
        Some(Outgoing {
            next_hop,
            class: Class::Data,
            body,
        })
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.flows.values().filter_map(|f| self.timers(f)).min()
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn stats(&self) -> TransportStats {
        self.stats.clone()
    }
}
