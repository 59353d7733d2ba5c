//! Per-hop block transfer, sending side (§3.1): the state of one block's transfer to the next
//! hop, starting transfers (a source's blocks, a relay's forwarding with spatial pipelining)
//! and the per-flow pump that sends due BACKs and BSYNs.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TransferState {
    /// A BSYN must be sent (when a route exists).
    NeedBsyn,
    /// BSYN sent; waiting for the BACK until `deadline`.
    AwaitBack { deadline: Instant },
    /// Sending the packets the next hop lacks.
    Sending,
}

/// The transfer of one block to the next hop.
#[derive(Debug, Clone)]
pub(super) struct Transfer {
    pub(super) next_hop: NodeId,
    pub(super) state: TransferState,
    /// Packets the next hop reported.
    pub(super) peer: Bitmap,
    /// Packets sent since the last BACK.
    pub(super) sent_round: Bitmap,
    /// Packets ever sent on this hop (retransmission accounting).
    pub(super) ever_sent: Bitmap,
    /// Per packet: position in this node's stream of data handed to the link (0 = never)
    /// and when, of its latest transmission (loss inference, `queue_aware`).
    pub(super) sent_seq: Vec<u64>,
    pub(super) sent_at: Vec<Instant>,
    /// Packets handed to the link more than once on this hop: their arrival does not tell
    /// which copy arrived, so it gives no delay sample (Karn's rule).
    pub(super) resent: Bitmap,
    /// Per packet: position in the node's stream of its oldest copy not known lost. Whichever
    /// copy arrived was handed to the link at or after it, so an arrival proves that every
    /// packet handed over before this position has left the queue, even for a resent packet.
    pub(super) live_seq: Vec<u64>,
    /// Packets whose every copy so far is known lost: a BACK left them out although a
    /// packet handed to the link after their latest copy had arrived (FIFO). Their next
    /// copy is the only one that can arrive, so its arrival is evidence again.
    pub(super) lost_known: Bitmap,
    /// No BSYN before this: the last BACK showed no progress and the packets still in
    /// flight are probably queued here.
    pub(super) not_before: Option<Instant>,
    /// When the latest BSYN was sent.
    pub(super) bsyn_at: Instant,
    /// Data packets handed to the link since the latest BSYN (`round_per_next_hop`).
    pub(super) sent_since_bsyn: u32,
    /// When a BACK last showed new packets of this transfer (or it started).
    pub(super) progress_at: Instant,
    pub(super) vtx: bool,
    pub(super) ttl: u8,
    pub(super) micro: bool,
    /// Unanswered BSYNs in a row (backoff exponent).
    pub(super) attempts: u32,
    pub(super) cursor: u32,
    /// Number of the first BSYN of the current round (control_copies.rs): a BACK that
    /// heard none of the round's BSYNs (`echo` before it) answers an earlier round.
    pub(super) round_seq: u16,
    /// The round's BSYN (rounds_behind.rs): the round end it named, whether it was marked
    /// `BEHIND`, and this node's data handed to the link by then.
    pub(super) round_end: Option<u32>,
    pub(super) round_behind: bool,
    pub(super) round_handed: u64,
    /// Packets of the round were still queued here, ahead of the round's BSYN: only such a
    /// round shows whether the BSYN overtakes them.
    pub(super) round_queued: bool,
}

impl HopTransport {
    pub(super) fn new_transfer(
        next_hop: NodeId,
        geom: BlockGeom,
        vtx: bool,
        ttl: u8,
        micro: bool,
    ) -> Transfer {
        let n = geom.packets();
        Transfer {
            next_hop,
            state: TransferState::NeedBsyn,
            peer: Bitmap::new(n),
            sent_round: Bitmap::new(n),
            ever_sent: Bitmap::new(n),
            sent_seq: vec![0; n as usize],
            sent_at: vec![Instant::ZERO; n as usize],
            resent: Bitmap::new(n),
            live_seq: vec![0; n as usize],
            lost_known: Bitmap::new(n),
            not_before: None,
            bsyn_at: Instant::ZERO,
            sent_since_bsyn: 0,
            progress_at: Instant::ZERO,
            vtx,
            ttl,
            micro,
            attempts: 0,
            cursor: 0,
            round_seq: 0,
            round_end: None,
            round_behind: false,
            round_handed: 0,
            round_queued: false,
        }
    }

    pub(super) fn pump_flow(&mut self, ctx: &mut Ctx<'_>, key: FlowKey) {
        let now = ctx.now;
        self.deadlines.dirty.insert(key);
        let Some(f) = self.flows.get(&key) else {
            return;
        };
        let is_source = f.source().is_some();
        let is_dest = f.dest().is_some();
        if f.fin_probe.is_some() {
            self.probe_fin_back(ctx, key);
        }
        if is_source {
            self.form_block(ctx, key);
            self.source_vtx(ctx, key);
        } else if !is_dest {
            self.relay_forward(ctx, key);
        }
        // Deferred BACKs that are due.
        let due: Vec<(u32, NodeId)> = match self.flows.get(&key) {
            Some(f) => f
                .deferred
                .iter()
                .filter(|(n, d)| {
                    d.due <= now
                        || f.blocks
                            .get(n)
                            .is_some_and(|b| b.complete() || b.have.count() >= u32::from(d.expect))
                })
                .map(|(n, d)| (*n, d.to))
                .collect(),
            None => return,
        };
        for (n, up) in due {
            if let Some(f) = self.flows.get_mut(&key) {
                f.deferred.remove(&n);
            }
            self.send_back(key, n, up, now);
        }
        // BSYNs.
        let nums: Vec<u32> = match self.flows.get(&key) {
            Some(f) => f.outs.keys().copied().collect(),
            None => return,
        };
        for n in nums {
            self.drive_transfer(ctx, key, n);
        }
    }

    /// Relay: start forwarding blocks (pipelined once a txop's worth is held, §3.1).
    pub(super) fn relay_forward(&mut self, ctx: &mut Ctx<'_>, key: FlowKey) {
        let pipelining = self.cfg.pipelining;
        let txop = self.txop_packets;
        let micro_threshold = self.cfg.micro_block_threshold;
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        if f.finished {
            return;
        }
        let dst = f.dst;
        // Micro-blocks are forwarded whole, on BSYNs (§3.6); larger blocks as soon as a txop
        // of them is here (pipelining, §3.1).
        let ready = |b: &Block| {
            b.complete()
                || (pipelining
                    && b.have.count() >= txop
                    && b.geom.block_len as usize >= micro_threshold)
        };
        let normal_active = f.outs.values().any(|o| !o.vtx);
        let mut start: Vec<(u32, bool, u8)> = Vec::new();
        let mut normal_taken = normal_active;
        for (n, b) in &f.blocks {
            if f.outs.contains_key(n) || !ready(b) {
                continue;
            }
            if let Some(t) = b.vtx_fwd {
                start.push((*n, true, t));
            } else if !normal_taken && b.admitted_from.is_some() && !b.moved {
                start.push((*n, false, 0));
                normal_taken = true;
            }
        }
        if start.is_empty() {
            return;
        }
        let next_hop = ctx.routing.next_hop(dst).unwrap_or(dst);
        for (n, vtx, ttl) in start {
            let Some(b) = f.blocks.get_mut(&n) else {
                continue;
            };
            b.vtx_fwd = None;
            let micro = (b.geom.block_len as usize) < micro_threshold && b.complete();
            f.outs
                .insert(n, Self::new_transfer(next_hop, b.geom, vtx, ttl, micro));
        }
    }
}
