//! The data scheduler (§3.6 txop round robin): which transfer hands the next data packet to
//! the link, and rounds per next hop.

use super::*;

impl HopTransport {
    /// Per next hop, the transfer in the middle of a round: it has handed packets of the
    /// round to the link and has more to send (`round_per_next_hop`; empty when off).
    pub(super) fn mid_round(&self) -> BTreeMap<NodeId, (FlowKey, u32)> {
        let mut mid = BTreeMap::new();
        if !self.cfg.round_per_next_hop {
            return mid;
        }
        let none = Bitmap::new(0);
        for (k, f) in &self.flows {
            for (n, x) in &f.outs {
                if x.micro || x.state != TransferState::Sending {
                    continue;
                }
                let Some(b) = f.blocks.get(n) else { continue };
                let in_flight = x.sent_round.count_in_not(&x.peer, &none);
                // A relay's transfer waiting for a txop of new packets from upstream
                // (pipelining, §3.1) cannot send now: it does not hold up the others.
                let (_, can_send) = self.round_left(b, x);
                if in_flight > 0 && can_send {
                    mid.entry(x.next_hop).or_insert((*k, *n));
                }
            }
        }
        mid
    }

    /// Packets of block `b` that transfer `x` has not handed to the link in this round, and
    /// whether it may hand them over now: a relay forwarding a block still arriving waits
    /// for a txop of new packets (pipelining threshold, §3.1).
    pub(super) fn round_left(&self, b: &Block, x: &Transfer) -> (u32, bool) {
        let left = b.have.count_in_not(&x.peer, &x.sent_round);
        let can = left >= self.txop_packets || (left > 0 && (b.complete() || !self.cfg.pipelining));
        (left, can)
    }

    /// Whether transfer (`key`, `n`) has handed half the link window to the link since its
    /// last BSYN while another transfer to the same next hop has packets to send.
    pub(super) fn round_half_done(&self, key: FlowKey, n: u32) -> bool {
        let Some(x) = self.flows.get(&key).and_then(|f| f.outs.get(&n)) else {
            return false;
        };
        let half = self.window.window / 2;
        if half == 0 || (x.sent_since_bsyn as usize) < half {
            return false;
        }
        self.flows.iter().any(|(k, f)| {
            f.outs.iter().any(|(m, y)| {
                (*k, *m) != (key, n)
                    && y.next_hop == x.next_hop
                    && !y.micro
                    && y.state == TransferState::Sending
                    && f.blocks
                        .get(m)
                        .is_some_and(|b| b.have.count_in_not(&y.peer, &y.sent_round) > 0)
            })
        })
    }

    /// The rank of a flow's class (bulk < normal < expedited).
    pub(super) fn rank(&self, key: FlowKey) -> u8 {
        self.flows
            .get(&key)
            .map_or(1, |f| hop_wire::hop::priority_rank(f.priority))
    }

    /// Next data packet to send: round robin over flows, one txop per flow per turn (§3.6).
    /// Nothing while the link window is full. Flows of the highest class that has data to
    /// send go first; the others get the link only when none of those can use it (an
    /// extension: the paper's flows are all alike).
    pub(super) fn next_data(&mut self, ctx: &mut Ctx<'_>) -> Option<Outgoing> {
        if self.window_full() {
            return None;
        }
        let mid_round = self.mid_round();
        if let Some(out) = self.next_data_of_top_class(ctx, &mid_round) {
            return Some(out);
        }
        let mut tries = self.round_robin.len();
        while tries > 0 {
            let &key = self.round_robin.front()?;
            if let Some(out) = self.serve_front(ctx, key, &mid_round) {
                return Some(out);
            }
            tries -= 1;
        }
        None
    }

    /// With flows of several classes waiting to send: the next packet of a flow of the
    /// highest, in round-robin order among them. Flows of that class that cannot send now
    /// are passed over as in [`next_data`](Self::next_data). None when all flows are of one
    /// class (the round robin then serves them all alike) or none of the top class can send.
    fn next_data_of_top_class(
        &mut self,
        ctx: &mut Ctx<'_>,
        mid_round: &BTreeMap<NodeId, (FlowKey, u32)>,
    ) -> Option<Outgoing> {
        let ranks: Vec<u8> = self.round_robin.iter().map(|k| self.rank(*k)).collect();
        let top = *ranks.iter().max()?;
        if ranks.iter().all(|r| *r == top) {
            return None;
        }
        let tops: Vec<FlowKey> = self
            .round_robin
            .iter()
            .zip(&ranks)
            .filter(|(_, r)| **r == top)
            .map(|(k, _)| *k)
            .collect();
        for key in tops {
            // To the front, where the round robin's bookkeeping expects the flow it serves.
            let Some(at) = self.round_robin.iter().position(|k| *k == key) else {
                continue;
            };
            if at > 0 {
                self.txop_left = 0;
                self.round_robin.remove(at);
                self.round_robin.push_front(key);
            }
            if let Some(out) = self.serve_front(ctx, key, mid_round) {
                return Some(out);
            }
        }
        None
    }

