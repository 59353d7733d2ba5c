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
mod relay;
mod scheduler;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use hop_wire::hxh::{self as wire, Message};
use hop_wire::{NodeId, TransportId};

pub use config::HxhConfig;

use crate::stream::sendbuf::SendBuffer;
use crate::time::Instant;
use crate::transport::{Class, Ctx, Outgoing, Received, Transport, TransportStats};
use crate::{AppError, Event, FailReason, FlowKey};
use dest::Dst;
use e2e::Src;
use per_hop::Fwd;
use relay::Relay;

/// Seconds as a duration; NaN, negative or huge values saturate instead of panicking.
fn duration_from_secs(x: f64) -> Duration {
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

/// What one pass over the timers found; applied once the pass is over.
#[derive(Default)]
struct Expired {
    /// Flows to forget, with the event to report (none: the flow expired quietly).
    remove: Vec<(FlowKey, Option<Event>)>,
    /// Control messages to queue (NACKs), with their next hop.
    control: Vec<(NodeId, Message<'static>)>,
    /// Packets put back in their queue after a per-hop timeout.
    hop_retx: u64,
    /// Packets dropped after `hop_retry_limit` tries.
    hop_drops: u64,
    /// Stalled flows allowed one probe packet.
    probes: u64,
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
            head: 0,
        });
    }

    /// The next queued control message, counted as sent.
    fn pop_control(&mut self) -> Option<Outgoing> {
        let o = self.control.pop_front()?;
        if let Ok(m) = wire::parse(o.message()) {
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

    /// Forget the flows a pass over the timers found expired, queue the NACKs it produced and
    /// count what it did.
    fn apply_expired(&mut self, due: Expired) {
        for (key, ev) in due.remove {
            if let Some(Flow {
                role: Role::Dest(_),
                ..
            }) = self.flows.remove(&key)
            {
                self.abandon(key);
            }
            match ev {
                Some(e) => self.events.push_back(e),
                None => self.bump("flows_expired"),
            }
        }
        for (to, m) in due.control {
            self.push_control(to, m);
        }
        *self.stats.extra.entry("hop_retx_timeouts").or_insert(0) += due.hop_retx;
        *self.stats.extra.entry("hop_drops").or_insert(0) += due.hop_drops;
        *self.stats.extra.entry("stall_probes").or_insert(0) += due.probes;
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
        let cfg = self.cfg.clone();
        let mut due = Expired::default();
        for (&key, flow) in self.flows.iter_mut() {
            let (retx, drops) = flow.fwd.expire_inflight(&cfg, ctx.now, flow.rev_ack);
            due.hop_retx += retx;
            due.hop_drops += drops;
            match &mut flow.role {
                Role::Relay(rl) => {
                    if rl.idle_past_timeout(&cfg, ctx.now) {
                        due.remove.push((key, None));
                    }
                }
                Role::Dest(d) => d.on_timeout(&cfg, ctx.now, key, &mut due),
                Role::Source(s) => {
                    if let Some(reason) = s.gives_up(&cfg, ctx, flow.dst) {
                        due.remove
                            .push((key, Some(Event::SendFailed { flow: key, reason })));
                        continue;
                    }
                    s.retransmit_tail(&cfg, ctx.now, &mut flow.fwd);
                }
            }
            if Self::stall_probe_due(&cfg, ctx.now, flow) {
                due.probes += 1;
            }
        }
        self.apply_expired(due);
        self.note_usage();
    }

    fn poll_control(&mut self, _ctx: &mut Ctx<'_>) -> Option<Outgoing> {
        self.pop_control()
    }

    fn poll_transmit(&mut self, ctx: &mut Ctx<'_>) -> Option<Outgoing> {
        if let Some(o) = self.pop_control() {
            return Some(o);
        }
        let (start, key) = self.next_flow(ctx)?;
        self.send_data(ctx, key, start)
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
