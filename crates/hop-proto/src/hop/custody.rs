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
//!
//! The transport's side is here too: taking custody before the completing BACK, the store's
//! late answer, and putting restored blocks and destination progress back after a restart.

use bytes::Bytes;
use thiserror::Error;

use super::*;
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
    /// [`Persist::Later`]: the store took the block and writes it off the protocol path; the
    /// runtime reports the write through
    /// [`Transport::delivery_persisted`](crate::transport::Transport::delivery_persisted),
    /// and the end-to-end BACK (and the flow's end, [`Event::FlowFinished`](crate::Event))
    /// wait for it. A store that answers `Later` keeps the bytes until they are durable.
    fn deliver(&mut self, _delivery: &Delivery) -> Result<Persist, StoreFull> {
        Ok(Persist::Done)
    }
    /// Destination: the flow ended unfinished (its source aborted it, or it went idle);
    /// whatever [`deliver`](Self::deliver) kept of it can go.
    fn abandon(&mut self, _flow: FlowKey) {}
    /// Whether [`persist`](Self::persist) reads the block's bytes. A store that keeps none
    /// (custody in memory only) is handed a block without them, so a relay does not join a
    /// block's packets into one buffer for nothing.
    fn keeps_bytes(&self) -> bool {
        true
    }
}

/// A block the destination delivers in order, as handed to [`CustodyStore::deliver`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub flow: FlowKey,
    pub block_num: u32,
    /// Byte offset of `data` in the flow's stream.
    pub offset: u64,
    /// The block is the flow's last.
    pub fin: bool,
    /// The block's bytes, shared with the transport (no copy).
    pub data: Bytes,
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

    fn keeps_bytes(&self) -> bool {
        false
    }
}

// ----- the transport's side of custody -----

impl HopTransport {
    /// The store finished writing a block it took with [`Persist::Later`]: durable (`ok`),
    /// the node now has custody and sends the completing BACK upstream; failed, the BACK
    /// stays withheld (the upstream's next BSYN asks again) and the store is told to forget
    /// the block. A block that has meanwhile moved downstream, or whose flow is gone, is
    /// released at once (its BACK still goes upstream: the block reached the next hop).
    pub(super) fn on_custody_persisted(
        &mut self,
        ctx: &mut Ctx<'_>,
        flow: FlowKey,
        block_num: u32,
        ok: bool,
    ) {
        let now = ctx.now;
        let Some(b) = self
            .flows
            .get_mut(&flow)
            .and_then(|f| f.blocks.get_mut(&block_num))
        else {
            self.store.release(flow, block_num);
            return;
        };
        let Some(to) = b.persisting.take() else {
            return;
        };
        if !ok {
            self.store.release(flow, block_num);
            bump(&mut self.stats.extra, "custody_write_failed");
            return;
        }
        if b.moved {
            self.store.release(flow, block_num);
        } else {
            b.custody = true;
            b.custody_since = now;
        }
        self.note_buffered(flow);
        self.send_back(flow, block_num, to, now);
        self.pump_flow(ctx, flow);
    }

    /// Put blocks read back from a [`CustodyStore`] after a restart into custody again; they
    /// are forwarded as soon as the next hop answers. Blocks of flows this node is the source
    /// or destination of are ignored (the application owns those bytes).
    pub fn restore(&mut self, now: Instant, local: NodeId, blocks: Vec<StoredBlock>) {
        for sb in blocks {
            if sb.flow.src == local || sb.dst == local {
                continue;
            }
            if !self.flows.contains_key(&sb.flow) && self.flows.len() >= self.cfg.max_flows {
                continue;
            }
            let Ok(len) = u32::try_from(sb.data.len()) else {
                continue;
            };
            let geom = BlockGeom {
                block_len: len,
                packet_size: self.packet_size,
            };
            if geom.validate().is_err() {
                continue;
            }
            let flow = self
                .flows
                .entry(sb.flow)
                .or_insert_with(|| Flow::new(sb.dst, now));
            if flow.blocks.contains_key(&sb.block_num) {
                continue;
            }
            let mut b = Block::new(sb.offset, geom, sb.fin, now);
            b.data = BlockData::Shared(sb.data.clone());
            b.have.fill();
            b.custody = true;
            b.admitted_from = Some(sb.flow.src);
            flow.blocks.insert(sb.block_num, b);
            self.cache_bytes += u64::from(len);
        }
        self.note_cache();
        self.refresh_timer(now);
    }

    /// Resume flows this node is the destination of from progress persisted before a
    /// restart: blocks below `next_block` are acknowledged end to end again, not delivered
    /// again, and the source's retransmissions fill in the rest.
    pub fn restore_destination(&mut self, now: Instant, local: NodeId, flows: Vec<DestProgress>) {
        for p in flows {
            if self.flows.contains_key(&p.flow) || self.flows.len() >= self.cfg.max_flows {
                continue;
            }
            let mut f = Flow::new(local, now);
            f.role = Role::Destination(DestState {
                next_deliver: p.next_block,
                delivered: p.bytes,
                finished: p.finished,
                blocked: false,
                writing: Default::default(),
                write_failing: false,
            });
            f.finished = p.finished;
            self.flows.insert(p.flow, f);
        }
        self.stats.flows = self.flows.len() as u64;
        self.refresh_timer(now);
    }

    /// Send the BACK for a complete block, taking custody first (persisting it).
    pub(super) fn send_back_checked(
        &mut self,
        ctx: &mut Ctx<'_>,
        key: FlowKey,
        n: u32,
        to: NodeId,
    ) {
        let now = ctx.now;
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let dst = f.dst;
        let is_relay = f.is_relay();
        if let Some(b) = f.blocks.get_mut(&n) {
            if b.persisting.is_some() {
                // Still being written: the BACK goes when the store reports it durable.
                b.persisting = Some(to);
                return;
            }
            if is_relay && !b.custody && !b.moved && b.admitted_from.is_some() {
                let sb = StoredBlock {
                    flow: key,
                    dst,
                    block_num: n,
                    offset: b.offset,
                    fin: b.fin,
                    data: if self.store.keeps_bytes() {
                        b.data.share(&b.geom)
                    } else {
                        Bytes::new()
                    },
                };
                match self.store.persist(&sb) {
                    Err(StoreFull) => {
                        bump(&mut self.stats.extra, "custody_store_full");
                        return;
                    }
                    Ok(Persist::Later) => {
                        b.persisting = Some(to);
                        bump(&mut self.stats.extra, "custody_writes_deferred");
                        return;
                    }
                    Ok(Persist::Done) => {}
                }
                b.custody = true;
                b.custody_since = now;
            }
        }
        self.note_buffered(key);
        self.send_back(key, n, to, now);
    }
}
