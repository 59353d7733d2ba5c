//! A node: identity, routing, the envelope, and the transports it hosts.

use std::collections::HashMap;

use bytes::Bytes;
use hop_wire::{Envelope, EnvelopeRepr, NodeId, TransportId, BROADCAST_NODE};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::time::Instant;
use crate::transport::{Class, Ctx, Outgoing, Received, Transport, TransportStats};
use crate::{AppError, Event, FlowKey, RecvError, Routing};

/// A datagram the runtime must send to a neighbour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The neighbour that must process it (also written in the envelope).
    pub next_hop: NodeId,
    /// How to send it; see [`Class`].
    pub class: Class,
    /// The encoded envelope.
    pub payload: Vec<u8>,
    /// The transport that produced it.
    pub transport: TransportId,
}

/// An application event together with the transport it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    pub transport: TransportId,
    pub event: Event,
}

/// Node-level counters.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NodeStats {
    pub datagrams_received: u64,
    pub datagrams_overheard: u64,
    pub datagrams_rejected: u64,
    pub datagrams_sent: u64,
    pub transports: Vec<(TransportId, TransportStats)>,
}

/// One node of the mesh hosting several transports behind one envelope.
pub struct Node {
    id: NodeId,
    routing: Box<dyn Routing>,
    rng: SmallRng,
    transports: Vec<Box<dyn Transport>>,
    /// Local flows -> index into `transports`.
    local_flows: HashMap<FlowKey, usize>,
    next_flow_id: u32,
    /// Round-robin position for `poll_transmit` and `poll_event`.
    tx_turn: usize,
    ev_turn: usize,
    received: u64,
    overheard: u64,
    rejected: u64,
    sent: u64,
    /// See [`Node::set_sealed_link`].
    sealed_link: bool,
}

impl Node {
    /// A node with no transports yet. `seed` drives all randomness of the node (flow id
    /// allocation and whatever transports draw), so a simulation is reproducible.
    pub fn new(id: NodeId, routing: Box<dyn Routing>, seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed ^ u64::from(id).wrapping_mul(0x9E37_79B9));
        // Start flow ids at a random point so a restarted node does not reuse the ids of
        // flows that other nodes still hold state for.
        let next_flow_id = rng.gen::<u32>() | 1;
        Node {
            id,
            routing,
            rng,
            transports: Vec::new(),
            local_flows: HashMap::new(),
            next_flow_id,
            tx_turn: 0,
            ev_turn: 0,
            received: 0,
            overheard: 0,
            rejected: 0,
            sent: 0,
            sealed_link: false,
        }
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The runtime seals every datagram the node emits and authenticates every one it hands
    /// the node (an AEAD tag over the envelope, hopd's `[security]`): the node then leaves
    /// the envelope's crc32c zero on what it emits, for the sealing step to compute, and
    /// does not compare it on what it receives, whose bytes the tag has covered. The
    /// checksum is then computed once per datagram on each side instead of twice.
    pub fn set_sealed_link(&mut self, on: bool) {
        self.sealed_link = on;
    }

    /// Host a transport. A second transport with the same id replaces the first.
    pub fn add_transport(&mut self, t: Box<dyn Transport>) {
        if let Some(i) = self.transports.iter().position(|x| x.id() == t.id()) {
            self.transports[i] = t;
        } else {
            self.transports.push(t);
        }
    }

    pub fn has_transport(&self, id: TransportId) -> bool {
        self.transports.iter().any(|t| t.id() == id)
    }

    pub fn set_routing(&mut self, routing: Box<dyn Routing>) {
        self.routing = routing;
    }

    pub fn routing(&self) -> &dyn Routing {
        self.routing.as_ref()
    }

    fn index_of(&self, id: TransportId) -> Result<usize, AppError> {
        self.transports
            .iter()
            .position(|t| t.id() == id)
            .ok_or(AppError::NoSuchTransport(id))
    }

