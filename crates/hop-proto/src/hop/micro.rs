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
