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
pub(crate) mod reassembly;
pub(crate) mod sendbuf;

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use hop_wire::hxh::{self as wire, Message};
use hop_wire::{NodeId, TransportId};
use rand::Rng;

pub use config::HxhConfig;
use reassembly::Reassembly;
use sendbuf::SendBuffer;

use crate::time::Instant;
use crate::transport::{Class, Ctx, Outgoing, Received, Transport, TransportStats};
use crate::{AppError, Event, FailReason, FlowKey};

/// Upper bound on NACK timer backoff (multiples of `nack_timeout`).
const NACK_BACKOFF_MAX: u32 = 8;
/// Upper bound on the source retransmission timer backoff (`source_rto` x 2^n).
const SOURCE_BACKOFF_MAX_EXP: u32 = 4;
/// Seconds as a duration; NaN, negative or huge values saturate instead of panicking.
fn secs(x: f64) -> Duration {
    if x.is_nan() || x <= 0.0 {
        Duration::ZERO
    } else {
        Duration::try_from_secs_f64(x).unwrap_or(Duration::MAX)
    }
}

/// Weight of a new sample in the per-hop delay deviation (RFC 6298's beta).
const HOP_DELAY_VAR_GAIN: f64 = 0.25;

/// Per-hop timeouts double for each earlier try of a packet, up to 2^this.
const HOP_BACKOFF_MAX_EXP: u32 = 2;

/// Sequence numbers a relay remembers having forwarded, to drop duplicates.
const SEEN_MAX: usize = 4096;

/// Open gaps a destination tracks per flow before forgetting the oldest.
const GAPS_MAX: usize = 4096;

#[derive(Debug, Clone)]
struct Pkt {
    seq: u32,
    /// ACK_REQ / FIN / RETX as received or set by the source.
    flags: u8,
    payload: Bytes,
    tries: u32,
}

#[derive(Debug)]
struct Inflight {
    pkt: Pkt,
    sent_at: Instant,
    /// When the packet counts as lost on this hop.
    deadline: Instant,
}

/// Forwarding state toward the next hop (sources and relays).
#[derive(Debug)]
struct Fwd {
    queue: BTreeMap<u32, Pkt>,
    inflight: BTreeMap<u32, Inflight>,
    next_hop: Option<NodeId>,
    /// Credits the next hop last advertised.
    adv: u16,
    last_feedback: Instant,
    /// When the flow last became blocked or sent a stall probe (§3.2 stall timer start).
    stall_clock: Instant,
    probe_ready: bool,
    /// EWMA of per-hop feedback delay, seconds.
    hop_delay: f64,
    /// Mean deviation of the per-hop feedback delay, seconds.
    hop_delay_var: f64,
    /// Fair-queueing finish tag (bytes).
    vtime: u64,
    /// Last hop only: packets the destination acknowledged above `rev_ack` (§3.3).
    delivered: BTreeSet<u32>,
    in_sync: bool,
    highest_tx: Option<u32>,
    /// Passive feedback toward this next hop (§3.2): a relay, whose forwarding of our packets
    /// we overhear. The pool is then the credits its latest transmission advertised, minus
    /// the packets sent since (the paper's pool, decremented per packet sent and synchronised
    /// from the shim header), not minus the packets it has not acknowledged.
    passive: bool,
    /// Packets sent since the credits were last synchronised (passive feedback).
    sent_since_sync: u32,
    /// The next hop's transmission the credits were last synchronised from: a link-layer
    /// retry of the same frame, overheard again, carries nothing new.
    synced_seq: Option<u32>,
}

impl Fwd {
    fn new(cfg: &HxhConfig, now: Instant, vclock: u64) -> Self {
        Fwd {
            queue: BTreeMap::new(),
            inflight: BTreeMap::new(),
            next_hop: None,
            adv: cfg.buffer_packets,
            last_feedback: now,
            stall_clock: now,
            probe_ready: false,
            hop_delay: cfg.hop_delay_initial.as_secs_f64(),
            hop_delay_var: cfg.hop_delay_initial.as_secs_f64() / 2.0,
            vtime: vclock,
            delivered: BTreeSet::new(),
            in_sync: true,
            highest_tx: None,
            passive: false,
            sent_since_sync: 0,
            synced_seq: None,
        }
    }

    fn held(&self) -> usize {
        self.queue.len() + self.inflight.len()
    }

    fn held_bytes(&self) -> u64 {
        let q: usize = self.queue.values().map(|p| p.payload.len()).sum();
        let i: usize = self.inflight.values().map(|p| p.pkt.payload.len()).sum();
        (q + i) as u64
    }

    fn pool(&self) -> i64 {
        let used = if self.passive {
            self.sent_since_sync as usize
        } else {
            self.inflight.len()
        };
        i64::from(self.adv) - used as i64
    }

    /// Credits the next hop advertised just now (a hop ack, a credit update, or with passive
    /// feedback one of its overheard transmissions).
    fn sync_credits(&mut self, credits: u16, now: Instant) {
        self.adv = credits;
        self.sent_since_sync = 0;
        self.last_feedback = now;
        self.probe_ready = false;
    }

    /// Feed one per-hop delay sample (packet sent -> its feedback) to the estimator.
    fn delay_sample(&mut self, cfg: &HxhConfig, sample: f64) {
        // Smoothed delay and mean deviation, as TCP's RTT estimator (RFC 6298).
        let dev = (sample - self.hop_delay).abs();
        self.hop_delay_var =
            (1.0 - HOP_DELAY_VAR_GAIN) * self.hop_delay_var + HOP_DELAY_VAR_GAIN * dev;
        self.hop_delay = (1.0 - cfg.hop_delay_gain) * self.hop_delay + cfg.hop_delay_gain * sample;
    }

