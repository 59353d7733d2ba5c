//! ATP: rate-based transport with delay feedback from the path (ATP paper §II), and its
//! aggressive and adaptive variants (§V-A2, §V-A3).
//!
//! * Every node (sources included) keeps EWMAs of the queueing delay `Q_t` and transmission
//!   delay `T_t` of the data packets it sends and stamps `D = Q_t + T_t` into a packet when it
//!   exceeds the packet's `D_max` (§II-A). The original measured both in a modified driver; a
//!   user-space node measures what it can (`docs/transports.md`): a packet's *queueing*
//!   sample is the time from entering this module's FIFO until it reached the head, its
//!   *transmission* sample the time it then waited at the head until the runtime polled it.
//!   The runtime polls only when its link queue has room, so under load the time between
//!   successive polls is the time the link needs per packet. A packet polled at once, on a
//!   free link, is an *idle* observation: `T_t` is not updated and `D = η·(Q_t + T_t)`.
//! * The receiver averages `D_max` with β and sends feedback (its average, a cumulative ACK
//!   and up to 20 SACK blocks) every epoch E, immediately for a quick-start probe (SACK-REQ),
//!   and in the adaptive variant also on the §V-A3 triggers (§II-B).
//! * The sender paces packets at rate R: [`Transport::poll_transmit`] returns nothing for a
//!   flow before its next send time, which [`Transport::poll_timeout`] reports. Feedback
//!   rate F = 1/D_avg raises R by κ·(F−R) when F > φ·R, lowers R to F when F < R, and keeps
//!   it otherwise (§II-C). Quick-start sets the first rate from a probe; three missed
//!   feedbacks restart it. SACK holes are retransmitted before new data (§III-C).

pub mod config;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use hop_wire::atp::{self as wire, Message};
use hop_wire::{NodeId, TransportId};
use rand::Rng;

pub use config::{AtpConfig, AtpVariant};

use crate::stream::reassembly::Reassembly;
use crate::stream::sendbuf::SendBuffer;
use crate::time::Instant;
use crate::transport::{Class, Ctx, Outgoing, Received, Transport, TransportStats};
use crate::{AppError, Event, FailReason, FlowKey};

fn us(d: f64) -> u32 {
    (d * 1e6).round().clamp(0.0, f64::from(u32::MAX)) as u32
}

/// A data packet waiting in this node's output FIFO.
#[derive(Debug)]
struct Queued {
    body: Vec<u8>,
    next_hop: NodeId,
    ready_at: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the answer to a quick-start probe.
    QuickStart {
        /// When an unanswered probe is sent again (None: not sent yet).
        retry_at: Option<Instant>,
        due: bool,
    },
    Running,
}

#[derive(Debug)]
struct Sender {
    dst: NodeId,
    buf: SendBuffer,
    phase: Phase,
    /// Packets per second.
    rate: f64,
    next_send: Instant,
    pace_ready: bool,
    retx: BTreeSet<u32>,
    last_sent: HashMap<u32, Instant>,
    last_feedback: Instant,
    feedback_deadline: Instant,
    missed: u32,
    writable_pending: bool,
    quick_starts: u64,
}

impl Sender {
    fn interval(&self) -> Duration {
        let x = 1.0 / self.rate;
        if x.is_finite() && x > 0.0 {
            Duration::try_from_secs_f64(x).unwrap_or(Duration::MAX)
        } else {
            Duration::ZERO
        }
    }

    fn has_packet(&self) -> bool {
        !self.retx.is_empty() || self.buf.has_pending_new()
    }

    /// A sender that had nothing to send got a packet: the pacing clock restarts now, so
    /// neither a burst nor a stale "ready" instant (which would read as link delay) follows.
    fn wake(&mut self, had_packet: bool, now: Instant) {
        if !had_packet && self.has_packet() {
            self.next_send = self.next_send.max(now);
            self.pace_ready = false;
        }
    }
}

#[derive(Debug)]
struct Receiver {
    reasm: Reassembly,
    d_avg: Option<f64>,
    hops: u8,
    epoch_at: Instant,
    last_data: Instant,
    /// Last data packet or quick-start probe of the flow: the source is still there.
    last_heard: Instant,
    missing_known: u32,
    new_drops: u32,
    above_run: u32,
    below_run: u32,
}

impl Receiver {
    fn missing_count(&self, limit: usize) -> u32 {
        self.reasm.missing(limit).iter().map(|(s, e)| e - s).sum()
    }
}

