//! Custody persistence hooks.
//!
//! A relay takes *custody* of a block when it sends the BACK that completes the block for its
//! upstream neighbour: from then on the upstream may forget it, so the block must survive until
//! it is acknowledged downstream (or end to end). [`CustodyStore::persist`] is called just
//! before that BACK; if it fails the BACK is withheld (the upstream keeps retrying, nothing is
//! lost). A store may also finish the write later ([`Persist::Later`]), off the protocol path:
//! the BACK then waits until the runtime reports the outcome through
//! [`Transport::custody_persisted`](crate::transport::Transport::custody_persisted), while the
//! block is already forwarded downstream. [`CustodyStore::release`] is called once the block has been acknowledged by the next
//! hop or end to end. After a restart the runtime reads its store and hands the blocks to
//! [`HopTransport::restore`](super::HopTransport::restore).
//!
//! The default store keeps nothing (custody lives only in memory).

use bytes::Bytes;
use thiserror::Error;

use crate::{FlowKey, NodeId};

/// A block in custody, as persisted and restored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBlock {
    pub flow: FlowKey,
    /// End-to-end destination of the flow.
    pub dst: NodeId,
    pub block_num: u32,
    /// Byte offset of the block in the flow's stream.
    pub offset: u64,
    /// The block is the flow's last.
    pub fin: bool,
    pub data: Bytes,
}

/// The store cannot take more custody.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("custody store full")]
pub struct StoreFull;

/// How a store took a block into custody.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persist {
    /// Durable now: the completing BACK may go.
    Done,
    /// Being written: the runtime reports the outcome through
    /// [`Transport::custody_persisted`](crate::transport::Transport::custody_persisted); the
    /// completing BACK waits for it.
    Later,
}

/// Durable storage for blocks in custody.
pub trait CustodyStore: Send {
    /// Persist `block` before its completing BACK is sent upstream.
    fn persist(&mut self, block: &StoredBlock) -> Result<Persist, StoreFull>;
    /// The block is no longer in this node's custody.
    fn release(&mut self, flow: FlowKey, block_num: u32);
    /// Destination: make a block delivered in order durable before the end-to-end BACK that
    /// covers it is sent. On error the block is not delivered now (the end-to-end BACK and
    /// new blocks of the flow are withheld) and delivery is retried on the next timer.
    fn deliver(&mut self, _delivery: &Delivery<'_>) -> Result<(), StoreFull> {
        Ok(())
    }
    /// Destination: the flow ended unfinished (its source aborted it, or it went idle);
    /// whatever [`deliver`](Self::deliver) kept of it can go.
    fn abandon(&mut self, _flow: FlowKey) {}
}

/// A block the destination delivers in order, as handed to [`CustodyStore::deliver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery<'a> {
    pub flow: FlowKey,
    pub block_num: u32,
    /// Byte offset of `data` in the flow's stream.
    pub offset: u64,
    /// The block is the flow's last.
    pub fin: bool,
    pub data: &'a [u8],
}

/// How far a destination has delivered a flow; persisted by the runtime after each
/// [`CustodyStore::deliver`] and handed back through
/// [`HopTransport::restore_destination`](super::HopTransport::restore_destination).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DestProgress {
    pub flow: FlowKey,
    /// Blocks delivered in order (what the end-to-end BACK acknowledges).
    pub next_block: u32,
    /// Bytes delivered.
    pub bytes: u64,
    /// The flow's last block was delivered.
    pub finished: bool,
}

/// The default: custody is held in memory only.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryOnly;

impl CustodyStore for MemoryOnly {
    fn persist(&mut self, _block: &StoredBlock) -> Result<Persist, StoreFull> {
        Ok(Persist::Done)
    }

    fn release(&mut self, _flow: FlowKey, _block_num: u32) {}
}