    fn hop_rto(&self, cfg: &HxhConfig) -> Duration {
        let rto = secs(self.hop_delay + self.hop_delay_var * f64::from(cfg.hop_rto_multiplier));
        // With passive feedback a missing acknowledgement is mostly a transmission of the
        // next hop we did not overhear, not a lost packet (the link retries the data): send
        // again only when §3.2 would probe a stopped flow, after five EWMAs of the delay.
        let rto = if self.passive {
            rto.max(self.stall_after(cfg))
        } else {
            rto
        };
        rto.clamp(cfg.hop_rto_min, cfg.hop_rto_max)
    }

    fn stall_after(&self, cfg: &HxhConfig) -> Duration {
        secs(self.hop_delay * f64::from(cfg.stall_multiplier)).max(cfg.hop_rto_min)
    }

    fn holds(&self, seq: u32) -> bool {
        self.queue.contains_key(&seq) || self.inflight.contains_key(&seq)
    }

    fn requeue(&mut self, seq: u32, pkt: Pkt) {
        self.queue.entry(seq).or_insert(pkt);
    }
}

#[derive(Debug)]
struct Src {
    buf: SendBuffer,
    last_progress: Instant,
    last_tail: Instant,
    backoff: u32,
    writable_pending: bool,
}

impl Src {
    /// Data the application handed over that is not yet acknowledged end to end.
    fn owes(&self) -> bool {
        self.buf.unacked_sent().next().is_some() || self.buf.has_pending_new()
    }
}

#[derive(Debug)]
struct Relay {
    upstream: Option<NodeId>,
    seen: BTreeSet<u32>,
    last_adv_sent: u16,
    last_activity: Instant,
}

#[derive(Debug)]
struct Dst {
    reasm: Reassembly,
    upstream: NodeId,
    last_activity: Instant,
    /// Gaps not yet NACKed, oldest first: `(hi, t)` says that packets below `hi` still
    /// missing were first seen missing at `t` (the earliest entry with `hi` above them).
    gaps: VecDeque<(u32, Instant)>,
    /// Every missing packet below this was NACKed at least once.
    nacked_upto: u32,
    /// When the NACK of packets below `nacked_upto` still missing is sent again.
    nack_at: Option<Instant>,
    nack_backoff: u32,
    /// Time a reordered packet takes to fill its gap (EWMA and mean deviation, seconds).
    reorder_delay: f64,
    reorder_var: f64,
    last_explicit_ack: Option<Instant>,
}

impl Dst {
    /// How long a gap may stay open before it is NACKed: per-hop retransmissions reorder
    /// packets (deviation 3), so a gap is a loss only once it outlives the usual reordering.
    fn nack_holdoff(&self, cfg: &HxhConfig) -> Duration {
        if !cfg.nack_holdoff {
            return Duration::ZERO;
        }
        secs(self.reorder_delay + self.reorder_var * f64::from(cfg.hop_rto_multiplier))
            .clamp(cfg.hop_rto_min, cfg.hop_rto_max)
    }

    /// When the oldest gap not yet NACKed is due.
    fn first_nack_due(&self, cfg: &HxhConfig) -> Option<Instant> {
        self.gaps.front().map(|&(_, t)| t + self.nack_holdoff(cfg))
    }