/// The ATP transport module (all three variants).
pub struct AtpTransport {
    cfg: AtpConfig,
    senders: BTreeMap<FlowKey, Sender>,
    receivers: BTreeMap<FlowKey, Receiver>,
    finished: BoundedMap<(u32, u8)>,
    /// Incomplete flows this receiver gave up on: their late packets are ignored so that a
    /// flow is never opened (and delivered from) twice.
    abandoned: BoundedMap<()>,
    out: VecDeque<Queued>,
    control: VecDeque<Outgoing>,
    events: VecDeque<Event>,
    /// EWMAs of queueing and transmission delay at this node, seconds (§II-A).
    q_t: f64,
    t_t: f64,
    last_dequeue: Option<Instant>,
    stats: TransportStats,
}

impl AtpTransport {
    /// A transport with `cfg` ([`AtpConfig::sanitized`] first).
    pub fn new(cfg: AtpConfig) -> Self {
        AtpTransport {
            cfg: cfg.sanitized(),
            senders: BTreeMap::new(),
            receivers: BTreeMap::new(),
            finished: BoundedMap::default(),
            abandoned: BoundedMap::default(),
            out: VecDeque::new(),
            control: VecDeque::new(),
            events: VecDeque::new(),
            q_t: 0.0,
            t_t: 0.0,
            last_dequeue: None,
            stats: TransportStats::default(),
        }
    }

    pub fn config(&self) -> &AtpConfig {
        &self.cfg
    }

    /// Current sending rate of a local flow, packets per second (None while in quick-start).
    pub fn flow_rate(&self, flow: FlowKey) -> Option<f64> {
        self.senders
            .get(&flow)
            .filter(|s| s.phase == Phase::Running)
            .map(|s| s.rate)
    }

    /// This node's current delay estimate `Q_t + T_t`, seconds.
    pub fn node_delay(&self) -> f64 {
        self.q_t + self.t_t
    }

    fn bump(&mut self, name: &'static str, by: u64) {
        *self.stats.extra.entry(name).or_insert(0) += by;
    }

    fn note_usage(&mut self) {
        let mut bytes: u64 = self.out.iter().map(|q| q.body.len() as u64).sum();
        bytes += self
            .senders
            .values()
            .map(|s| s.buf.bytes() as u64)
            .sum::<u64>();
        bytes += self
            .receivers
            .values()
            .map(|r| r.reasm.pending_bytes())
            .sum::<u64>();
        let peak = self
            .receivers
            .values()
            .map(|r| r.reasm.pending_packets() as u64)
            .max()
            .unwrap_or(0)
            .max(self.out.len() as u64);
        self.stats.cache_bytes = bytes;
        self.stats.cache_bytes_peak = self.stats.cache_bytes_peak.max(bytes);
        self.stats.buffered_blocks_peak = self.stats.buffered_blocks_peak.max(peak);
        self.stats.flows = (self.senders.len() + self.receivers.len()) as u64;
    }

    fn feedback(
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

    fn send_control(&mut self, ctx: &Ctx<'_>, toward: NodeId, msg: Message<'_>) {
        match ctx.routing.next_hop(toward) {
            Some(nh) => {
                *self.stats.sent_by_type.entry(msg.type_name()).or_insert(0) += 1;
                self.control.push_back(Outgoing {
                    next_hop: nh,
                    class: Class::Control,
                    body: msg.to_vec(),
                })
            }
            None => self.bump("no_route_drops", 1),
        }
    }

    /// Receiver: feedback for one flow now (§II-B), restarting its epoch.
    fn emit_feedback(&mut self, ctx: &Ctx<'_>, key: FlowKey, extra_flags: u8) {
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
        let d = us(r.d_avg.unwrap_or(0.0));
        let r = self.receivers.get(&key);
        let msg = self.feedback(key, flags, r, d);
        self.send_control(ctx, key.src, msg);
    }

    fn on_data(&mut self, ctx: &mut Ctx<'_>, rx: &Received<'_>, d: wire::Data<'_>) {
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
            if !r.is_some_and(|r| now < r.last_data + self.cfg.epoch / 2) {
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

    fn on_feedback(&mut self, ctx: &mut Ctx<'_>, f: wire::Feedback) {
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

    /// Record this node's delay samples for a packet leaving now and return the `D` to stamp.
    fn measure(&mut self, now: Instant, ready_at: Instant) -> f64 {
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

    fn stamp(&mut self, now: Instant, body: &mut [u8], ready_at: Instant) {
        let d = us(self.measure(now, ready_at));
        if body.len() >= wire::DATA_HEADER_LEN {
            let o = wire::D_MAX_OFFSET;
            let cur = u32::from_be_bytes([body[o], body[o + 1], body[o + 2], body[o + 3]]);
            if d > cur {
                body[o..o + 4].copy_from_slice(&d.to_be_bytes());
            }
            body[wire::HOPS_OFFSET] = body[wire::HOPS_OFFSET].saturating_add(1);
        }
    }

    /// The source flow whose packet is due earliest, with the instant it became due.
    fn due_sender(&self, ctx: &Ctx<'_>) -> Option<(Instant, FlowKey, NodeId)> {
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
                if best.map_or(true, |(b, ..)| t < b) {
                    best = Some((t, k, nh));
                }
            }
        }
        best
    }

    fn sender_packet(
        &mut self,
        now: Instant,
        key: FlowKey,
        ready_at: Instant,
        next_hop: NodeId,
        jitter: f64,
    ) -> Option<Outgoing> {
        let s = self.senders.get_mut(&key)?;
        let d_s = us(1.0 / s.rate);
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
        })
    }
}

/// Flows remembered after their state is gone, oldest forgotten first.
#[derive(Debug)]
struct BoundedMap<V> {
    order: VecDeque<FlowKey>,
    map: HashMap<FlowKey, V>,
}

impl<V> Default for BoundedMap<V> {
    fn default() -> Self {
        BoundedMap {
            order: VecDeque::new(),
            map: HashMap::new(),
        }
    }
}

impl<V> BoundedMap<V> {
    fn get(&self, k: &FlowKey) -> Option<&V> {
        self.map.get(k)
    }

