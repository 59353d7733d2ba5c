//! Hop: reliable per-hop block transfer (Hop paper, NSDI 2009, §3).
//!
//! Data moves in blocks of up to 1 MiB, split into packets and sent in txop-sized bursts. Each
//! hop runs rounds of BSYN → BACK (bitmap) → missing packets until its next hop holds the block
//! (§3.1); relays forward a block as soon as they hold a txop's worth of it (spatial
//! pipelining). The destination acknowledges each block end to end; a source that hears
//! nothing within the last block round-trip time sends a virtual retransmission that is served
//! from the caches along the path (§3.2). Per flow a node holds at most H blocks not yet moved
//! downstream (backpressure, §3.3); blocks wait in custody while the next hop is unreachable
//! (§3.4); a receiver serves one upstream sender at a time (ack withholding, §3.5); small
//! transfers ride on the BSYN and are served first (micro-blocks, §3.6).
//!
//! The transport is sans-IO: see [`crate::Transport`].

mod abort;
mod admission;
mod back;
mod bitmap;
mod block_data;
mod bsyn;
mod bsyn_timer;
mod cache;
mod config;
mod control_copies;
mod custody;
mod delivery;
mod diag;
mod fin_probe;
mod flow;
mod link_window;
mod loss;
mod micro;
mod neighbours;
mod receiver;
mod rounds_behind;
mod scheduler;
mod shared_turns;
mod source;
mod timers;
mod transfer;
mod turn_horizon;
mod vtx;
mod withholding;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use hop_wire::hop::{
    BlockGeom, ControlSeq, HopBody, HopHeader, HopMessage, MsgType, FLAG_ABORT, FLAG_ASK,
    FLAG_BEHIND, FLAG_COMPLETE, FLAG_COPY, FLAG_END_HEARD, FLAG_FIN, FLAG_MICRO, FLAG_VTX,
    FLAG_WAIT, PRIORITY_EXPEDITED, PRIORITY_NORMAL,
};
use hop_wire::{NodeId, TransportId};
use rand::Rng;

use crate::routing::Routing;
use crate::time::Instant;
use crate::transport::{Class, Ctx, Outgoing, Received, Transport, TransportStats};
use crate::{AppError, Event, FailReason, FlowKey};

use abort::*;
use admission::*;
use block_data::BlockData;
use bsyn::*;
use bsyn_timer::*;
use control_copies::*;
use diag::*;
use fin_probe::*;
use flow::*;
use link_window::*;
use loss::*;
use micro::*;
use neighbours::*;
use receiver::*;
use rounds_behind::*;
use shared_turns::*;
use timers::*;
use transfer::*;
use withholding::*;

pub use bitmap::Bitmap;
pub use config::*;
pub use custody::{
    CustodyStore, Delivery, DestProgress, MemoryOnly, Persist, StoreFull, StoredBlock,
};

/// The flow a message belongs to.
fn flow_key(h: &HopHeader) -> FlowKey {
    FlowKey {
        src: h.src,
        id: h.flow_id,
    }
}