    fn with_ctx<R>(
        &mut self,
        now: Instant,
        idx: usize,
        f: impl FnOnce(&mut dyn Transport, &mut Ctx<'_>) -> R,
    ) -> R {
        let mut ctx = Ctx {
            now,
            local: self.id,
            routing: self.routing.as_ref(),
            rng: &mut self.rng,
        };
        f(self.transports[idx].as_mut(), &mut ctx)
    }

    /// Open a flow to `dst` over `transport`.
    pub fn open(
        &mut self,
        now: Instant,
        transport: TransportId,
        dst: NodeId,
    ) -> Result<FlowKey, AppError> {
        let idx = self.index_of(transport)?;
        if dst == self.id {
            return Err(AppError::SelfDestination);
        }
        let key = FlowKey {
            src: self.id,
            id: self.next_flow_id,
        };
        self.next_flow_id = self.next_flow_id.wrapping_add(1);
        self.with_ctx(now, idx, |t, ctx| t.open(ctx, key, dst))?;
        self.local_flows.insert(key, idx);
        Ok(key)
    }

    fn flow_index(&self, flow: FlowKey) -> Result<usize, AppError> {
        self.local_flows
            .get(&flow)
            .copied()
            .ok_or(AppError::UnknownFlow(flow))
    }

    /// Offer application bytes on a local flow; returns how many were accepted.
    pub fn send(&mut self, now: Instant, flow: FlowKey, data: Bytes) -> Result<usize, AppError> {
        let idx = self.flow_index(flow)?;
        self.with_ctx(now, idx, |t, ctx| t.send(ctx, flow, data))
    }

    /// Declare that no more bytes follow on a local flow.
    pub fn finish(&mut self, now: Instant, flow: FlowKey) -> Result<(), AppError> {
        let idx = self.flow_index(flow)?;
        self.with_ctx(now, idx, |t, ctx| t.finish(ctx, flow))
    }

    /// Give a local flow a lifetime: it is tried until `until`, then fails with
    /// [`crate::FailReason::Expired`] (with Hop; other transports keep their give-up rule).
    pub fn set_lifetime(
        &mut self,
        now: Instant,
        flow: FlowKey,
        until: Instant,
    ) -> Result<(), AppError> {
        let idx = self.flow_index(flow)?;
        self.with_ctx(now, idx, |t, ctx| t.set_lifetime(ctx, flow, until))
    }

    /// What the transports know of each neighbour they send to (one report per neighbour;
    /// of several transports', the first that reports it).
    pub fn neighbour_reports(&self) -> Vec<crate::transport::NeighbourReport> {
        let mut all: Vec<crate::transport::NeighbourReport> = Vec::new();
        for t in &self.transports {
            for r in t.neighbour_reports() {
                if !all.iter().any(|a| a.id == r.id) {
                    all.push(r);
                }
            }
        }
        all.sort_by_key(|r| r.id);
        all
    }

    /// Give a local flow a class (see [`Transport::set_priority`]).
    pub fn set_priority(
        &mut self,
        now: Instant,
        flow: FlowKey,
        priority: u8,
    ) -> Result<(), AppError> {
        let idx = self.flow_index(flow)?;
        self.with_ctx(now, idx, |t, ctx| t.set_priority(ctx, flow, priority))
    }

    /// Abandon a local flow.
    pub fn abort(&mut self, now: Instant, flow: FlowKey) -> Result<(), AppError> {
        let idx = self.flow_index(flow)?;
        self.local_flows.remove(&flow);
        self.with_ctx(now, idx, |t, ctx| t.abort(ctx, flow))
    }

    /// Abort along its path a flow this node sent to `dst` before a restart (see
    /// [`Transport::abort_earlier`]).
    pub fn abort_earlier(
        &mut self,
        now: Instant,
        transport: TransportId,
        flow: FlowKey,
        dst: NodeId,
    ) -> Result<(), AppError> {
        let idx = self.index_of(transport)?;
        if flow.src != self.id {
            return Err(AppError::UnknownFlow(flow));
        }
        if self.local_flows.contains_key(&flow) {
            return self.abort(now, flow);
        }
        self.with_ctx(now, idx, |t, ctx| t.abort_earlier(ctx, flow, dst))
    }

    /// A datagram arrived from the medium (addressed to us, broadcast, or overheard). The
    /// node copies what it keeps.
    pub fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) -> Result<(), RecvError> {
        self.receive(now, datagram, None)
    }

    /// As [`Node::handle_datagram`], for a runtime whose datagrams are shared buffers (e.g.
    /// a simulator, where every neighbour in range receives the same frame): the node keeps
    /// references to the data it holds instead of copies, so a frame that several nodes
    /// cache is in memory once.
    pub fn handle_shared_datagram(
        &mut self,
        now: Instant,
        datagram: &Bytes,
    ) -> Result<(), RecvError> {
        self.receive(now, datagram, Some(datagram))
    }

    fn receive(
        &mut self,
        now: Instant,
        datagram: &[u8],
        shared: Option<&Bytes>,
    ) -> Result<(), RecvError> {
        let parsed = if self.sealed_link {
            Envelope::parse_authenticated(datagram)
        } else {
            Envelope::parse(datagram)
        };
        let env = match parsed {
            Ok(env) => env,
            Err(e) => {
                self.rejected += 1;
                return Err(RecvError::Wire(e));
            }
        };
        if env.repr.link_src == self.id {
            // Our own transmission echoed back (e.g. broadcast loopback): not news.
            return Ok(());
        }
        let overheard = env.repr.link_dst != self.id && env.repr.link_dst != BROADCAST_NODE;
        let idx = match self.index_of(env.repr.transport) {
            Ok(i) => i,
            Err(_) => {
                self.rejected += 1;
                return Err(RecvError::TransportNotHosted(env.repr.transport));
            }
        };
        if overheard {
            self.overheard += 1;
        } else {
            self.received += 1;
        }
        let rx = Received {
            link_src: env.repr.link_src,
            link_dst: env.repr.link_dst,
            overheard,
            body: env.body,
            shared,
        };
        let res = self.with_ctx(now, idx, |t, ctx| t.handle(ctx, rx));
        if let Err(e) = res {
            self.rejected += 1;
            return Err(RecvError::Wire(e));
        }
        Ok(())
    }

