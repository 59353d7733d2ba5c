//! A TCP-like baseline: end-to-end NewReno with SACK, as kernel TCP runs over 802.11 unicast
//! in the lab, so that the simulator can put Hop and TCP on the same topology and seeds
//! (issue 46). What it models and what it leaves out is in `docs/transports.md` ("tcp").
//!
//! * The source ([`sender`]) cuts the stream into MSS-sized segments and sends them under
//!   `min(cwnd, rwnd)`: slow start from 10 segments (RFC 6928), congestion avoidance
//!   (RFC 5681), fast retransmit and NewReno fast recovery on three duplicate ACKs
//!   (RFC 6582) with the retransmissions chosen from the SACK scoreboard (RFC 6675's
//!   loss rule: a hole with three SACKed segments above it is lost), and a retransmission
//!   timeout per RFC 6298 (200 ms floor like Linux, exponential backoff, 60 s ceiling).
//! * The destination ([`receiver`]) acknowledges cumulatively with up to three SACK blocks
//!   (RFC 2018), every second segment or after 40 ms (delayed ACK, RFC 5681 §4.2), at once
//!   for out-of-order or gap-filling segments.
//! * Every node ([`relay`]) forwards segments and ACKs toward their end through one
//!   drop-tail FIFO, its interface queue: the drops TCP reacts to happen there (or on the
//!   link, after the MAC's retries). Every datagram goes as [`Class::Acked`]: unicast with
//!   link ACKs and retries at best-effort priority, as kernel TCP's frames do.
//!
//! Sequence numbers count segments (see `hop_wire::tcp`). There is no handshake: the first
//! segment opens the flow at the destination, as in the other baselines.

pub mod config;
mod receiver;
mod relay;
mod sender;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use hop_wire::tcp::{self as wire, Message};
use hop_wire::{NodeId, TransportId};

pub use config::TcpConfig;

use crate::stream::bounded::BoundedMap;
use crate::stream::sendbuf::SendBuffer;
use crate::time::Instant;
use crate::transport::{Class, Ctx, Outgoing, Received, Transport, TransportStats};
use crate::{AppError, Event, FailReason, FlowKey};
use receiver::Receiver;
use relay::Queued;
use sender::Sender;

/// The TCP-like baseline transport.
pub struct TcpTransport {
    cfg: TcpConfig,
    senders: BTreeMap<FlowKey, Sender>,
    receivers: BTreeMap<FlowKey, Receiver>,
    /// Flows delivered in full, with their cumulative ACK, to answer late retransmissions.
    finished: BoundedMap<u32>,
    /// Flows this destination gave up on: their late segments must not open them again.
    abandoned: BoundedMap<()>,
    /// The node's interface FIFO (drop-tail at `queue_limit_packets`).
    out: VecDeque<Queued>,
    events: VecDeque<Event>,
    stats: TransportStats,
}

impl TcpTransport {
    /// A transport with `cfg` ([`TcpConfig::sanitized`] first).
    pub fn new(cfg: TcpConfig) -> Self {
        TcpTransport {
            cfg: cfg.sanitized(),
            senders: BTreeMap::new(),
            receivers: BTreeMap::new(),
            finished: BoundedMap::default(),
            abandoned: BoundedMap::default(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: TransportStats::default(),
        }
    }

    pub fn config(&self) -> &TcpConfig {
        &self.cfg
    }

    /// Congestion window of a local flow, segments.
    pub fn cwnd(&self, flow: FlowKey) -> Option<f64> {
        self.senders.get(&flow).map(|s| s.cwnd)
    }

    fn bump(&mut self, name: &'static str, by: u64) {
        if by > 0 {
            *self.stats.extra.entry(name).or_insert(0) += by;
        }
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
}

impl Transport for TcpTransport {
    fn id(&self) -> TransportId {
        TransportId::Tcp
    }

    fn open(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, dst: NodeId) -> Result<(), AppError> {
        if self.senders.len() + self.receivers.len() >= self.cfg.max_flows {
            return Err(AppError::TooManyFlows(self.cfg.max_flows));
        }
        let buf = SendBuffer::new(self.cfg.mss, self.cfg.send_buffer_bytes);
        self.senders
            .insert(key, Sender::new(&self.cfg, dst, buf, ctx.now));
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
        let n = s.buf.accept(&data);
        if n < data.len() {
            s.writable_pending = true;
        }
        self.fill(ctx);
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
        s.buf.finish();
        self.fill(ctx);
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
            // Unicast: what a neighbour overhears is not for it.
            return Ok(());
        }
        *self
            .stats
            .received_by_type
            .entry(msg.type_name())
            .or_insert(0) += 1;
        match msg {
            Message::Segment(s) if s.dst != ctx.local => self.forward(ctx, s.src, s.dst, rx.body),
            Message::Ack(a) if a.src != ctx.local => self.forward(ctx, a.src, a.src, rx.body),
            Message::Segment(s) => self.on_segment(ctx, s),
            Message::Ack(a) => self.on_ack(ctx, a),
        }
        self.fill(ctx);
        self.note_usage();
        Ok(())
    }

    fn handle_timeout(&mut self, ctx: &mut Ctx<'_>) {
        self.sender_timeouts(ctx);
        self.receiver_timeouts(ctx);
        self.fill(ctx);
        self.note_usage();
    }

    fn poll_transmit(&mut self, ctx: &mut Ctx<'_>) -> Option<Outgoing> {
        self.fill(ctx);
        let q = self.out.pop_front()?;
        *self.stats.sent_by_type.entry(q.kind).or_insert(0) += 1;
        self.note_usage();
        Some(Outgoing {
            next_hop: q.next_hop,
            class: Class::Acked,
            body: q.body,
            head: 0,
        })
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut at = |x: Instant| t = Some(t.map_or(x, |y: Instant| y.min(x)));
        for s in self.senders.values() {
            if let Some(r) = s.rto_at {
                at(r);
            }
            at(s.last_progress + self.cfg.give_up_after);
        }
        for r in self.receivers.values() {
            if let Some(a) = r.ack_at {
                at(a);
            }
            at(r.last_heard + self.cfg.give_up_after);
        }
        t
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn stats(&self) -> TransportStats {
        self.stats.clone()
    }
}