/// The Hop transport of one node.
pub struct HopTransport {
    cfg: HopConfig,
    packet_size: u16,
    txop_packets: u32,
    flows: BTreeMap<FlowKey, Flow>,
    control: VecDeque<Outgoing>,
    round_robin: VecDeque<FlowKey>,
    txop_left: u32,
    events: VecDeque<Event>,
    /// Upstream blocks being received, and BSYNs withheld (§3.3, §3.5).
    withholding: Withholding,
    closed: ClosedFlows,
    /// Next hops' liveness: silent ones are probed, not asked per transfer.
    neighbours: Neighbours,
    /// Aborts this node passes on until its next hop has heard them (abort.rs).
    aborts: Aborts,
    store: Box<dyn CustodyStore>,
    stats: TransportStats,
    cache_bytes: u64,
    timer: Option<Instant>,
    /// Each flow's next deadline, indexed by time, and the flows whose deadline may have
    /// changed since it was last computed (timers.rs).
    deadlines: Deadlines,
    housekeeping_at: Option<Instant>,
    /// Application bytes held at this node's sources (sending and waiting flows), not yet
    /// cut into blocks: part of `cache_bytes`.
    app_bytes: u64,
    /// This node's own flows opened beyond `max_sending_flows`, waiting to start.
    waiting: OpenQueue,
    /// Source flows with new application bytes or a finish to cut into blocks when polled.
    to_form: Vec<FlowKey>,
    /// What is known of the data packets this node handed to its link (loss inference).
    link_queue: LinkQueue,
    /// BSYN-to-BACK round trip per next hop (`adaptive_bsyn_timeout`).
    bsyn_rtt: BTreeMap<NodeId, RttEstimate>,
    /// Incoming flows (relayed or delivered here) in the order they finished: at the flow
    /// limit the oldest one that holds nothing in custody gives up its state (flow.rs).
    finished_flows: VecDeque<FlowKey>,
    /// Micro-blocks in progress per next hop, and flows waiting for a turn (micro.rs).
    micro_turns: MicroTurns,
    /// Data packets sent more than once, per next hop (for operators: a lossy link).
    retx_to: BTreeMap<NodeId, u64>,
    /// Transfers that may have packets in flight (handed to the link and not reported): the
    /// ones the link window counts, so that counting visits no idle flow.
    in_flight: BTreeSet<(FlowKey, u32)>,
    /// The link window and the delivery rate that sizes it.
    window: LinkWindow,
    /// Time in each sending state (the `time_*_ms` counters).
    state_clock: StateClock,
    /// The flows whose BSYNs this node receives (blocks sized to shared turns).
    shared_turns: SharedTurns,
    /// Numbered control datagrams per neighbour, their loss, and copies (control_copies.rs).
    control_link: ControlLink,
    /// Whether this node's BSYNs reach each next hop behind their data (rounds_behind.rs).
    round_order: RoundOrder,
}

impl HopTransport {
    pub fn new(cfg: HopConfig) -> Self {
        Self::with_store(cfg, Box::new(MemoryOnly))
    }

    /// A transport persisting custody through `store`.
    pub fn with_store(cfg: HopConfig, store: Box<dyn CustodyStore>) -> Self {
        let pkt = cfg.packet_size();
        let txop_pkts = cfg.txop_packets();
        let cfg_window = cfg.link_window_packets;
        HopTransport {
            cfg,
            packet_size: pkt,
            txop_packets: txop_pkts,
            flows: BTreeMap::new(),
            control: VecDeque::new(),
            round_robin: VecDeque::new(),
            txop_left: 0,
            events: VecDeque::new(),
            withholding: Withholding::default(),
            closed: ClosedFlows::default(),
            neighbours: Neighbours::default(),
            aborts: Aborts::default(),
            store,
            stats: TransportStats::default(),
            cache_bytes: 0,
            timer: None,
            deadlines: Deadlines::default(),
            in_flight: BTreeSet::new(),
            housekeeping_at: None,
            to_form: Vec::new(),
            waiting: OpenQueue::default(),
            app_bytes: 0,
            link_queue: LinkQueue::default(),
            bsyn_rtt: BTreeMap::new(),
            finished_flows: VecDeque::new(),
            micro_turns: MicroTurns::default(),
            retx_to: BTreeMap::new(),
            window: LinkWindow {
                delivered: 0,
                rate_mark: None,
                window: cfg_window,
            },
            state_clock: StateClock::default(),
            shared_turns: SharedTurns::default(),
            control_link: ControlLink::default(),
            round_order: RoundOrder::default(),
        }
    }

    pub fn config(&self) -> &HopConfig {
        &self.cfg
    }

    fn extra(&mut self, k: &'static str) {
        bump(&mut self.stats.extra, k);
    }

    fn push_ctrl(&mut self, next_hop: NodeId, msg: &HopMessage<'_>) {
        let mut body = Vec::with_capacity(msg.encoded_len());
        if msg.emit(&mut body).is_err() {
            return;
        }
        bump(
            &mut self.stats.sent_by_type,
            name_of(msg.msg_type(), msg.header.flags),
        );
        self.queue_control(next_hop, body);
    }

    /// Every message about a flow carries the flow's class (header byte 3), written here as
    /// it leaves, in one place, rather than where each message is made; a message about a
    /// flow this node holds no state for says normal.
    fn stamp_priority(&self, mut out: Outgoing) -> Outgoing {
        let head = out.head;
        if let Some(b) = out.body.get(head + 4..head + 12) {
            let key = FlowKey {
                src: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
                id: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            };
            if let Some(f) = self.flows.get(&key) {
                out.body[head + 3] = f.priority;
            }
        }
        out
    }