    /// The deadline from [`Node::poll_timeout`] has passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        for idx in 0..self.transports.len() {
            let due = self.transports[idx]
                .poll_timeout()
                .is_some_and(|d| d <= now);
            if due {
                self.with_ctx(now, idx, |t, ctx| t.handle_timeout(ctx));
            }
        }
    }

    /// A custody write that `transport`'s store deferred has finished (`ok`: durable).
    pub fn custody_persisted(
        &mut self,
        now: Instant,
        transport: TransportId,
        flow: FlowKey,
        block: u32,
        ok: bool,
    ) -> Result<(), AppError> {
        let idx = self.index_of(transport)?;
        self.with_ctx(now, idx, |t, ctx| t.custody_persisted(ctx, flow, block, ok));
        Ok(())
    }

    /// A delivery that `transport`'s store deferred is durable (`ok`: its end-to-end BACK
    /// may go), or its write failed and is being retried (the source is told the
    /// destination cannot store it).
    pub fn delivery_persisted(
        &mut self,
        now: Instant,
        transport: TransportId,
        flow: FlowKey,
        block: u32,
        ok: bool,
    ) -> Result<(), AppError> {
        let idx = self.index_of(transport)?;
        self.with_ctx(now, idx, |t, ctx| {
            t.delivery_persisted(ctx, flow, block, ok)
        });
        Ok(())
    }

    /// Next datagram to send. Transports are served round robin.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        self.poll_with(now, |t, ctx| t.poll_transmit(ctx))
    }

    /// Next control datagram already queued, never data (see [`Transport::poll_control`]).
    /// For a runtime whose link has no room for data. Transports are served round robin.
    pub fn poll_control(&mut self, now: Instant) -> Option<Transmit> {
        self.poll_with(now, |t, ctx| t.poll_control(ctx))
    }

    fn poll_with(
        &mut self,
        now: Instant,
        mut poll: impl FnMut(&mut dyn Transport, &mut Ctx<'_>) -> Option<Outgoing>,
    ) -> Option<Transmit> {
        let n = self.transports.len();
        for k in 0..n {
            let idx = (self.tx_turn + k) % n;
            if let Some(out) = self.with_ctx(now, idx, |t, ctx| poll(t, ctx)) {
                self.tx_turn = (idx + 1) % n;
                let repr = EnvelopeRepr {
                    transport: self.transports[idx].id(),
                    flags: 0,
                    link_src: self.id,
                    link_dst: out.next_hop,
                };
                let (payload, emitted) = if out.head == hop_wire::envelope::HEADER_LEN {
                    // Built in a framed buffer: the header goes in front, the body stays.
                    let mut payload = out.body;
                    let emitted = repr.emit_around(&mut payload, !self.sealed_link);
                    (payload, emitted)
                } else {
                    let body = out.message();
                    let mut payload = Vec::with_capacity(
                        EnvelopeRepr::encoded_len(body.len()) + crate::transport::TAILROOM,
                    );
                    let emitted = if self.sealed_link {
                        repr.emit_for_sealing(body, &mut payload)
                    } else {
                        repr.emit(body, &mut payload)
                    };
                    (payload, emitted)
                };
                if emitted.is_err() {
                    // A transport produced a body too large for the envelope: a bug in the
                    // transport, counted and dropped rather than sent truncated.
                    self.rejected += 1;
                    continue;
                }
                self.sent += 1;
                return Some(Transmit {
                    next_hop: out.next_hop,
                    class: out.class,
                    payload,
                    transport: repr.transport,
                });
            }
        }
        None
    }

    /// Earliest deadline of any transport.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.transports
            .iter()
            .filter_map(|t| t.poll_timeout())
            .min()
    }

    /// Next application event, transports served round robin.
    pub fn poll_event(&mut self) -> Option<NodeEvent> {
        let n = self.transports.len();
        for k in 0..n {
            let idx = (self.ev_turn + k) % n;
            if let Some(event) = self.transports[idx].poll_event() {
                self.ev_turn = (idx + 1) % n;
                if let Event::SendComplete { flow, .. } | Event::SendFailed { flow, .. } = &event {
                    self.local_flows.remove(flow);
                }
                return Some(NodeEvent {
                    transport: self.transports[idx].id(),
                    event,
                });
            }
        }
        None
    }

    /// Incoming flows with the unique payload bytes received so far, over all transports
    /// (see [`Transport::received`]).
    pub fn received(&self) -> Vec<(FlowKey, u64)> {
        self.transports.iter().flat_map(|t| t.received()).collect()
    }

    pub fn stats(&self) -> NodeStats {
        NodeStats {
            datagrams_received: self.received,
            datagrams_overheard: self.overheard,
            datagrams_rejected: self.rejected,
            datagrams_sent: self.sent,
            transports: self
                .transports
                .iter()
                .map(|t| (t.id(), t.stats()))
                .collect(),
        }
    }
}
