//! The end-to-end BACK that finishes a flow, asked for again by the last hop (not in the
//! paper).
//!
//! A destination acknowledges each delivered block end to end (§3.2); the acknowledgements
//! are cumulative, so a lost one is covered by the next, except the last: after it the
//! flow sends nothing that could carry the news again, and only the source's virtual
//! retransmission timer notices the loss (§4.2: 60 s for a flow's first block, "handled
//! naturally by virtual retransmissions"). On a shared medium the destination loses that
//! BACK to a hidden sender as often as any other control frame, and most small transfers
//! are one block. The node before the destination knows when to expect it: the destination
//! took the flow's last block whole (its BACK). If no end-to-end BACK with FIN passes
//! within `fin_probe_after`, this node asks with a BSYN for that block, which the
//! destination answers, as any BSYN of a delivered block, with its BACK and the end-to-end
//! BACK (receiver.rs). Repeats double the wait, at most `fin_probes` of them; the source's
//! timer remains the last resort.
//!
//! The wait is not the destination's BSYN round trip: the end-to-end BACK leaves after the
//! hop BACK and may spend many link-layer retries behind a hidden sender's frames, and a
//! probe sent while it is still on its way brings two more frames from the destination into
//! the same collisions.
//!
//! Where control copies are on (links that do not retry control frames), every node that
//! handed the flow's last block whole to its next hop asks that next hop the same way, the
//! source included: the end-to-end BACK may be lost on any hop, and there each hop loses it
//! on its own. A relay that has passed it on answers a BSYN of the block with it again
//! (receiver.rs, `answer_for_destination`); one that has not has its own probe pending
//! toward its next hop. On 802.11 the MAC retries it on every hop and only the last hop
//! asks, as before.

use super::*;

/// A probe of the destination for the end-to-end BACK that finishes a flow.
#[derive(Debug, Clone, Copy)]
pub(super) struct FinProbe {
    block: u32,
    /// The next hop that took the block whole, which is asked.
    to: NodeId,
    offset: u64,
    geom: BlockGeom,
    /// When to ask (unless the end-to-end BACK passes first).
    at: Instant,
    /// BSYNs sent so far.
    sent: u8,
}

impl FinProbe {
    pub(super) fn due(&self) -> Instant {
        self.at
    }
}

impl HopTransport {
    /// Next hop `to` took block `n` of flow `key` whole: if it is the flow's last block and
    /// `to` its destination (or any next hop, where control copies are on), the end-to-end
    /// BACK with FIN is due from it.
    pub(super) fn expect_fin_back(&mut self, now: Instant, key: FlowKey, n: u32, to: NodeId) {
        if self.cfg.fin_probes == 0 {
            return;
        }
        let wait = self.fin_probe_wait(0);
        let every_hop = self.cfg.control_copies.on();
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        if (f.dst != to && !every_hop) || f.e2e_fin || f.dest().is_some() {
            return;
        }
        let Some(b) = f.blocks.get(&n).filter(|b| b.fin) else {
            return;
        };
        f.fin_probe = Some(FinProbe {
            block: n,
            to,
            offset: b.offset,
            geom: b.geom,
            at: now + wait,
            sent: 0,
        });
    }

    /// The wait before probe number `sent` + 1: `fin_probe_after`, doubled per probe already
    /// sent.
    fn fin_probe_wait(&self, sent: u8) -> Duration {
        let first = self.cfg.fin_probe_after;
        backoff(first, first.saturating_mul(1 << 6), u32::from(sent))
    }

    /// Ask the next hop that took flow `key`'s last block for the end-to-end BACK with FIN if
    /// it is due and has not passed.
    pub(super) fn probe_fin_back(&mut self, ctx: &mut Ctx<'_>, key: FlowKey) {
        let now = ctx.now;
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let Some(p) = f.fin_probe else {
            return;
        };
        let dst = f.dst;
        // The route moved away from the node that took the block: the new next hop never
        // took it, and the source's timer covers the flow.
        if f.e2e_fin || ctx.routing.next_hop(dst) != Some(p.to) {
            f.fin_probe = None;
            return;
        }
        if p.at > now {
            return;
        }
        let sent = p.sent + 1;
        let flags = FLAG_FIN;
        f.fin_probe = None;
        if sent < self.cfg.fin_probes {
            let at = now + self.fin_probe_wait(sent);
            if let Some(f) = self.flows.get_mut(&key) {
                f.fin_probe = Some(FinProbe { at, sent, ..p });
            }
        }
        let msg = HopMessage {
            header: Self::header(key, dst, p.block, flags, 0),
            body: HopBody::Bsyn {
                ctl: ControlSeq::default(),
                offset: p.offset,
                geom: p.geom,
                packet_num: 0,
                expect: 0,
                payload: &[],
            },
        };
        self.extra("fin_probes");
        self.push_ctrl(p.to, &msg);
    }
}