    fn header(key: FlowKey, dst: NodeId, block: u32, flags: u8, ttl: u8) -> HopHeader {
        HopHeader {
            priority: 0,
            flags,
            ttl,
            src: key.src,
            flow_id: key.id,
            dst,
            block_num: block,
        }
    }
}

impl Transport for HopTransport {
    fn id(&self) -> TransportId {
        TransportId::Hop
    }

    fn custody_persisted(&mut self, ctx: &mut Ctx<'_>, flow: FlowKey, block: u32, ok: bool) {
        self.tick(ctx.now);
        self.on_custody_persisted(ctx, flow, block, ok);
    }

    fn delivery_persisted(&mut self, ctx: &mut Ctx<'_>, flow: FlowKey, block: u32, ok: bool) {
        self.tick(ctx.now);
        self.on_delivery_persisted(ctx, flow, block, ok);
    }

    fn open(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, dst: NodeId) -> Result<(), AppError> {
        self.tick(ctx.now);
        if dst == ctx.local {
            return Err(AppError::SelfDestination);
        }
        self.open_flow(ctx, key, dst)?;
        self.refresh_timer(ctx.now);
        Ok(())
    }

    fn send(&mut self, ctx: &mut Ctx<'_>, flow: FlowKey, data: Bytes) -> Result<usize, AppError> {
        self.tick(ctx.now);
        if self.waiting.contains(&flow) {
            return self.send_waiting(flow, data);
        }
        let limit = self.cfg.source_buffer_bytes.max(self.cfg.block_bytes());
        let f = self
            .flows
            .get_mut(&flow)
            .ok_or(AppError::UnknownFlow(flow))?;
        let dst = f.dst;
        let s = f.source_mut().ok_or(AppError::UnknownFlow(flow))?;
        if s.finish {
            return Err(AppError::FlowFinished(flow));
        }
        let room = limit.saturating_sub(s.pending_bytes);
        let take = take_app_bytes(
            &mut s.pending,
            &mut s.pending_bytes,
            &mut s.blocked,
            room,
            data,
        );
        if take > 0 {
            // A flow that outgrows one block holds nothing back (admission.rs).
            self.waiting
                .note_size(dst, s, self.cfg.block_bytes() as u64);
        }
        self.count_app_bytes(take);
        if take > 0 {
            // Blocks are cut when the link asks for data (poll_transmit), so bytes and a
            // finish offered together travel in one block.
            if !self.to_form.contains(&flow) {
                self.to_form.push(flow);
            }
        }
        let _ = ctx;
        Ok(take)
    }

    fn finish(&mut self, ctx: &mut Ctx<'_>, flow: FlowKey) -> Result<(), AppError> {
        self.tick(ctx.now);
        if self.waiting.contains(&flow) {
            return self.finish_waiting(flow);
        }
        let f = self
            .flows
            .get_mut(&flow)
            .ok_or(AppError::UnknownFlow(flow))?;
        let s = f.source_mut().ok_or(AppError::UnknownFlow(flow))?;
        if s.finish {
            return Err(AppError::FlowFinished(flow));
        }
        s.finish = true;
        if !self.to_form.contains(&flow) {
            self.to_form.push(flow);
        }
        let _ = ctx;
        Ok(())
    }

    fn abort(&mut self, ctx: &mut Ctx<'_>, flow: FlowKey) -> Result<(), AppError> {
        self.tick(ctx.now);
        if self.abort_waiting(flow) {
            return Ok(());
        }
        if self.flows.get(&flow).is_none_or(|f| f.source().is_none()) {
            return Err(AppError::UnknownFlow(flow));
        }
        self.abort_flow(ctx, flow);
        self.refresh_timer(ctx.now);
        Ok(())
    }

    fn neighbour_reports(&self) -> Vec<crate::transport::NeighbourReport> {
        let mut ids: Vec<NodeId> = self.bsyn_rtt.keys().copied().collect();
        ids.extend(self.retx_to.keys().copied());
        let control: BTreeMap<NodeId, crate::transport::ControlLoss> =
            self.control_link.reports().collect();
        ids.extend(control.keys().copied());
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .map(|id| crate::transport::NeighbourReport {
                id,
                rtt: self.bsyn_rtt.get(&id).map(|e| e.srtt),
                data_retransmissions: self.retx_to.get(&id).copied().unwrap_or(0),
                control_loss: control.get(&id).copied(),
            })
            .collect()
    }

