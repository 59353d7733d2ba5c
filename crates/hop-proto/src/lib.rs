//! Sans-IO core of the Hop node runtime.
//!
//! A [`Node`] takes the current [`Instant`] plus datagrams from neighbours or timeouts, and
//! yields datagrams to send ([`Node::poll_transmit`]), its next deadline
//! ([`Node::poll_timeout`]) and application events ([`Node::poll_event`]). It never touches a
//! socket or a clock. Transports are modules behind the [`Transport`] trait.

pub mod atp;
pub mod hop;
pub mod hxh;
pub mod node;
pub mod routing;
mod stream;
pub mod tcp;
#[cfg(test)]
mod test_support;
pub mod time;
pub mod transport;

use bytes::Bytes;
use serde::Serialize;
use thiserror::Error;

pub use hop_wire::{NodeId, TransportId};
pub use node::{Node, NodeEvent, NodeStats, Transmit};
pub use routing::{Routing, StaticRoutes};
pub use time::Instant;
pub use transport::{Class, Ctx, Outgoing, Received, Transport, TransportStats};

/// Identity of a flow: the node that opened it and an id unique at that node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct FlowKey {
    pub src: NodeId,
    pub id: u32,
}

impl std::fmt::Display for FlowKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{:08x}", self.src, self.id)
    }
}

/// Why a transfer was abandoned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum FailReason {
    /// No progress for the configured give-up time.
    Timeout,
    /// No route to the destination and none appeared in time.
    NoRoute,
    /// The application aborted it.
    Aborted,
    /// The destination refused the flow (e.g. it reached its flow limit).
    Refused,
    /// Its lifetime ([`Node::set_lifetime`]) passed before every byte was acknowledged.
    Expired,
}

impl std::fmt::Display for FailReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FailReason::Timeout => "no progress for the give-up time (`give_up_after`)",
            FailReason::NoRoute => "no route to the destination",
            FailReason::Aborted => "aborted by the application",
            FailReason::Refused => "refused by the destination",
            FailReason::Expired => "its lifetime passed before the destination had every byte",
        })
    }
}

/// What a transport tells the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Destination: a new flow arrived.
    FlowOpened { flow: FlowKey },
    /// Destination: the next in-order bytes of a flow, starting at `offset`.
    Delivered {
        flow: FlowKey,
        offset: u64,
        data: Bytes,
    },
    /// Destination: the sender finished and every byte has been delivered.
    FlowFinished { flow: FlowKey, bytes: u64 },
    /// Destination: the flow ended before it finished (its source aborted it, or nothing
    /// came for the transport's idle or give-up time); its state is released and nothing
    /// more of it is delivered. What was delivered of it is the application's to discard.
    FlowAbandoned { flow: FlowKey },
    /// Source: the destination acknowledged end to end the flow's first `bytes` bytes (the
    /// in-order prefix it has delivered); reported as it grows, by transports that know it
    /// (Hop: per block).
    Acknowledged { flow: FlowKey, bytes: u64 },
    /// Source: every byte was acknowledged end to end; the flow's state is released.
    SendComplete { flow: FlowKey, bytes: u64 },
    /// Source: the transfer was abandoned; the flow's state is released.
    SendFailed { flow: FlowKey, reason: FailReason },
    /// Source: the flow accepts more application bytes.
    Writable { flow: FlowKey },
    /// A next hop this node waits for has answered nothing for the transport's silence
    /// time; it is probed now (Hop: `neighbour_silence`). `flows`: local flows routed to it.
    NeighbourSilent {
        neighbour: NodeId,
        flows: Vec<FlowKey>,
    },
    /// A silent next hop was heard again.
    NeighbourReturned { neighbour: NodeId },
    /// The destination of a local flow holds its next block but cannot deliver it: its
    /// application store is full (Hop). The flow waits; nothing is lost.
    DestinationFull { flow: FlowKey },
}

/// Errors from the application-facing calls.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AppError {
    #[error("transport {0:?} is not hosted on this node")]
    NoSuchTransport(TransportId),
    #[error("unknown flow {0}")]
    UnknownFlow(FlowKey),
    #[error("flow {0} is already finished")]
    FlowFinished(FlowKey),
    #[error("a node cannot open a flow to itself")]
    SelfDestination,
    #[error("too many flows (limit {0})")]
    TooManyFlows(usize),
    #[error("too many flows waiting to start (limit {0}, `max_waiting_flows`)")]
    TooManyWaitingFlows(usize),
    #[error("transport {0:?} cannot do that")]
    Unsupported(TransportId),
}

/// Errors from [`Node::handle_datagram`]; the datagram is dropped and counted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RecvError {
    #[error("malformed datagram: {0}")]
    Wire(#[from] hop_wire::Error),
    #[error("datagram for transport {0:?}, which this node does not host")]
    TransportNotHosted(TransportId),
}