    /// The next packet of `key`, the flow at the front of the round robin; a flow with none
    /// leaves the rotation, or goes to its end if it waits behind another block's round.
    fn serve_front(
        &mut self,
        ctx: &mut Ctx<'_>,
        key: FlowKey,
        mid_round: &BTreeMap<NodeId, (FlowKey, u32)>,
    ) -> Option<Outgoing> {
        let (produced, exhausted, behind_round) = self.take_packet(ctx.now, key, mid_round);
        if let Some(out) = produced {
            self.end_of_packet(ctx, key, exhausted);
            return Some(out);
        }
        self.txop_left = 0;
        self.round_robin.pop_front();
        if behind_round {
            // It keeps its place in the rotation: its round starts in turn.
            self.round_robin.push_back(key);
        }
        None
    }

    /// The next data packet of flow `key`, whether it was the last its transfer had for the
    /// round, and whether the flow's transfers wait behind another block's round to the same
    /// next hop (`round_per_next_hop`).
    fn take_packet(
        &mut self,
        now: Instant,
        key: FlowKey,
        mid_round: &BTreeMap<NodeId, (FlowKey, u32)>,
    ) -> (Option<Outgoing>, bool, bool) {
        let (txop, pipelining) = (self.txop_packets, self.cfg.pipelining);
        let mut behind_round = false;
        let Some(f) = self.flows.get_mut(&key) else {
            return (None, true, false);
        };
        let dst = f.dst;
        for (n, x) in f.outs.iter_mut() {
            if x.state != TransferState::Sending || x.micro {
                continue;
            }
            // Another block's round to this next hop goes first (`round_per_next_hop`).
            if mid_round.get(&x.next_hop).is_some_and(|o| *o != (key, *n)) {
                behind_round = true;
                continue;
            }
            let Some(b) = f.blocks.get(n) else { continue };
            let left = b.have.count_in_not(&x.peer, &x.sent_round);
            if left == 0 {
                continue;
            }
            // A turn starts only with a full txop of new packets, unless the block is
            // complete here (pipelining threshold, §3.1).
            if self.txop_left == 0 && left < txop && !b.complete() && pipelining {
                continue;
            }
            let Some(p) = b
                .have
                .next_in_not(&x.peer, &x.sent_round, x.cursor)
                .or_else(|| b.have.next_in_not(&x.peer, &x.sent_round, 0))
            else {
                continue;
            };
            x.cursor = p + 1;
            x.sent_round.set(p);
            self.in_flight.insert((key, *n));
            x.sent_since_bsyn = x.sent_since_bsyn.saturating_add(1);
            if x.stamp(p, self.link_queue.stamp(), now) {
                self.stats.data_retransmissions += 1;
                *self.retx_to.entry(x.next_hop).or_default() += 1;
            }
            let mut flags = if b.fin { FLAG_FIN } else { 0 };
            if x.vtx {
                flags |= FLAG_VTX;
            }
            let body = emit_framed(&HopMessage {
                header: Self::header(key, dst, *n, flags, 0),
                body: HopBody::Data {
                    offset: b.offset,
                    geom: b.geom,
                    packet_num: p as u16,
                    payload: b.packet(p),
                },
            });
            let out = body.map(|body| Outgoing {
                next_hop: x.next_hop,
                class: Class::Data,
                body,
                head: hop_wire::envelope::HEADER_LEN,
            });
            return (out, left <= 1, behind_round);
        }
        (None, true, behind_round)
    }

    /// Bookkeeping after a data packet of flow `key` was taken: the flow's txop turn (§3.6),
    /// and BSYNs for a round just finished or a link window just filled.
    fn end_of_packet(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, exhausted: bool) {
        bump(&mut self.stats.sent_by_type, "data");
        if self.txop_left == 0 {
            self.txop_left = self.txop_packets;
        }
        self.txop_left -= 1;
        if self.txop_left == 0 || exhausted {
            self.txop_left = 0;
            self.round_robin.pop_front();
            self.round_robin.push_back(key);
        }
        if exhausted {
            // The round is over: the next BSYN asks what is still missing.
            self.pump_flow(ctx, key);
            self.refresh_timer(ctx.now);
        }
        if self.window_full() {
            // The transfers with packets in the window ask for BACKs to open it.
            let keys: Vec<FlowKey> = self.flows.keys().copied().collect();
            for k in keys {
                self.pump_flow(ctx, k);
            }
            self.refresh_timer(ctx.now);
        }
    }
}