    fn set_priority(
        &mut self,
        ctx: &mut Ctx<'_>,
        flow: FlowKey,
        priority: u8,
    ) -> Result<(), AppError> {
        self.tick(ctx.now);
        if priority > PRIORITY_EXPEDITED {
            return Err(AppError::Unsupported(TransportId::Hop));
        }
        if !self.set_source_priority(flow, priority) {
            return Err(AppError::UnknownFlow(flow));
        }
        Ok(())
    }

    fn abort_earlier(
        &mut self,
        ctx: &mut Ctx<'_>,
        flow: FlowKey,
        dst: NodeId,
    ) -> Result<(), AppError> {
        self.tick(ctx.now);
        if dst == ctx.local {
            return Err(AppError::SelfDestination);
        }
        // The FIN the source would have sent, repeated until the next hop has it (abort.rs);
        // the bytes the earlier run sent are not known here, and no node needs them.
        self.start_abort(ctx, flow, dst, 0);
        self.refresh_timer(ctx.now);
        Ok(())
    }

    fn set_lifetime(
        &mut self,
        ctx: &mut Ctx<'_>,
        flow: FlowKey,
        until: Instant,
    ) -> Result<(), AppError> {
        self.tick(ctx.now);
        if !self.set_source_lifetime(flow, until) {
            return Err(AppError::UnknownFlow(flow));
        }
        self.refresh_timer(ctx.now);
        Ok(())
    }

    fn handle(&mut self, ctx: &mut Ctx<'_>, rx: Received<'_>) -> Result<(), hop_wire::Error> {
        self.tick(ctx.now);
        let msg = HopMessage::parse(rx.body)?;
        let h = msg.header;
        self.heard_from(ctx, rx.link_src);
        if !rx.overheard {
            bump(
                &mut self.stats.received_by_type,
                name_of(msg.msg_type(), h.flags),
            );
        }
        match msg.body {
            HopBody::Data {
                offset,
                geom,
                packet_num,
                payload,
            } => {
                let data = DataIn {
                    header: h,
                    offset,
                    geom,
                    packet_num,
                    payload,
                };
                self.on_data(ctx, &rx, &data);
            }
            _ if rx.overheard => {}
            HopBody::Bsyn { .. } | HopBody::Back { .. } | HopBody::E2eBack { .. }
                if !self.aborts.is_empty()
                    && !self.flows.contains_key(&flow_key(&h))
                    && self.answer_aborted(ctx, flow_key(&h), rx.link_src) => {}
            HopBody::Bsyn { ctl, .. } | HopBody::Back { ctl, .. }
                if !self
                    .control_link
                    .on_received(rx.link_src, ctl, h.flags & FLAG_COPY != 0) =>
            {
                // A copy whose original was handled (control_copies.rs).
                self.extra("control_copies_dropped");
            }
            HopBody::Bsyn {
                offset,
                geom,
                packet_num,
                expect,
                payload,
                ..
            } => {
                let bsyn = BsynIn {
                    from: rx.link_src,
                    header: h,
                    offset,
                    geom,
                    packet_num,
                    payload,
                    expect,
                    round_end: (h.flags & FLAG_MICRO == 0 && packet_num > 0)
                        .then(|| u32::from(packet_num) - 1),
                    retry: false,
                };
                self.on_bsyn(ctx, &bsyn);
                self.pump_flow(ctx, flow_key(&h));
            }
            HopBody::Back {
                packets,
                duplicates,
                block_hint_kib,
                ctl,
                bitmap,
                ..
            } => self.on_back(
                ctx,
                rx.link_src,
                &h,
                packets,
                (duplicates, block_hint_kib, ctl.echo),
                bitmap,
            ),
            HopBody::E2eBack { cum_blocks } => self.on_e2e(ctx, &h, cum_blocks),
            HopBody::Fin { total_bytes } => self.on_fin(ctx, &h, rx.link_src, total_bytes),
        }
        if matches!(msg.body, HopBody::Data { .. } | HopBody::Bsyn { .. }) && !rx.overheard {
            // The upstream's word on the flow's class (the source's, passed on).
            if let Some(f) = self.flows.get_mut(&flow_key(&h)) {
                if f.source().is_none() {
                    f.priority = h.priority;
                }
            }
        }
        if matches!(msg.body, HopBody::Data { .. }) && !rx.overheard {
            self.pump_flow(ctx, flow_key(&h));
        }
        self.refresh_timer(ctx.now);
        Ok(())
    }

