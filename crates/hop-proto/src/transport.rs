//! The boundary between a node and a transport.
//!
//! A [`Node`](crate::Node) owns identity, routing and the datagram envelope; each transport
//! (Hop, HxH, ATP) is a module implementing [`Transport`] and sees only transport messages
//! (envelope bodies) plus a [`Ctx`] describing the node. Transports are sans-IO state machines:
//! they are driven by `handle`/`handle_timeout` and drained by `poll_transmit`/`poll_event`,
//! and they report their next deadline through `poll_timeout`.

use std::collections::BTreeMap;

use bytes::Bytes;
use hop_wire::{NodeId, TransportId};
use rand::rngs::SmallRng;
use serde::Serialize;

use crate::time::Instant;
use crate::{AppError, Event, FlowKey, Routing};

/// How the runtime must send a datagram (issue: each emitted datagram carries a class).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// Control: link-layer reliability (retries) and top priority (802.11e AC_VO, DSCP EF).
    Control,
    /// Data: no link-layer retries, background priority (AC_BK, DSCP CS1). May be sent as a
    /// link-layer broadcast so neighbours overhear it; the envelope still names the intended
    /// next hop.
    Data,
    /// Unicast with link-layer ACK and retries at best-effort priority (AC_BE, DSCP 0): how
    /// kernel TCP's segments and ACKs travel over 802.11. The baselines use it; it is never
    /// sent as a link-layer broadcast.
    Acked,
}

/// What a node knows about itself, lent to a transport for one call.
pub struct Ctx<'a> {
    pub now: Instant,
    pub local: NodeId,
    pub routing: &'a dyn Routing,
    /// Seeded randomness (deterministic under the simulator).
    pub rng: &'a mut SmallRng,
}

/// A transport message received from a neighbour.
#[derive(Debug, Clone, Copy)]
pub struct Received<'a> {
    /// The neighbour that transmitted it.
    pub link_src: NodeId,
    /// The neighbour it was meant for (may be [`hop_wire::BROADCAST_NODE`]).
    pub link_dst: NodeId,
    /// True when `link_dst` is another node: this node overheard it on a shared medium.
    pub overheard: bool,
    /// The envelope body.
    pub body: &'a [u8],
    /// The datagram `body` lies in, when the runtime hands datagrams over as shared buffers
    /// ([`crate::Node::handle_shared_datagram`]): a transport may keep slices of it instead
    /// of copies. None: `body` is borrowed for the call only.
    pub shared: Option<&'a Bytes>,
}

/// A transport message to send to a neighbour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub next_hop: NodeId,
    pub class: Class,
    /// The message, from `body[head..]`.
    pub body: Vec<u8>,
    /// Bytes left free at the front of `body`: 0, or [`hop_wire::envelope::HEADER_LEN`] for
    /// a message built in a buffer the node frames in place (see [`framed_body`]), which
    /// spares a copy of each data packet on its way out.
    pub head: usize,
}

impl Outgoing {
    /// The message's bytes.
    pub fn message(&self) -> &[u8] {
        self.body.get(self.head..).unwrap_or_default()
    }
}

/// Capacity left after a message for the envelope's crc and a runtime's authentication
/// trailer (hopd's is 24 bytes), so that sealing a datagram does not reallocate it.
pub const TAILROOM: usize = 32;

/// An empty buffer for a message of `len` bytes that the node will frame in place: the
/// envelope header's bytes are reserved at its front and [`TAILROOM`] after it. Used with
/// `head` = [`hop_wire::envelope::HEADER_LEN`].
pub fn framed_body(len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(hop_wire::envelope::HEADER_LEN + len + TAILROOM);
    v.resize(hop_wire::envelope::HEADER_LEN, 0);
    v
}

/// Counters every transport reports; the simulator and daemon publish them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TransportStats {
    /// Datagrams sent, by message type name (e.g. "bsyn", "back", "data").
    pub sent_by_type: BTreeMap<&'static str, u64>,
    /// Datagrams received (addressed to this node), by message type name.
    pub received_by_type: BTreeMap<&'static str, u64>,
    /// Data packets this node physically transmitted more than once on the same hop.
    pub data_retransmissions: u64,
    /// Bytes currently held in caches and buffers.
    pub cache_bytes: u64,
    /// Peak of `cache_bytes`.
    pub cache_bytes_peak: u64,
    /// Peak, over flows, of complete blocks (or packets, for packet transports) held for a flow
    /// and not yet moved downstream.
    pub buffered_blocks_peak: u64,
    /// Flows with state on this node now.
    pub flows: u64,
    /// Transport-specific counters.
    pub extra: BTreeMap<&'static str, u64>,
}

/// What a transport knows of one neighbour it sends to.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct NeighbourReport {
    pub id: NodeId,
    /// Smoothed time from a request to its answer on this hop (Hop: BSYN to BACK).
    pub rtt: Option<std::time::Duration>,
    /// Data packets sent to it more than once.
    pub data_retransmissions: u64,
    /// Hop: the smoothed share of its numbered control datagrams (BSYN, BACK) this node did
    /// not receive, and the share of this node's that it reports not receiving, 0 to 1.
    pub control_loss: Option<ControlLoss>,
}

