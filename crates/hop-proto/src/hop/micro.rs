//! Micro-blocks (§3.6): a block smaller than `micro_block_threshold` rides on its BSYNs, one
//! packet per BSYN, in the control class. Receiving them is part of answering a BSYN
//! (receiver.rs); relays forward a micro-block only once it is complete (transfer.rs).

use super::*;

/// The BSYNs of a micro-block's round and the packets among them sent before on this hop.
/// Every packet the next hop lacks rides on its own BSYN; the last one asks for the BACK. A
/// repeat (no BACK since the last send) carries only the last of them, which asks (§3.6
/// piggybacks the micro-block on the initial BSYN): the packets of the last send may only be
/// queued behind a busy link, and sending all of them again on every timeout feeds a collapse
/// at a lossy hub (docs/design/hop.md#36-micro-blocks); the BACK then says which are missing.
pub(super) fn micro_bsyns(
    header: HopHeader,
    x: &mut Transfer,
    b: &Block,
    repeat: bool,
) -> (Vec<Option<Vec<u8>>>, u64) {
    let mut missing: Vec<u32> = (0..b.geom.packets())
        .filter(|i| !x.peer.get(*i) && b.have.get(*i))
        .collect();
    if repeat && missing.len() > 1 {
        missing.drain(..missing.len() - 1);
    }
    let ask = HopHeader {
        flags: header.flags | FLAG_ASK,
        ..header
    };
    if missing.is_empty() || !b.complete() {
        let only = emit(&HopMessage {
            header: ask,
            body: HopBody::Bsyn {
                offset: b.offset,
                geom: b.geom,
                packet_num: 0,
                expect: 0,
                ctl: ControlSeq::default(),
                payload: &[],
            },
        });
        return (vec![only], 0);
    }
    let mut msgs = Vec::with_capacity(missing.len());
    let mut resent = 0;
    for (i, &p) in missing.iter().enumerate() {
        let last = i + 1 == missing.len();
        msgs.push(emit(&HopMessage {
            header: if last { ask } else { header },
            body: HopBody::Bsyn {
                offset: b.offset,
                geom: b.geom,
                packet_num: p as u16,
                expect: 0,
                ctl: ControlSeq::default(),
                payload: b.packet(p),
            },
        }));
        if !x.ever_sent.set(p) {
            resent += 1;
        }
    }
    (msgs, resent)
}

/// Micro-blocks in progress at once to one next hop, with `round_per_next_hop`.
pub(super) const MICRO_TURNS_PER_NEXT_HOP: usize = 2;

/// The micro-block transfers this node has started to each next hop, and the flows waiting
/// to start one.
#[derive(Debug, Default)]
pub(super) struct MicroTurns {
    started: BTreeMap<NodeId, Vec<(FlowKey, u32)>>,
    waiting: BTreeMap<NodeId, VecDeque<FlowKey>>,
}

impl HopTransport {
    /// Whether micro-block transfer (`key`, `n`) may send its BSYNs to `next_hop` now. With
    /// `round_per_next_hop`, at most [`MICRO_TURNS_PER_NEXT_HOP`] micro-blocks of this node
    /// are in progress to one next hop (sent and not yet taken whole); the others wait here,
    /// first come first served. Ack withholding does not hold micro-blocks back (§3.5: a
    /// receiver answers them at once), so without turns a node with many small flows to one
    /// next hop (a burst of small files) sends all of their BSYNs together: they collide
    /// at the next hop with what its other neighbours send, and are repeated. Two keep the
    /// link busy while one BACK is on its way. Transfers that are not micro-blocks, or
    /// already started, always may.
    pub(super) fn micro_turn(&mut self, key: FlowKey, n: u32, next_hop: NodeId) -> bool {
        if !self.cfg.round_per_next_hop {
            return true;
        }
        let starting = self
            .flows
            .get(&key)
            .and_then(|f| f.outs.get(&n))
            .is_some_and(|x| x.micro && x.attempts == 0);
        if !starting {
            return true;
        }
        let flows = &self.flows;
        let started = self.micro_turns.started.entry(next_hop).or_default();
        // Transfers that ended (taken whole, dropped, rerouted) leave their turn.
        started.retain(|(k, m)| {
            flows
                .get(k)
                .and_then(|f| f.outs.get(m))
                .is_some_and(|x| x.micro && x.attempts > 0 && x.next_hop == next_hop)
        });
        if started.len() < MICRO_TURNS_PER_NEXT_HOP {
            started.push((key, n));
            return true;
        }
        let waiting = self.micro_turns.waiting.entry(next_hop).or_default();
        if !waiting.contains(&key) {
            waiting.push_back(key);
        }
        bump(&mut self.stats.extra, "micro_turns_waited");
        false
    }

    /// A micro-block to `next_hop` ended: the flows waiting for a turn there try again.
    pub(super) fn micro_turn_ended(&mut self, ctx: &mut Ctx<'_>, next_hop: NodeId) {
        let Some(waiting) = self.micro_turns.waiting.get_mut(&next_hop) else {
            return;
        };
        let keys: Vec<FlowKey> = waiting.drain(..).collect();
        for k in keys {
            self.pump_flow(ctx, k);
        }
    }
}