    fn insert(&mut self, k: FlowKey, v: V, cap: usize) {
        if self.map.insert(k, v).is_none() {
            self.order.push_back(k);
        }
        while self.order.len() > cap {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }
}

fn instant_minus(t: Instant, d: Duration) -> Instant {
    Instant::from_nanos(
        t.as_nanos()
            .saturating_sub(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
    )
}

impl Transport for AtpTransport {
    fn id(&self) -> TransportId {
        TransportId::Atp
    }

    fn open(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, dst: NodeId) -> Result<(), AppError> {
        if self.senders.len() + self.receivers.len() >= self.cfg.max_flows {
            return Err(AppError::TooManyFlows(self.cfg.max_flows));
        }
        let now = ctx.now;
        self.senders.insert(
            key,
            Sender {
                dst,
                buf: SendBuffer::new(self.cfg.packet_payload_bytes, self.cfg.send_buffer_bytes),
                phase: Phase::QuickStart {
                    retry_at: None,
                    due: false,
                },
                rate: 1.0 / self.cfg.max_delay.as_secs_f64(),
                next_send: now,
                pace_ready: false,
                retx: BTreeSet::new(),
                last_sent: HashMap::new(),
                last_feedback: now,
                feedback_deadline: now + self.cfg.feedback_interval(),
                missed: 0,
                writable_pending: false,
                quick_starts: 0,
            },
        );
        self.note_usage();
        Ok(())
    }

    fn send(&mut self, ctx: &mut Ctx<'_>, flow: FlowKey, data: Bytes) -> Result<usize, AppError> {
        let s = self
            .senders
            .get_mut(&flow)
            .ok_or(AppError::UnknownFlow(flow))?;
        if s.buf.finished() {
            return Err(AppError::FlowFinished(flow));
        }
        let had = s.has_packet();
        let n = s.buf.accept(&data);
        if n < data.len() {
            s.writable_pending = true;
        }
        s.wake(had, ctx.now);
        self.note_usage();
        Ok(n)
    }

    fn finish(&mut self, ctx: &mut Ctx<'_>, flow: FlowKey) -> Result<(), AppError> {
        let s = self
            .senders
            .get_mut(&flow)
            .ok_or(AppError::UnknownFlow(flow))?;
        if s.buf.finished() {
            return Err(AppError::FlowFinished(flow));
        }
        let had = s.has_packet();
        s.buf.finish();
        s.wake(had, ctx.now);
        Ok(())
    }

    fn abort(&mut self, _ctx: &mut Ctx<'_>, flow: FlowKey) -> Result<(), AppError> {
        self.senders
            .remove(&flow)
            .ok_or(AppError::UnknownFlow(flow))?;
        self.events.push_back(Event::SendFailed {
            flow,
            reason: FailReason::Aborted,
        });
        self.note_usage();
        Ok(())
    }

    fn handle(&mut self, ctx: &mut Ctx<'_>, rx: Received<'_>) -> Result<(), hop_wire::Error> {
        let msg = wire::parse(rx.body)?;
        if rx.overheard {
            return Ok(());
        }
        *self
            .stats
            .received_by_type
            .entry(msg.type_name())
            .or_insert(0) += 1;
        match msg {
            Message::Data(d) => self.on_data(ctx, &rx, d),
            Message::Feedback(f) => self.on_feedback(ctx, f),
        }
        self.note_usage();
        Ok(())
    }

    fn handle_timeout(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        let cfg = self.cfg.clone();
        let mut failed = Vec::new();
        let mut restarts = 0u64;
        let mut missed_total = 0u64;
        for (&k, s) in self.senders.iter_mut() {
            if now >= s.last_feedback + cfg.give_up {
                let reason = if ctx.routing.next_hop(s.dst).is_none() {
                    FailReason::NoRoute
                } else {
                    FailReason::Timeout
                };
                failed.push((k, reason));
                continue;
            }
            match s.phase {
                Phase::QuickStart {
                    retry_at: Some(t),
                    due: false,
                } if now >= t => {
                    s.phase = Phase::QuickStart {
                        retry_at: Some(t),
                        due: true,
                    };
                }
                Phase::Running => {
                    if s.next_send <= now {
                        s.pace_ready = true;
                    }
                    if now >= s.feedback_deadline {
                        let every = cfg.feedback_interval().max(Duration::from_micros(1));
                        let late = (now - s.feedback_deadline).as_nanos() / every.as_nanos();
                        let k = u32::try_from(late + 1).unwrap_or(u32::MAX);
                        s.missed = s.missed.saturating_add(k);
                        missed_total += u64::from(k);
                        s.feedback_deadline += every.saturating_mul(k);
                    }
                    if s.missed >= cfg.missed_feedback_restart {
                        // §II-C: three missed feedbacks restart quick-start.
                        s.missed = 0;
                        s.phase = Phase::QuickStart {
                            retry_at: None,
                            due: true,
                        };
                        restarts += 1;
                    }
                }
                _ => {}
            }
        }
        for (k, reason) in failed {
            self.senders.remove(&k);
            self.events.push_back(Event::SendFailed { flow: k, reason });
        }
        let keys: Vec<FlowKey> = self.receivers.keys().copied().collect();
        for k in keys {
            let Some(r) = self.receivers.get(&k) else {
                continue;
            };
            if now >= r.last_heard + cfg.give_up {
                self.receivers.remove(&k);
                self.events.push_back(Event::FlowAbandoned { flow: k });
                self.abandoned.insert(k, (), cfg.finished_memory);
                self.bump("receivers_expired", 1);
            } else if now >= r.epoch_at {
                self.emit_feedback(ctx, k, 0);
            }
        }
        self.bump("quick_start_restarts", restarts);
        self.bump("feedback_missed", missed_total);
        self.note_usage();
    }

    fn poll_control(&mut self, _ctx: &mut Ctx<'_>) -> Option<Outgoing> {
        self.control.pop_front()
    }

    fn poll_transmit(&mut self, ctx: &mut Ctx<'_>) -> Option<Outgoing> {
        if let Some(o) = self.control.pop_front() {
            return Some(o);
        }
        let now = ctx.now;
        let queued = self.out.front().map(|q| q.ready_at);
        let local = self.due_sender(ctx);
        let use_local = match (queued, local) {
            (None, None) => return None,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some(q), Some((l, ..))) => l < q,
        };
        let out = if use_local {
            let (ready, key, nh) = local?;
            let jitter = ctx.rng.gen::<f64>();
            self.sender_packet(now, key, ready, nh, jitter)
        } else {
            let mut q = self.out.pop_front()?;
            self.stamp(now, &mut q.body, q.ready_at);
            *self.stats.sent_by_type.entry("forwarded").or_insert(0) += 1;
            Some(Outgoing {
                next_hop: q.next_hop,
                class: Class::Data,
                body: q.body,
            })
        };
        self.note_usage();
        out
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut at = |x: Instant| t = Some(t.map_or(x, |y: Instant| y.min(x)));
        for s in self.senders.values() {
            at(s.last_feedback + self.cfg.give_up);
            match s.phase {
                Phase::QuickStart {
                    retry_at: Some(r),
                    due: false,
                } => at(r),
                Phase::Running => {
                    at(s.feedback_deadline);
                    if s.has_packet() && !s.pace_ready {
                        at(s.next_send);
                    }
                }
                _ => {}
            }
        }
        for r in self.receivers.values() {
            at(r.epoch_at);
            at(r.last_heard + self.cfg.give_up);
        }
        t
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn stats(&self) -> TransportStats {
        let mut s = self.stats.clone();
        s.extra.insert(
            "quick_starts",
            self.senders.values().map(|s| s.quick_starts).sum(),
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::config::{EPOCH, EPOCH_AGGRESSIVE, KAPPA, KAPPA_AGGRESSIVE};
    use super::*;
    use crate::test_support::Env;

    const F: FlowKey = FlowKey { src: 1, id: 3 };

    fn ms(v: f64) -> Instant {
        Instant::from_nanos((v * 1e6) as u64)
    }

    fn rx(from: NodeId, body: &[u8]) -> Received<'_> {
        Received {
            link_src: from,
            link_dst: 0,
            overheard: false,
            body,
        }
    }

    fn feedback(flags: u8, cum: u32, d_avg_us: u32, hops: u8) -> Vec<u8> {
        Message::Feedback(wire::Feedback {
            flags,
            hops,
            src: F.src,
            id: F.id,
            cum,
            d_avg_us,
            blocks: Vec::new(),
        })
        .to_vec()
    }

    /// A sender at node 1 toward 9 via 2, past quick-start with a 10 ms probe delay.
    fn running(v: AtpVariant, probe_hops: u8) -> (AtpTransport, Env) {
        let mut t = AtpTransport::new(AtpConfig::for_variant(v));
        let mut env = Env::new(&[(9, 2)], 2);
        t.open(&mut env.ctx(ms(0.0), 1), F, 9).unwrap();
        t.send(&mut env.ctx(ms(0.0), 1), F, Bytes::from(vec![1u8; 100_000]))
            .unwrap();
        let probe = t.poll_transmit(&mut env.ctx(ms(0.0), 1)).unwrap();
        let Ok(Message::Data(d)) = wire::parse(&probe.body) else {
            panic!("probe expected");
        };
        assert!(d.is_probe());
        assert_eq!(d.hops, 1, "the source counts its own transmission");
        assert!(t.poll_transmit(&mut env.ctx(ms(0.0), 1)).is_none());
        let fb = feedback(wire::FLAG_SACK_REQ, 0, 10_000, probe_hops);
        t.handle(&mut env.ctx(ms(5.0), 1), rx(2, &fb)).unwrap();
        (t, env)
    }

    #[test]
    fn quick_start_sets_the_rate_and_adaptive_scales_by_hops() {
        let (t, _) = running(AtpVariant::Default, 4);
        assert!((t.flow_rate(F).unwrap() - 100.0).abs() < 1e-6);
        let (t, _) = running(AtpVariant::Adaptive, 4);
        // η(4) = 3.0 + 0.5 * 3 = 4.5 replaces η = 3 (§V-A3): D = 10 ms * 4.5 / 3.
        assert!((t.flow_rate(F).unwrap() - 1.0 / 0.015).abs() < 1e-6);
    }

    #[test]
    fn increase_decrease_maintain() {
        let (mut t, mut env) = running(AtpVariant::Default, 1);
        // Feedback rate 200 > 1.1 * 100: R += 0.2 * (200 - 100) (§II-C).
        let fb = feedback(0, 0, 5_000, 1);
        t.handle(&mut env.ctx(ms(10.0), 1), rx(2, &fb)).unwrap();
        assert!((t.flow_rate(F).unwrap() - 120.0).abs() < 1e-6);
        // Feedback rate 125 is within φ of 120: maintain.
        let fb = feedback(0, 0, 8_000, 1);
        t.handle(&mut env.ctx(ms(20.0), 1), rx(2, &fb)).unwrap();
        assert!((t.flow_rate(F).unwrap() - 120.0).abs() < 1e-6);
        // Feedback rate 50 < 120: drop to it at once.
        let fb = feedback(0, 0, 20_000, 1);
        t.handle(&mut env.ctx(ms(30.0), 1), rx(2, &fb)).unwrap();
        assert!((t.flow_rate(F).unwrap() - 50.0).abs() < 1e-6);
        // The aggressive κ is 0.5.
        let (mut t, mut env) = running(AtpVariant::Aggressive, 1);
        let fb = feedback(0, 0, 5_000, 1);
        t.handle(&mut env.ctx(ms(10.0), 1), rx(2, &fb)).unwrap();
        assert!((t.flow_rate(F).unwrap() - 150.0).abs() < 1e-6);
    }

    #[test]
    fn paces_by_withholding_packets_until_the_next_send_time() {
        let (mut t, mut env) = running(AtpVariant::Default, 1);
        // 100 packets/s: one packet now, the next 10 ms later.
        assert!(t.poll_transmit(&mut env.ctx(ms(5.0), 1)).is_some());
        assert!(t.poll_transmit(&mut env.ctx(ms(5.0), 1)).is_none());
        assert_eq!(t.poll_timeout(), Some(ms(15.0)));
        assert!(t.poll_transmit(&mut env.ctx(ms(14.0), 1)).is_none());
        t.handle_timeout(&mut env.ctx(ms(15.0), 1));
        let p = t.poll_transmit(&mut env.ctx(ms(15.0), 1)).unwrap();
        let Ok(Message::Data(d)) = wire::parse(&p.body) else {
            panic!()
        };
        assert_eq!(d.seq, 1);
        assert_eq!(
            d.d_s_us, 10_000,
            "the sending delay D_s travels in the header"
        );
    }

    #[test]
    fn three_missed_feedbacks_restart_quick_start() {
        let (mut t, mut env) = running(AtpVariant::Default, 1);
        let e = t.cfg.feedback_interval();
        let mut now = ms(5.0);
        for _ in 0..3 {
            now += e;
            t.handle_timeout(&mut env.ctx(now, 1));
        }
        assert_eq!(t.flow_rate(F), None, "back in quick-start");
        // The next transmission is a probe.
        let p = t.poll_transmit(&mut env.ctx(now, 1)).unwrap();
        let Ok(Message::Data(d)) = wire::parse(&p.body) else {
            panic!()
        };
        assert!(d.is_probe());
    }

    #[test]
    fn sack_holes_are_retransmitted_before_new_data() {
        let (mut t, mut env) = running(AtpVariant::Default, 1);
        let mut now = ms(5.0);
        for _ in 0..5 {
            t.handle_timeout(&mut env.ctx(now, 1));
            assert!(t.poll_transmit(&mut env.ctx(now, 1)).is_some());
            now += Duration::from_millis(10);
        }
        // Receiver holds 0, 1, 3, 4: 2 is missing. Let the retransmission guard pass.
        now += t.cfg.feedback_interval();
        let fb = Message::Feedback(wire::Feedback {
            flags: wire::FLAG_SACK_OPT,
            hops: 1,
            src: F.src,
            id: F.id,
            cum: 2,
            d_avg_us: 10_000,
            blocks: vec![(3, 5)],
        })
        .to_vec();
        t.handle(&mut env.ctx(now, 1), rx(2, &fb)).unwrap();
        t.handle_timeout(&mut env.ctx(now, 1));
        let p = t.poll_transmit(&mut env.ctx(now, 1)).unwrap();
        let Ok(Message::Data(d)) = wire::parse(&p.body) else {
            panic!()
        };
        assert_eq!(d.seq, 2);
        assert_eq!(t.stats().data_retransmissions, 1);
    }

    /// §II-A: the EWMAs are updated for every packet. After a busy period, packets that find
    /// the link free pull `T_t` down, so the stamped delay follows the end of contention;
    /// with `idle_updates_t = false` (the earlier behaviour) it stays at η times the delay
    /// of the busy period however long the channel stays idle.
    #[test]
    fn idle_observations_relax_the_transmission_delay() {
        for idle_updates_t in [true, false] {
            let cfg = AtpConfig {
                idle_updates_t,
                ..AtpConfig::default()
            };
            let mut t = AtpTransport::new(cfg);
            let mut env = Env::new(&[(9, 6)], 2);
            let body = Message::Data(wire::Data {
                flags: 0,
                hops: 1,
                src: F.src,
                id: F.id,
                dst: 9,
                seq: 0,
                d_max_us: 0,
                d_s_us: 0,
                payload: b"x",
            })
            .to_vec();
            // Busy: ten packets queued at once, the link takes one per 5 ms.
            for _ in 0..10 {
                t.handle(&mut env.ctx(ms(0.0), 5), rx(4, &body)).unwrap();
            }
            for i in 1..=10 {
                t.poll_transmit(&mut env.ctx(ms(5.0 * f64::from(i)), 5))
                    .unwrap();
            }
            let busy_t = t.t_t;
            assert!(busy_t > 0.004, "{busy_t}");
            // Idle: twenty packets, each taken by the link the moment it arrives.
            let mut last = 0;
            for i in 0..20 {
                let now = ms(100.0 + 10.0 * f64::from(i));
                t.handle(&mut env.ctx(now, 5), rx(4, &body)).unwrap();
                let o = t.poll_transmit(&mut env.ctx(now, 5)).unwrap();
                let Ok(Message::Data(d)) = wire::parse(&o.body) else {
                    panic!()
                };
                last = d.d_max_us;
            }
            if idle_updates_t {
                assert!(t.t_t < busy_t / 100.0, "{} vs {busy_t}", t.t_t);
                assert!(f64::from(last) < 0.05 * 3.0 * busy_t * 1e6, "{last}");
            } else {
                assert_eq!(t.t_t, busy_t);
                assert!(f64::from(last) >= 0.99 * 3.0 * busy_t * 1e6, "{last}");
            }
        }
    }

    #[test]
    fn relay_stamps_the_larger_delay_and_idle_uses_eta() {
        let mut t = AtpTransport::new(AtpConfig::default());
        let mut env = Env::new(&[(9, 6)], 2);
        let pkt = |d_max: u32| {
            Message::Data(wire::Data {
                flags: 0,
                hops: 1,
                src: F.src,
                id: F.id,
                dst: 9,
                seq: 0,
                d_max_us: d_max,
                d_s_us: 0,
                payload: b"x",
            })
            .to_vec()
        };
        // Three packets arrive at once; the link takes one per 2 ms.
        for _ in 0..3 {
            let b = pkt(0);
            t.handle(&mut env.ctx(ms(0.0), 5), rx(4, &b)).unwrap();
        }
        let mut stamped = Vec::new();
        for i in 0..3 {
            let now = ms(2.0 * f64::from(i) + 0.5);
            let o = t.poll_transmit(&mut env.ctx(now, 5)).unwrap();
            assert_eq!(o.next_hop, 6);
            let Ok(Message::Data(d)) = wire::parse(&o.body) else {
                panic!()
            };
            assert_eq!(d.hops, 2);
            stamped.push(d.d_max_us);
        }
        // Q and T samples: (0, 0.5), (0.5, 2), (2.5, 2) ms, averaged with α = 0.75.
        let a = 0.75;
        let (mut q, mut tt) = (0.0f64, 0.0f64);
        let mut expect = Vec::new();
        for (qs, ts) in [(0.0, 0.5), (0.5, 2.0), (2.5, 2.0)] {
            q = a * q + (1.0 - a) * qs;
            tt = a * tt + (1.0 - a) * ts;
            expect.push(((q + tt) * 1000.0).round() as u32);
        }
        assert_eq!(stamped, expect);
        // A packet already carrying a larger delay keeps it.
        let b = pkt(1_000_000);
        t.handle(&mut env.ctx(ms(10.0), 5), rx(4, &b)).unwrap();
        let o = t.poll_transmit(&mut env.ctx(ms(10.0), 5)).unwrap();
        let Ok(Message::Data(d)) = wire::parse(&o.body) else {
            panic!()
        };
        assert_eq!(d.d_max_us, 1_000_000);
        // That one found the link free at once: an idle observation, stamped with η.
        let before = t.node_delay();
        let b = pkt(0);
        t.handle(&mut env.ctx(ms(20.0), 5), rx(4, &b)).unwrap();
        let o = t.poll_transmit(&mut env.ctx(ms(20.0), 5)).unwrap();
        let Ok(Message::Data(d)) = wire::parse(&o.body) else {
            panic!()
        };
        let q_after = t.q_t;
        assert!(t.node_delay() <= before);
        assert_eq!(d.d_max_us, us(3.0 * (q_after + t.t_t)));
    }

    #[test]
    fn adaptive_receiver_sends_immediate_feedback() {
        let run = |v: AtpVariant| {
            let mut t = AtpTransport::new(AtpConfig::for_variant(v));
            let mut env = Env::new(&[(1, 4)], 2);
            // Ten packets whose path delay exceeds the sender's D_s (§V-A3).
            for seq in 0..10u32 {
                let b = Message::Data(wire::Data {
                    flags: 0,
                    hops: 3,
                    src: F.src,
                    id: F.id,
                    dst: 9,
                    seq,
                    d_max_us: 5_000,
                    d_s_us: 1_000,
                    payload: b"x",
                })
                .to_vec();
                t.handle(&mut env.ctx(ms(f64::from(seq)), 9), rx(4, &b))
                    .unwrap();
            }
            t.control.len()
        };
        assert_eq!(run(AtpVariant::Adaptive), 1);
        assert_eq!(run(AtpVariant::Aggressive), 0);
    }

    /// A receiver whose source still sends quick-start probes keeps the flow, however long
    /// data takes; a receiver that hears nothing for `give_up` drops it.
    #[test]
    fn probes_keep_the_receiver_of_a_live_source() {
        for probing in [true, false] {
            let mut t = AtpTransport::new(AtpConfig::default());
            let mut env = Env::new(&[(1, 4)], 2);
            let pkt = |flags: u8, payload: &'static [u8]| {
                Message::Data(wire::Data {
                    flags,
                    hops: 2,
                    src: F.src,
                    id: F.id,
                    dst: 9,
                    seq: 0,
                    d_max_us: 1_000,
                    d_s_us: 1_000,
                    payload,
                })
                .to_vec()
            };
            let b = pkt(0, b"x");
            t.handle(&mut env.ctx(ms(0.0), 9), rx(4, &b)).unwrap();
            for s in 1..=8u32 {
                let now = ms(5_000.0 * f64::from(s));
                if probing {
                    let b = pkt(wire::FLAG_SACK_REQ, b"");
                    t.handle(&mut env.ctx(now, 9), rx(4, &b)).unwrap();
                }
                t.handle_timeout(&mut env.ctx(now, 9));
            }
            assert_eq!(t.receivers.contains_key(&F), probing);
            assert_eq!(t.abandoned.get(&F).is_some(), !probing);
        }
    }

    #[test]
    fn variant_parameters() {
        let d = AtpConfig::for_variant(AtpVariant::Default);
        assert_eq!((d.epoch, d.kappa), (EPOCH, KAPPA));
        let a = AtpConfig::for_variant(AtpVariant::Aggressive);
        assert_eq!((a.epoch, a.kappa), (EPOCH_AGGRESSIVE, KAPPA_AGGRESSIVE));
        assert!(!a.immediate_feedback);
        let ad = AtpConfig::for_variant(AtpVariant::Adaptive);
        assert!(ad.immediate_feedback && ad.hop_scaled_eta);
        assert_eq!(AtpConfig::default(), d);
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn msg(kind: u8, v: &[u32]) -> Vec<u8> {
            let src = [1, 4][v[0] as usize % 2];
            let id = [3, 5][v[1] as usize % 2];
            let dst = [1, 9][v[2] as usize % 2];
            let seq = v[3] % 24;
            if kind % 2 == 0 {
                let probe = kind % 6 == 0;
                Message::Data(wire::Data {
                    flags: (v[4] as u8) & (wire::FLAG_FIN | wire::FLAG_SACK_REQ),
                    hops: (v[5] % 8) as u8,
                    src,
                    id,
                    dst,
                    seq,
                    d_max_us: v[6] % 100_000,
                    d_s_us: v[5] % 100_000,
                    payload: if probe { &[] } else { &[7; 10] },
                })
                .to_vec()
            } else {
                Message::Feedback(wire::Feedback {
                    flags: v[4] as u8 & 0xe1,
                    hops: (v[5] % 8) as u8,
                    src,
                    id,
                    cum: v[6] % 24,
                    d_avg_us: v[5] % 200_000,
                    blocks: vec![(seq, seq + 1 + v[2] % 4)],
                })
                .to_vec()
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(200))]
            /// Any interleaving of messages, timeouts, polls and application calls, in every
            /// variant: no panic, and a handled deadline is never reported again.
            #[test]
            fn never_panics_never_spins(variant in 0usize..3, ops in proptest::collection::vec(
                (0u8..4, any::<u8>(), proptest::collection::vec(any::<u32>(), 7), 0u64..300),
                1..120,
            )) {
                let v = [AtpVariant::Default, AtpVariant::Aggressive, AtpVariant::Adaptive][variant];
                let mut t = AtpTransport::new(AtpConfig::for_variant(v));
                let mut env = Env::new(&[(9, 2), (4, 4), (2, 2)], 2);
                t.open(&mut env.ctx(ms(0.0), 1), F, 9).unwrap();
                let mut now = ms(0.0);
                for (op, kind, vals, dt) in ops {
                    now += Duration::from_millis(dt);
                    match op {
                        0 => {
                            let b = msg(kind, &vals);
                            let from = [2, 4][vals[0] as usize % 2];
                            let _ = t.handle(&mut env.ctx(now, 1), rx(from, &b));
                        }
                        1 => {
                            if t.poll_timeout().is_some_and(|d| d <= now) {
                                t.handle_timeout(&mut env.ctx(now, 1));
                                while t.poll_transmit(&mut env.ctx(now, 1)).is_some() {}
                                prop_assert!(t.poll_timeout().is_none_or(|d| d > now));
                            }
                        }
                        2 => while t.poll_transmit(&mut env.ctx(now, 1)).is_some() {},
                        _ => {
                            let _ = t.send(&mut env.ctx(now, 1), F, Bytes::from(vec![1; 3000]));
                            if kind % 7 == 0 {
                                let _ = t.finish(&mut env.ctx(now, 1), F);
                            }
                        }
                    }
                    while t.poll_event().is_some() {}
                }
            }
        }
    }
}