/// Control datagrams lost on a hop, each way (Hop's numbered BSYNs and BACKs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ControlLoss {
    /// Of the neighbour's, not received here.
    pub from: f64,
    /// Of this node's, not received there (its latest report).
    pub to: f64,
}

/// A transport module hosted by a node.
pub trait Transport: Send {
    fn id(&self) -> TransportId;

    /// Start a flow from this node to `dst`; `key` was allocated by the node.
    fn open(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, dst: NodeId) -> Result<(), AppError>;

    /// Queue application bytes on a local flow. Returns how many were accepted (the rest must
    /// be offered again after an [`Event::Writable`]).
    fn send(&mut self, ctx: &mut Ctx<'_>, flow: FlowKey, data: Bytes) -> Result<usize, AppError>;

    /// No more bytes will be sent on `flow`; the transport finishes it after delivering all.
    fn finish(&mut self, ctx: &mut Ctx<'_>, flow: FlowKey) -> Result<(), AppError>;

    /// Abandon a local flow now, releasing its state.
    fn abort(&mut self, ctx: &mut Ctx<'_>, flow: FlowKey) -> Result<(), AppError>;

    /// The local flow may keep trying until `until` (its lifetime), however long it goes
    /// without progress, and fails with [`crate::FailReason::Expired`] then. A transport
    /// without lifetimes keeps its own give-up rule (the default); the runtime should abort
    /// the flow at `until` itself.
    fn set_lifetime(
        &mut self,
        _ctx: &mut Ctx<'_>,
        _flow: FlowKey,
        _until: Instant,
    ) -> Result<(), AppError> {
        Ok(())
    }

    /// Give a local flow a class (hop-wire `PRIORITY_NORMAL`, `_BULK`, `_EXPEDITED`): every
    /// node on its path sends the data of a higher class first. A transport without classes
    /// answers [`AppError::Unsupported`] (the default).
    fn set_priority(
        &mut self,
        _ctx: &mut Ctx<'_>,
        _flow: FlowKey,
        _priority: u8,
    ) -> Result<(), AppError> {
        Err(AppError::Unsupported(self.id()))
    }

    /// Per neighbour: round-trip time and retransmissions (none by default).
    fn neighbour_reports(&self) -> Vec<NeighbourReport> {
        Vec::new()
    }

    /// Abort along its path a flow this node sent in an earlier run (a restart lost its
    /// state): the nodes downstream free what they hold of it. A transport without aborts
    /// that reach the path answers [`AppError::Unsupported`] (the default).
    fn abort_earlier(
        &mut self,
        _ctx: &mut Ctx<'_>,
        _flow: FlowKey,
        _dst: NodeId,
    ) -> Result<(), AppError> {
        Err(AppError::Unsupported(self.id()))
    }

    /// A message from a neighbour. Malformed bodies are reported, never panicked on.
    fn handle(&mut self, ctx: &mut Ctx<'_>, rx: Received<'_>) -> Result<(), hop_wire::Error>;

    /// Called when the deadline from `poll_timeout` has passed.
    fn handle_timeout(&mut self, ctx: &mut Ctx<'_>);

    /// Next message to send, if any. The runtime calls this when its link queue has room, so a
    /// transport may defer work (e.g. a txop of data) until polled.
    fn poll_transmit(&mut self, ctx: &mut Ctx<'_>) -> Option<Outgoing>;

    /// Next control message ([`Class::Control`]) already queued, if any, and never data. The
    /// runtime calls this when its link queue has no room for data: acknowledgements and
    /// feedback then reach the link (where they may take a higher access category) without
    /// waiting for a data frame to leave first. A transport that returns `None` has its
    /// control sent by `poll_transmit` alone.
    fn poll_control(&mut self, _ctx: &mut Ctx<'_>) -> Option<Outgoing> {
        None
    }

    /// Earliest instant at which `handle_timeout` must be called.
    fn poll_timeout(&self) -> Option<Instant>;

    fn poll_event(&mut self) -> Option<Event>;

    fn stats(&self) -> TransportStats;

    /// A custody write the transport's store deferred has finished (`ok`: durable). Only Hop
    /// keeps custody (see [`crate::hop::Persist::Later`]); other transports ignore it.
    fn custody_persisted(&mut self, _ctx: &mut Ctx<'_>, _flow: FlowKey, _block: u32, _ok: bool) {}

    /// A delivery the transport's store deferred is durable (`ok`), or its write failed and
    /// is being retried (see [`crate::hop::CustodyStore::deliver`]); only Hop's destinations
    /// defer them.
    fn delivery_persisted(&mut self, _ctx: &mut Ctx<'_>, _flow: FlowKey, _block: u32, _ok: bool) {}

    /// Flows this node is the destination of and still holds state for, each with the unique
    /// payload bytes received so far: what was delivered plus the packets held towards
    /// blocks not yet delivered. This is the goodput the papers measure for a transfer cut
    /// off before it ends ("unique packets received"). Transports that deliver every packet
    /// as it arrives report nothing; their deliveries already say it.
    fn received(&self) -> Vec<(FlowKey, u64)> {
        Vec::new()
    }
}