    fn handle_timeout(&mut self, ctx: &mut Ctx<'_>) {
        self.tick(ctx.now);
        let now = ctx.now;
        if self.aborts.next_deadline().is_some_and(|t| t <= now) {
            self.abort_notices(ctx);
        }
        // A waiting flow whose destination's start hold ended (admission.rs): started here,
        // so that the deadline passed does not stay the transport's next one.
        self.start_waiting(ctx);
        // BSYN retransmissions (§3.1): an unanswered BSYN is sent again with backoff. Only the
        // BSYN is repeated: the data it followed is not judged lost for want of an answer
        // (the BSYN or its BACK may be what was lost); the next BACK's bitmap says what is
        // missing (§3), and the BACK's loss rules decide what is sent again.
        // Only the flows whose deadline passed are visited, so a timeout costs what is due,
        // not what is held; housekeeping visits every flow a few times a second.
        let due = self.deadlines.take_due(now);
        for k in &due {
            let Some(f) = self.flows.get_mut(k) else {
                continue;
            };
            for x in f.outs.values_mut() {
                if let TransferState::AwaitBack { deadline } = x.state {
                    if deadline <= now {
                        x.state = TransferState::NeedBsyn;
                    }
                }
            }
        }
        let all = self.housekeeping_at.is_some_and(|h| h <= now);
        if all {
            self.housekeeping_at = None;
            self.housekeeping(ctx);
            // Deliveries the store refused are retried (room may have been freed).
            let blocked: Vec<FlowKey> = self
                .flows
                .iter()
                .filter(|(_, f)| f.dest().is_some_and(|d| d.blocked))
                .map(|(k, _)| *k)
                .collect();
            for k in blocked {
                self.deliver(ctx, k);
            }
        }
        let keys: Vec<FlowKey> = if all {
            self.flows.keys().copied().collect()
        } else {
            due
        };
        for k in keys {
            self.pump_flow(ctx, k);
        }
        self.service_waiting(ctx);
        self.refresh_timer(now);
    }

    fn poll_transmit(&mut self, ctx: &mut Ctx<'_>) -> Option<Outgoing> {
        self.tick(ctx.now);
        let looked = self.start_waiting(ctx);
        if !self.to_form.is_empty() {
            for key in std::mem::take(&mut self.to_form) {
                self.pump_flow(ctx, key);
            }
            self.refresh_timer(ctx.now);
        } else if looked && self.waiting.hold_until.is_some() {
            // A start hold's end became a deadline.
            self.refresh_timer(ctx.now);
        }
        if let Some(out) = self.control.pop_front() {
            return Some(self.stamp_priority(out));
        }
        let out = self.next_data(ctx);
        if out.is_none() && !self.control.is_empty() {
            return self.control.pop_front().map(|o| self.stamp_priority(o));
        }
        out.map(|o| self.stamp_priority(o))
    }

    fn poll_control(&mut self, _ctx: &mut Ctx<'_>) -> Option<Outgoing> {
        self.control.pop_front().map(|o| self.stamp_priority(o))
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.timer
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn received(&self) -> Vec<(FlowKey, u64)> {
        self.flows
            .iter()
            .filter_map(|(k, f)| {
                let d = f.dest()?;
                let held: u64 = f
                    .blocks
                    .range(d.next_deliver..)
                    .map(|(_, b)| b.held_bytes())
                    .sum();
                Some((*k, d.delivered + held))
            })
            .collect()
    }

    fn stats(&self) -> TransportStats {
        let mut s = self.stats.clone();
        s.flows = self.flows.len() as u64;
        s.cache_bytes = self.cache_bytes;
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        for (name, d) in SEND_STATE_NAMES.iter().zip(self.state_clock.spent) {
            s.extra.insert(name, ms(d));
        }
        s.extra.insert(SEND_IDLE_NAME, ms(self.state_clock.idle));
        for (name, d) in WITHHOLD_NAMES.iter().zip(self.state_clock.withholding) {
            s.extra.insert(name, ms(d));
        }
        s
    }
}

#[cfg(test)]
mod tests;