    /// Missing runs within `[lo, hi)`.
    fn missing_within(&self, lo: u32, hi: u32) -> Vec<(u32, u32)> {
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
    fn due_nack(&mut self, cfg: &HxhConfig, now: Instant) -> Option<Vec<(u32, u32)>> {
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
    fn note_arrival(&mut self, cfg: &HxhConfig, now: Instant, seq: u32, retx: bool) {
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

    /// Credits this node advertises upstream for a relayed flow (§3.2, under-reported).
    fn advertised(cfg: &HxhConfig, fwd: &Fwd) -> u16 {
        cfg.buffer_packets.saturating_sub(fwd.held() as u16)
    }

    fn is_last_hop(flow: &Flow) -> bool {
        flow.fwd.next_hop == Some(flow.dst)
    }

    /// §3.3.1: a gap is a packet acknowledged by the destination while an earlier one is
    /// neither acknowledged nor held here.
    fn last_hop_check_gap(flow: &mut Flow) -> bool {
        if flow.fwd.in_sync && !flow.fwd.delivered.is_empty() && !flow.fwd.holds(flow.rev_ack) {
            flow.fwd.in_sync = false;
            return true;
        }
        false
    }

    /// A new reverse ACK value learnt from downstream or the destination.
    fn learn_rev_ack(&mut self, now: Instant, key: FlowKey, cum: u32) {
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        if cum <= flow.rev_ack {
            return;
        }
        flow.rev_ack = cum;
        let r = cum;
        flow.fwd.queue.retain(|&s, _| s >= r);
        flow.fwd.delivered.retain(|&s| s >= r);
        if flow.fwd.highest_tx.map_or(true, |h| r > h) {
            flow.fwd.in_sync = true;
        }
        let mut done = None;
        match &mut flow.role {
            Role::Relay(rl) => rl.seen.retain(|&s| s >= r),
            Role::Source(s) => {
                if s.buf.ack(r) {
                    s.last_progress = now;
                    s.last_tail = now;
                    s.backoff = 0;
                }
                if s.buf.complete() {
                    done = Some(s.buf.total());
                } else if s.writable_pending && s.buf.has_room() {
                    s.writable_pending = false;
                    self.events.push_back(Event::Writable { flow: key });
                }
            }
            Role::Dest(_) => {}
        }
        if let Some(bytes) = done {
            self.flows.remove(&key);
            self.events
                .push_back(Event::SendComplete { flow: key, bytes });
        }
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

    /// Passive feedback (§3.2): our next hop sent packet `d.seq` of a flow we forward to it.
    /// It holds the packet, so our transmission of it succeeded, and its shim header carries
    /// the credits it has for the flow now.
    fn on_forward_overheard(&mut self, now: Instant, key: FlowKey, d: &wire::Data<'_>) {
        let cfg = self.cfg.clone();
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        if !flow.fwd.passive || flow.fwd.synced_seq == Some(d.seq) {
            return;
        }
        flow.fwd.synced_seq = Some(d.seq);
        flow.fwd.sync_credits(d.credits, now);
        if let Role::Relay(rl) = &mut flow.role {
            rl.last_activity = now;
        }
        let mut implied = 0;
        let synced_sent_at = flow.fwd.inflight.get(&d.seq).map(|inf| inf.sent_at);
        let freed = match flow.fwd.inflight.remove(&d.seq) {
            Some(inf) => {
                flow.fwd
                    .delay_sample(&cfg, (now - inf.sent_at).as_secs_f64());
                // The next hop forwards its packets lowest sequence first, and the link
                // delivers ours in the order we sent them (802.11 retries a frame before the
                // next one). So the earlier packets we sent it before this one reached it
                // and left it already, though we did not overhear them leave.
                let sent = inf.sent_at;
                let before: Vec<u32> = flow
                    .fwd
                    .inflight
                    .range(..d.seq)
                    .filter(|(_, i)| i.sent_at <= sent)
                    .map(|(&s, _)| s)
                    .collect();
                for s in before {
                    flow.fwd.inflight.remove(&s);
                    implied += 1;
                }
                true
            }
            None => false,
        };
        // The credits are the next hop's when it sent this packet. What we sent to it after
        // this packet may still be on the way (in our interface and MAC queues) and is not
        // in them: count it against the pool, or a source that hands packets to its
        // interface faster than the air carries them overruns the next hop's buffer. Packets
        // that did arrive before the next hop sent this one are counted twice, which errs
        // on the side of the buffer.
        flow.fwd.sent_since_sync = flow
            .fwd
            .inflight
            .values()
            .filter(|i| match synced_sent_at {
                Some(t) => i.sent_at > t,
                None => true,
            })
            .count() as u32;
        self.bump("passive_syncs");
        if implied > 0 {
            *self.stats.extra.entry("passive_acks_implied").or_insert(0) += implied;
        }
        if freed {
            self.bump("passive_acks");
            self.maybe_credit_update(key);
        }
    }

    fn on_data_at_relay(
        &mut self,
        ctx: &mut Ctx<'_>,
        from: NodeId,
        key: FlowKey,
        d: wire::Data<'_>,
    ) {
        let now = ctx.now;
        if !self.flows.contains_key(&key) {
            if self.flows.len() >= self.cfg.max_flows {
                self.bump("flow_limit_drops");
                return;
            }
            self.flows.insert(
                key,
                Flow {
                    dst: d.dst,
                    rev_ack: 0,
                    fwd: Fwd::new(&self.cfg, now, self.vclock),
                    role: Role::Relay(Relay {
                        upstream: Some(from),
                        seen: BTreeSet::new(),
                        last_adv_sent: self.cfg.buffer_packets,
                        last_activity: now,
                    }),
                },
            );
        }
        let cfg = &self.cfg;
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        let Role::Relay(rl) = &mut flow.role else {
            // A packet of a flow this node sources or terminates, arriving as relay traffic.
            return;
        };
        rl.upstream = Some(from);
        rl.last_activity = now;
        let retx = d.flags & wire::DATA_RETX != 0;
        let dup =
            d.seq < flow.rev_ack || flow.fwd.holds(d.seq) || (!retx && rl.seen.contains(&d.seq));
        let mut flags = 0;
        if dup {
            *self.stats.extra.entry("duplicates").or_insert(0) += 1;
        } else if flow.fwd.held() >= usize::from(cfg.buffer_packets + cfg.reserve_packets) {
            flags |= wire::HOPACK_REFUSED;
            *self.stats.extra.entry("refused").or_insert(0) += 1;
        } else {
            flow.fwd.queue.insert(
                d.seq,
                Pkt {
                    seq: d.seq,
                    flags: d.flags & (wire::DATA_ACK_REQ | wire::DATA_FIN | wire::DATA_RETX),
                    payload: Bytes::copy_from_slice(d.payload),
                    tries: 0,
                },
            );
            rl.seen.insert(d.seq);
            while rl.seen.len() > SEEN_MAX {
                rl.seen.pop_first();
            }
        }
        let credits = Self::advertised(cfg, &flow.fwd);
        if cfg.passive_feedback && flags == 0 && !dup {
            // Passive feedback (§3.2): the upstream node learns that the packet arrived, and
            // our credits, when it overhears us forward it.
            return;
        }
        rl.last_adv_sent = credits;
        let ack = wire::HopAck {
            flags,
            credits,
            src: key.src,
            id: key.id,
            seq: d.seq,
            rev_ack: flow.rev_ack,
        };
        self.push_control(from, Message::HopAck(ack));
    }

    fn on_data_at_destination(
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
                    .map_or(true, |t| now >= t + cfg.explicit_ack_interval)
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

    fn on_hop_ack(&mut self, ctx: &mut Ctx<'_>, from: NodeId, a: wire::HopAck) {
        let now = ctx.now;
        let key = FlowKey {
            src: a.src,
            id: a.id,
        };
        let cfg = self.cfg.clone();
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        if matches!(flow.role, Role::Dest(_)) || flow.fwd.next_hop != Some(from) {
            return;
        }
        let last_hop = Self::is_last_hop(flow);
        flow.fwd.sync_credits(a.credits, now);
        if let Role::Relay(rl) = &mut flow.role {
            rl.last_activity = now;
        }
        let mut freed = false;
        if let Some(inf) = flow.fwd.inflight.remove(&a.seq) {
            flow.fwd
                .delay_sample(&cfg, (now - inf.sent_at).as_secs_f64());
            if a.flags & wire::HOPACK_REFUSED != 0 {
                flow.fwd.requeue(a.seq, inf.pkt);
            } else {
                freed = true;
                if last_hop && flow.fwd.in_sync && a.seq >= flow.rev_ack {
                    flow.fwd.delivered.insert(a.seq);
                }
            }
        }
        if !last_hop {
            self.learn_rev_ack(now, key, a.rev_ack);
        } else if a.flags & wire::HOPACK_SYNC_REPLY != 0 {
            // §3.3.1: the destination's own cumulative ACK resynchronises the last hop.
            self.bump("sync_replies");
            self.learn_rev_ack(now, key, a.rev_ack);
        }
        let mut sync_request = false;
        if last_hop {
            let advanced = self.flows.get_mut(&key).and_then(|flow| {
                if !flow.fwd.in_sync {
                    return None;
                }
                let mut r = flow.rev_ack;
                while flow.fwd.delivered.contains(&r) {
                    r += 1;
                }
                (r > flow.rev_ack).then_some(r)
            });
            if let Some(r) = advanced {
                self.learn_rev_ack(now, key, r);
            }
            if let Some(flow) = self.flows.get_mut(&key) {
                sync_request = Self::last_hop_check_gap(flow);
            }
        }
        if sync_request {
            self.bump("sync_requests");
        }
        if freed {
            self.maybe_credit_update(key);
        }
    }

    /// A relay whose last advertisement was zero tells its upstream when room appears.
    fn maybe_credit_update(&mut self, key: FlowKey) {
        let cfg = &self.cfg;
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        let credits = Self::advertised(cfg, &flow.fwd);
        // With passive feedback our next transmission of the flow carries the credits; a
        // message is needed only if none is coming (nothing queued, or no credits downstream).
        let will_send = !flow.fwd.queue.is_empty() && flow.fwd.pool() > 0;
        let Role::Relay(rl) = &mut flow.role else {
            return;
        };
        if rl.last_adv_sent == 0 && credits > 0 && !(cfg.passive_feedback && will_send) {
            if let Some(up) = rl.upstream {
                rl.last_adv_sent = credits;
                let msg = Message::Credit(wire::Credit {
                    flags: 0,
                    credits,
                    src: key.src,
                    id: key.id,
                    rev_ack: flow.rev_ack,
                });
                self.push_control(up, msg);
            }
        }
    }

    fn on_credit(&mut self, now: Instant, from: NodeId, c: wire::Credit) {
        let key = FlowKey {
            src: c.src,
            id: c.id,
        };
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        if matches!(flow.role, Role::Dest(_)) || flow.fwd.next_hop != Some(from) {
            return;
        }
        flow.fwd.sync_credits(c.credits, now);
        if let Role::Relay(rl) = &mut flow.role {
            rl.last_activity = now;
        }
        if !Self::is_last_hop(flow) {
            self.learn_rev_ack(now, key, c.rev_ack);
        }
    }

    /// Where to send a message that travels upstream toward the source of `key`.
    fn upstream_of(&self, ctx: &Ctx<'_>, key: FlowKey) -> Option<NodeId> {
        match self.flows.get(&key).map(|f| &f.role) {
            Some(Role::Relay(rl)) if rl.upstream.is_some() => rl.upstream,
            _ => ctx.routing.next_hop(key.src),
        }
    }

    fn on_ack(&mut self, ctx: &mut Ctx<'_>, a: wire::Ack) {
        let key = FlowKey {
            src: a.src,
            id: a.id,
        };
        self.touch(ctx.now, key);
        // §3.3.2: intermediate nodes update their ACK state from explicit ACKs.
        self.learn_rev_ack(ctx.now, key, a.cum);
        if a.src != ctx.local {
            if let Some(up) = self.upstream_of(ctx, key) {
                self.push_control(up, Message::Ack(a));
            }
        }
    }

    fn on_nack(&mut self, ctx: &mut Ctx<'_>, n: wire::Nack) {
        let key = FlowKey {
            src: n.src,
            id: n.id,
        };
        self.touch(ctx.now, key);
        self.learn_rev_ack(ctx.now, key, n.cum);
        if n.src != ctx.local {
            if let Some(up) = self.upstream_of(ctx, key) {
                self.push_control(up, Message::Nack(n));
            }
            return;
        }
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        let Role::Source(s) = &mut flow.role else {
            return;
        };
        let mut count = 0u64;
        for &(start, end) in &n.ranges {
            let end = end.min(s.buf.next_new());
            for seq in start.max(flow.rev_ack)..end {
                if flow.fwd.holds(seq) {
                    continue;
                }
                if let Some((payload, fin)) = s.buf.get(seq) {
                    let mut flags = wire::DATA_RETX;
                    if fin {
                        flags |= wire::DATA_FIN;
                    }
                    flow.fwd.queue.insert(
                        seq,
                        Pkt {
                            seq,
                            flags,
                            payload,
                            tries: 0,
                        },
                    );
                    count += 1;
                }
            }
        }
        *self.stats.extra.entry("e2e_retransmissions").or_insert(0) += count;
    }

    fn touch(&mut self, now: Instant, key: FlowKey) {
        if let Some(Flow {
            role: Role::Relay(rl),
            ..
        }) = self.flows.get_mut(&key)
        {
            rl.last_activity = now;
        }
    }

    /// Does this flow have a packet it could send now?
    fn has_packet(flow: &mut Flow) -> bool {
        if !flow.fwd.queue.is_empty() {
            return true;
        }
        match &mut flow.role {
            Role::Source(s) => s.buf.has_new(),
            _ => false,
        }
    }

    fn eligible(cfg: &HxhConfig, ctx: &Ctx<'_>, flow: &mut Flow) -> bool {
        if matches!(flow.role, Role::Dest(_)) {
            return false;
        }
        let nh = ctx.routing.next_hop(flow.dst);
        if nh != flow.fwd.next_hop {
            // New or changed route: fresh credit state for the new neighbour (§3.1).
            flow.fwd.next_hop = nh;
            flow.fwd.adv = cfg.buffer_packets;
            flow.fwd.in_sync = true;
            flow.fwd.delivered.clear();
            flow.fwd.last_feedback = ctx.now;
            flow.fwd.sent_since_sync = 0;
        }
        flow.fwd.passive = cfg.passive_feedback && nh.is_some() && nh != Some(flow.dst);
        if nh.is_none() || !Self::has_packet(flow) {
            return false;
        }
        flow.fwd.pool() > 0 || flow.fwd.probe_ready
    }

    fn take_packet(flow: &mut Flow) -> Option<Pkt> {
        if let Some((_, p)) = flow.fwd.queue.pop_first() {
            return Some(p);
        }
        if let Role::Source(s) = &mut flow.role {
            let (seq, payload, fin) = s.buf.take_new()?;
            return Some(Pkt {
                seq,
                flags: if fin { wire::DATA_FIN } else { 0 },
                payload,
                tries: 0,
            });
        }
        None
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::Env;

    const F: FlowKey = FlowKey { src: 1, id: 7 };

    fn ms(v: u64) -> Instant {
        Instant::from_nanos(v * 1_000_000)
    }

    fn data(seq: u32, flags: u8) -> Vec<u8> {
        data_with_credits(seq, flags, 4)
    }

    fn data_with_credits(seq: u32, flags: u8, credits: u16) -> Vec<u8> {
        Message::Data(wire::Data {
            flags,
            credits,
            src: F.src,
            id: F.id,
            dst: 9,
            seq,
            rev_ack: 0,
            payload: b"payload",
        })
        .to_vec()
    }

    fn rx(from: NodeId, to: NodeId, body: &[u8]) -> Received<'_> {
        Received {
            link_src: from,
            link_dst: to,
            overheard: false,
            body,
        }
    }

    fn drain(t: &mut HxhTransport, env: &mut Env, now: Instant, local: NodeId) -> Vec<Outgoing> {
        let mut out = Vec::new();
        while let Some(o) = t.poll_transmit(&mut env.ctx(now, local)) {
            out.push(o);
        }
        out
    }

    fn hop_acks(out: &[Outgoing]) -> Vec<wire::HopAck> {
        out.iter()
            .filter_map(|o| match wire::parse(&o.body) {
                Ok(Message::HopAck(a)) => Some(a),
                _ => None,
            })
            .collect()
    }

    /// Source node 1 with 20 000 bytes of flow F queued for 9, whose next hop is 2.
    fn source(cfg: HxhConfig) -> (HxhTransport, Env) {
        let mut t = HxhTransport::new(cfg);
        let mut env = Env::new(&[(9, 2)], 1);
        t.open(&mut env.ctx(ms(0), 1), F, 9).unwrap();
        t.send(&mut env.ctx(ms(0), 1), F, Bytes::from(vec![7u8; 20_000]))
            .unwrap();
        (t, env)
    }

    #[test]
    fn relay_advertises_free_buffer_and_refuses_beyond_reserve() {
        // Node 5 relays flow F toward 9 via 6; its next hop (6) never answers.
        let cfg = HxhConfig::default();
        let mut t = HxhTransport::new(cfg.clone());
        let mut env = Env::new(&[(9, 6), (1, 4)], 1);
        let mut acks = Vec::new();
        for seq in 0..8u32 {
            let b = data(seq, 0);
            t.handle(&mut env.ctx(ms(0), 5), rx(4, 5, &b)).unwrap();
            let out: Vec<Outgoing> = t.control.drain(..).collect();
            acks.extend(hop_acks(&out));
        }
        let credits: Vec<u16> = acks.iter().map(|a| a.credits).collect();
        // Advertised = 4 - held, under-reporting the 2 reserve packets (§3.2).
        assert_eq!(credits, vec![3, 2, 1, 0, 0, 0, 0, 0]);
        let refused: Vec<bool> = acks
            .iter()
            .map(|a| a.flags & wire::HOPACK_REFUSED != 0)
            .collect();
        let cap = usize::from(cfg.buffer_packets + cfg.reserve_packets);
        assert!(refused[..cap].iter().all(|r| !r));
        assert!(refused[cap..].iter().all(|r| *r));
        // Duplicates are acknowledged, not queued twice.
        let b = data(0, 0);
        t.handle(&mut env.ctx(ms(1), 5), rx(4, 5, &b)).unwrap();
        let a = hop_acks(&t.control.drain(..).collect::<Vec<_>>());
        assert_eq!(a[0].flags & wire::HOPACK_REFUSED, 0);
        assert_eq!(t.flows[&F].fwd.held(), cap);
    }

    #[test]
    fn passive_relay_acknowledges_only_what_its_forwarding_cannot() {
        // Relay 5 (upstream 4, next hop 6): accepted data is acknowledged by forwarding it.
        let cfg = HxhConfig {
            passive_feedback: true,
            ..HxhConfig::default()
        };
        let mut t = HxhTransport::new(cfg.clone());
        let mut env = Env::new(&[(9, 6), (1, 4)], 1);
        for seq in 0..2u32 {
            t.handle(&mut env.ctx(ms(0), 5), rx(4, 5, &data(seq, 0)))
                .unwrap();
        }
        assert!(hop_acks(&t.control.drain(..).collect::<Vec<_>>()).is_empty());
        // Its data carries its credits for the upstream node: 4 minus what it holds,
        // the packet being sent included.
        let out = drain(&mut t, &mut env, ms(1), 5);
        let credits: Vec<u16> = out
            .iter()
            .filter_map(|o| match wire::parse(&o.body) {
                Ok(Message::Data(d)) => Some(d.credits),
                _ => None,
            })
            .collect();
        assert_eq!(credits, vec![2, 2]);
        // A packet it already has (the upstream missed the forward) and one it has no room
        // for are acknowledged explicitly.
        t.handle(&mut env.ctx(ms(2), 5), rx(4, 5, &data(1, 0)))
            .unwrap();
        let a = hop_acks(&t.control.drain(..).collect::<Vec<_>>());
        assert_eq!((a.len(), a[0].seq, a[0].flags), (1, 1, 0));
        for seq in 2..8u32 {
            t.handle(&mut env.ctx(ms(3), 5), rx(4, 5, &data(seq, 0)))
                .unwrap();
        }
        let a = hop_acks(&t.control.drain(..).collect::<Vec<_>>());
        assert!(!a.is_empty() && a.iter().all(|a| a.flags & wire::HOPACK_REFUSED != 0));
    }

    #[test]
    fn passive_upstream_learns_delivery_and_credits_from_the_forward_it_overhears() {
        // Source 1 sends to 9 via relay 2, which forwards to 3.
        let (mut t, mut env) = source(HxhConfig {
            passive_feedback: true,
            ..HxhConfig::default()
        });
        assert_eq!(drain(&mut t, &mut env, ms(0), 1).len(), 4);
        assert!(t.flows[&F].fwd.passive);
        // Relay 2 forwards packet 2 to 3 with one credit left; we overhear it. Packets 0
        // and 1 went before it, so they reached the relay too.
        let fwd = |seq: u32, credits: u16| data_with_credits(seq, 0, credits);
        let heard = |from, to, body| Received {
            link_src: from,
            link_dst: to,
            overheard: true,
            body,
        };
        let b = fwd(2, 1);
        t.handle(&mut env.ctx(ms(20), 1), heard(2, 3, &b)).unwrap();
        let f = &t.flows[&F].fwd;
        assert_eq!(f.inflight.keys().copied().collect::<Vec<_>>(), vec![3]);
        assert_eq!(f.pool(), 1);
        assert_eq!(drain(&mut t, &mut env, ms(20), 1).len(), 1);
        // A link-layer retry of the same frame, heard again, is not a second advertisement.
        t.handle(&mut env.ctx(ms(21), 1), heard(2, 3, &b)).unwrap();
        assert!(drain(&mut t, &mut env, ms(21), 1).is_empty());
        // Another flow's packet from the same relay, or our packet sent by another node,
        // says nothing about ours.
        let other = fwd(3, 4);
        t.handle(&mut env.ctx(ms(22), 1), heard(7, 3, &other))
            .unwrap();
        assert!(drain(&mut t, &mut env, ms(22), 1).is_empty());
        // Without overheard feedback a packet is sent again only after §3.2's stall time
        // (five EWMAs of the delay), not after the explicit variant's shorter timeout.
        let fw = &t.flows[&F].fwd;
        assert!(fw.hop_rto(&t.cfg) >= fw.stall_after(&t.cfg));
    }

    #[test]
    fn passive_credits_count_what_is_still_on_the_way_to_the_next_hop() {
        // Source 1 hands four packets to its interface, one a millisecond; relay 2 has
        // received only the first when it forwards it, advertising three credits.
        let (mut t, mut env) = source(HxhConfig {
            passive_feedback: true,
            ..HxhConfig::default()
        });
        for i in 0..4 {
            assert!(t.poll_transmit(&mut env.ctx(ms(i), 1)).is_some());
        }
        let heard = |body| Received {
            link_src: 2,
            link_dst: 3,
            overheard: true,
            body,
        };
        let b = data_with_credits(0, 0, 3);
        t.handle(&mut env.ctx(ms(10), 1), heard(&b)).unwrap();
        // Packets 1-3 left after packet 0 and are not in the relay's three credits: sending
        // three more would put seven packets toward a relay that takes six (4 + reserve 2).
        assert_eq!(t.flows[&F].fwd.pool(), 0);
        assert!(drain(&mut t, &mut env, ms(10), 1).is_empty());
        // The relay forwards packet 3 with one credit: 1 and 2 went before it, nothing of
        // ours is on the way, and the one credit is ours to use.
        let b = data_with_credits(3, 0, 1);
        t.handle(&mut env.ctx(ms(20), 1), heard(&b)).unwrap();
        assert!(t.flows[&F].fwd.inflight.is_empty());
        assert_eq!(drain(&mut t, &mut env, ms(20), 1).len(), 1);
    }

    #[test]
    fn credits_gate_sending_and_a_stalled_flow_is_probed() {
        // Source node 1 sends to 9 via 2.
        let (mut t, mut env) = source(HxhConfig::default());
        let first = drain(&mut t, &mut env, ms(0), 1);
        // Four default credits: four packets, then nothing until feedback.
        assert_eq!(first.len(), 4);
        assert!(first
            .iter()
            .all(|o| o.class == Class::Data && o.next_hop == 2));
        // The next hop acknowledges all four but has no room left (credits 0).
        for seq in 0..4 {
            let a = Message::HopAck(wire::HopAck {
                flags: 0,
                credits: 0,
                src: F.src,
                id: F.id,
                seq,
                rev_ack: 0,
            })
            .to_vec();
            t.handle(&mut env.ctx(ms(10), 1), rx(2, 1, &a)).unwrap();
        }
        assert!(drain(&mut t, &mut env, ms(10), 1).is_empty());
        // Stall probe at 5 x EWMA of the per-hop delay after the last feedback (§3.2).
        let ewma = t.flows[&F].fwd.hop_delay;
        let due = t.poll_timeout().unwrap();
        let expect = ms(10) + Duration::from_secs_f64(5.0 * ewma);
        assert_eq!(due, expect);
        t.handle_timeout(&mut env.ctx(due, 1));
        let probe = drain(&mut t, &mut env, due, 1);
        assert_eq!(probe.len(), 1, "exactly one probe packet");
        assert!(drain(&mut t, &mut env, due, 1).is_empty());
        // A credit update reopens the flow.
        let c = Message::Credit(wire::Credit {
            flags: 0,
            credits: 4,
            src: F.src,
            id: F.id,
            rev_ack: 2,
        })
        .to_vec();
        t.handle(&mut env.ctx(due, 1), rx(2, 1, &c)).unwrap();
        // 4 credits minus the probe still in flight.
        assert_eq!(drain(&mut t, &mut env, due, 1).len(), 3);
        assert_eq!(t.flows[&F].rev_ack, 2);
    }

    #[test]
    fn last_hop_sets_sync_bit_after_a_gap_and_resyncs() {
        // Node 5 is the last hop of F (next hop = destination 9).
        let mut t = HxhTransport::new(HxhConfig::default());
        let mut env = Env::new(&[(9, 9), (1, 4)], 1);
        for seq in [0u32, 2, 3] {
            let b = data(seq, 0);
            t.handle(&mut env.ctx(ms(0), 5), rx(4, 5, &b)).unwrap();
        }
        t.control.clear();
        let sent = drain(&mut t, &mut env, ms(0), 5);
        assert_eq!(sent.len(), 3);
        let ack = |seq: u32, flags: u8, rev: u32| {
            Message::HopAck(wire::HopAck {
                flags,
                credits: 4,
                src: F.src,
                id: F.id,
                seq,
                rev_ack: rev,
            })
            .to_vec()
        };
        t.handle(&mut env.ctx(ms(1), 5), rx(9, 5, &ack(0, 0, 0)))
            .unwrap();
        assert_eq!(t.flows[&F].rev_ack, 1);
        // Packet 2 reached the destination while 1 is neither acknowledged nor held: a gap.
        t.handle(&mut env.ctx(ms(1), 5), rx(9, 5, &ack(2, 0, 0)))
            .unwrap();
        assert!(!t.flows[&F].fwd.in_sync);
        assert_eq!(t.flows[&F].rev_ack, 1, "no update across the gap");
        // Packet 3 was acknowledged too, but the last hop does not advance while out of sync.
        t.handle(&mut env.ctx(ms(1), 5), rx(9, 5, &ack(3, 0, 0)))
            .unwrap();
        assert_eq!(t.flows[&F].rev_ack, 1);
        // Packet 1 finally arrives from upstream and leaves with the sync bit.
        let b = data(1, wire::DATA_RETX);
        t.handle(&mut env.ctx(ms(2), 5), rx(4, 5, &b)).unwrap();
        t.control.clear();
        let out = drain(&mut t, &mut env, ms(2), 5);
        let Ok(Message::Data(d)) = wire::parse(&out[0].body) else {
            panic!("expected data");
        };
        assert_eq!(d.seq, 1);
        assert_ne!(d.flags & wire::DATA_SYNC, 0);
        // The destination answers with its cumulative ACK: back in sync.
        t.handle(
            &mut env.ctx(ms(3), 5),
            rx(9, 5, &ack(1, wire::HOPACK_SYNC_REPLY, 4)),
        )
        .unwrap();
        assert!(t.flows[&F].fwd.in_sync);
        assert_eq!(t.flows[&F].rev_ack, 4);
        assert_eq!(t.stats().extra.get("sync_replies"), Some(&1));
    }

    fn nacks(t: &HxhTransport) -> Vec<wire::Nack> {
        t.control
            .iter()
            .filter_map(|o| match wire::parse(&o.body) {
                Ok(Message::Nack(n)) => Some(n),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn destination_nacks_gaps_at_once_without_holdoff_and_answers_ack_requests() {
        let cfg = HxhConfig {
            nack_holdoff: false,
            ..HxhConfig::default()
        };
        let mut t = HxhTransport::new(cfg);
        let mut env = Env::new(&[(1, 5)], 1);
        let b = data(0, 0);
        t.handle(&mut env.ctx(ms(0), 9), rx(5, 9, &b)).unwrap();
        let b = data(3, wire::DATA_ACK_REQ);
        t.handle(&mut env.ctx(ms(1), 9), rx(5, 9, &b)).unwrap();
        let n = nacks(&t);
        assert_eq!(n.len(), 1);
        assert_eq!((n[0].ranges.clone(), n[0].cum), (vec![(1, 3)], 1));
        assert!(t
            .control
            .iter()
            .any(|o| matches!(wire::parse(&o.body), Ok(Message::Ack(a)) if a.cum == 1)));
        assert_eq!(t.poll_event(), Some(Event::FlowOpened { flow: F }));
        // A later packet does not NACK the same gap again ...
        t.control.clear();
        let b = data(4, 0);
        t.handle(&mut env.ctx(ms(2), 9), rx(5, 9, &b)).unwrap();
        assert!(nacks(&t).is_empty());
        // ... the NACK timer does, while the gap stays open.
        let due = t.poll_timeout().unwrap();
        assert_eq!(due, ms(1) + HxhConfig::default().nack_timeout);
        t.handle_timeout(&mut env.ctx(due, 9));
        let n = nacks(&t);
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].ranges, vec![(1, 3)]);
    }

    #[test]
    fn destination_holds_off_nacks_for_reordered_packets() {
        let mut t = HxhTransport::new(HxhConfig::default());
        let mut env = Env::new(&[(1, 5)], 1);
        for (at, seq) in [(0, 0), (1, 3)] {
            let b = data(seq, 0);
            t.handle(&mut env.ctx(ms(at), 9), rx(5, 9, &b)).unwrap();
        }
        // The gap 1..3 is not NACKed at once: per-hop retries reorder packets.
        assert!(nacks(&t).is_empty());
        let due = t.poll_timeout().unwrap();
        assert!(due > ms(1) && due < ms(1) + HxhConfig::default().nack_timeout);
        // Packet 1 arrives late (reordered) before the hold-off ends: only 2 is NACKed.
        let b = data(1, 0);
        t.handle(&mut env.ctx(ms(5), 9), rx(5, 9, &b)).unwrap();
        assert!(nacks(&t).is_empty());
        let due = t.poll_timeout().unwrap();
        t.handle_timeout(&mut env.ctx(due, 9));
        let n = nacks(&t);
        assert_eq!(n.len(), 1, "{n:?}");
        assert_eq!((n[0].ranges.clone(), n[0].cum), (vec![(2, 3)], 2));
        // The deadline handled is not reported again; the NACK timer repeats the NACK.
        t.control.clear();
        let next = t.poll_timeout().unwrap();
        assert_eq!(next, due + HxhConfig::default().nack_timeout);
        t.handle_timeout(&mut env.ctx(next, 9));
        assert_eq!(nacks(&t).len(), 1);
        // Once filled, no more NACKs.
        t.control.clear();
        let b = data(2, wire::DATA_RETX);
        t.handle(
            &mut env.ctx(next + Duration::from_millis(1), 9),
            rx(5, 9, &b),
        )
        .unwrap();
        let later = t.poll_timeout().unwrap();
        t.handle_timeout(&mut env.ctx(later, 9));
        assert!(nacks(&t).is_empty());
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        let mut t = HxhTransport::new(HxhConfig::default());
        let mut env = Env::new(&[], 1);
        assert!(t
            .handle(&mut env.ctx(ms(0), 1), rx(2, 1, &[1, 0, 0]))
            .is_err());
        assert!(t.handle(&mut env.ctx(ms(0), 1), rx(2, 1, &[])).is_err());
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn msg(kind: u8, v: &[u32]) -> Vec<u8> {
            let src = [1, 4][v[0] as usize % 2];
            let id = v[1] % 2;
            let dst = [1, 9][v[2] as usize % 2];
            let seq = v[3] % 24;
            match kind % 5 {
                0 => Message::Data(wire::Data {
                    flags: (v[4] as u8) & 0x0f,
                    credits: (v[5] % 8) as u16,
                    src,
                    id,
                    dst,
                    seq,
                    rev_ack: v[6] % 24,
                    payload: &[7; 10],
                }),
                1 => Message::HopAck(wire::HopAck {
                    flags: (v[4] as u8) & 0x03,
                    credits: (v[5] % 8) as u16,
                    src,
                    id,
                    seq,
                    rev_ack: v[6] % 24,
                }),
                2 => Message::Credit(wire::Credit {
                    flags: 0,
                    credits: (v[5] % 8) as u16,
                    src,
                    id,
                    rev_ack: v[6] % 24,
                }),
                3 => Message::Nack(wire::Nack {
                    src,
                    id,
                    cum: v[6] % 24,
                    ranges: vec![(seq, seq + 1 + v[5] % 5)],
                }),
                _ => Message::Ack(wire::Ack {
                    src,
                    id,
                    cum: v[6] % 24,
                }),
            }
            .to_vec()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(200))]
            /// Any interleaving of messages, timeouts, polls and application calls: no panic,
            /// and a deadline that has been handled is never reported again.
            #[test]
            fn never_panics_never_spins(ops in proptest::collection::vec(
                (0u8..4, any::<u8>(), proptest::collection::vec(any::<u32>(), 7), 0u64..300),
                1..120,
            ), passive in any::<bool>()) {
                let cfg = HxhConfig { passive_feedback: passive, ..HxhConfig::default() };
                let mut t = HxhTransport::new(cfg);
                let mut env = Env::new(&[(9, 2), (4, 4), (2, 2)], 1);
                let f = FlowKey { src: 1, id: 0 };
                t.open(&mut env.ctx(ms(0), 1), f, 9).unwrap();
                let mut now = ms(0);
                for (op, kind, v, dt) in ops {
                    now += Duration::from_millis(dt);
                    match op {
                        0 => {
                            let b = msg(kind, &v);
                            let from = [2, 4, 9][v[0] as usize % 3];
                            // Some of it overheard (sent to another node).
                            let to = if v[1] % 3 == 0 { 3 } else { 1 };
                            let r = Received { overheard: to != 1, ..rx(from, to, &b) };
                            let _ = t.handle(&mut env.ctx(now, 1), r);
                        }
                        1 => {
                            if t.poll_timeout().is_some_and(|d| d <= now) {
                                t.handle_timeout(&mut env.ctx(now, 1));
                                drain(&mut t, &mut env, now, 1);
                                prop_assert!(t.poll_timeout().is_none_or(|d| d > now));
                            }
                        }
                        2 => {
                            drain(&mut t, &mut env, now, 1);
                        }
                        _ => {
                            let _ = t.send(&mut env.ctx(now, 1), f, Bytes::from(vec![1; 3000]));
                            if kind % 7 == 0 {
                                let _ = t.finish(&mut env.ctx(now, 1), f);
                            }
                        }
                    }
                    while t.poll_event().is_some() {}
                }
            }
        }
    }
}
