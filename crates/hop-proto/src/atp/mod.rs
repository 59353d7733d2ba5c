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
mod delay;
mod receiver;
mod sender;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use hop_wire::atp::{self as wire, Message};
use hop_wire::{NodeId, TransportId};
use rand::Rng;

pub use config::{AtpConfig, AtpVariant};

use crate::stream::bounded::BoundedMap;
use crate::stream::sendbuf::SendBuffer;
use crate::time::Instant;
use crate::transport::{Class, Ctx, Outgoing, Received, Transport, TransportStats};
use crate::{AppError, Event, FailReason, FlowKey};
use delay::Queued;
use receiver::Receiver;
use sender::{Phase, Sender};

/// Seconds as whole microseconds (the wire's delay fields), saturating.
fn us_from_secs(d: f64) -> u32 {
    (d * 1e6).round().clamp(0.0, f64::from(u32::MAX)) as u32
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

    fn send_control(&mut self, ctx: &Ctx<'_>, toward: NodeId, msg: Message<'_>) {
        match ctx.routing.next_hop(toward) {
            Some(nh) => {
                *self.stats.sent_by_type.entry(msg.type_name()).or_insert(0) += 1;
                self.control.push_back(Outgoing {
                    next_hop: nh,
                    class: Class::Control,
                    body: msg.to_vec(),
                    head: 0,
                })
            }
            None => self.bump("no_route_drops", 1),
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
                head: 0,
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
