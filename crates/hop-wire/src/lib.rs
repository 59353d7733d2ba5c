//! Wire formats of the Hop node runtime.
//!
//! Every datagram exchanged between neighbours is an [`envelope`]: a fixed header naming the
//! transport, the link-layer sender and intended receiver, then the transport's own message,
//! then an integrity check and an optional authentication trailer. The byte-by-byte layout is
//! documented in `docs/wire-format.md` at the repository root.
//!
//! Decoders never panic: any byte string yields either a parsed representation or an
//! [`Error`].

pub mod atp;
pub mod envelope;
pub mod error;
pub mod hop;
pub mod hxh;
pub mod tcp;

pub use envelope::{Envelope, EnvelopeRepr, TransportId, BROADCAST_NODE};
pub use error::Error;

/// Identifier of a node in the mesh. Node ids are assigned by configuration.
pub type NodeId = u32;
