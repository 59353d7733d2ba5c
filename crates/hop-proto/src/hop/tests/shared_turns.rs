//! Blocks sized to shared turns (an extension, shared_turns.rs): receivers ask for smaller
//! blocks in their BACKs, relays pass the smallest ask upstream, sources cut to it.

use super::*;

fn shared_cfg() -> HopConfig {
    HopConfig {
        shared_turn_blocks: true,
        ..small_cfg()
    }
}

/// The `block_hint_kib` of each BACK to `to`.
fn hints_to(out: &[Outgoing], to: NodeId) -> Vec<u16> {
    out.iter()
        .filter(|o| o.next_hop == to)
        .filter_map(|o| match HopMessage::parse(o.message()).ok()?.body {
            HopBody::Back { block_hint_kib, .. } => Some(block_hint_kib),
            _ => None,
        })
        .collect()
}

#[test]
fn a_receiver_used_by_one_flow_asks_for_nothing_and_by_two_for_half_blocks() {
    let mut h = Harness::new(2, &[(1, 1), (4, 4)], HopTransport::new(shared_cfg()));
    h.recv(1, &bsyn_from(1, 1));
    assert_eq!(hints_to(&h.drain(), 1), vec![0]);
    // A second flow's BSYN (withheld: node 1 holds the turn), then node 1 asks again.
    h.recv(4, &bsyn_from(4, 2));
    assert!(hints_to(&h.drain(), 4).is_empty());
    h.recv(1, &bsyn_from(1, 1));
    let half = (DEFAULT_MAX_BLOCK_BYTES / 2 / 1024) as u16;
    assert_eq!(hints_to(&h.drain(), 1), vec![half]);
}

/// The ask goes out whatever the receiver's own switches: what to make of it is the
/// source's to decide (`shared_turn_blocks`, `ramp_while_shared`).
#[test]
fn with_its_switches_off_a_receiver_still_asks() {
    let mut h = Harness::new(2, &[(1, 1), (4, 4)], HopTransport::new(small_cfg()));
    h.recv(1, &bsyn_from(1, 1));
    assert_eq!(hints_to(&h.drain(), 1), vec![0], "one flow: no ask");
    h.recv(4, &bsyn_from(4, 2));
    h.recv(1, &bsyn_from(1, 1));
    let half = (small_cfg().block_bytes() / 2 / 1024).max(1) as u16;
    assert_eq!(hints_to(&h.drain(), 1), vec![half]);
}

#[test]
fn a_relay_passes_on_the_smaller_ask_from_beyond_it() {
    // Node 2 relays flow 1 → 3; node 3 asks for 128 KiB blocks.
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(shared_cfg()));
    feed_block(&mut h, 0, &[5u8; 250]);
    let out = h.drain();
    let before = hints_to(&out, 1);
    assert!(!before.is_empty() && before.iter().all(|&k| k == 0));
    assert!(
        bsyn_blocks(&out).contains(&0),
        "the relay forwards the block"
    );
    h.recv(
        3,
        &HopMessage {
            header: hdr(0, FLAG_COMPLETE),
            body: HopBody::Back {
                ctl: ControlSeq::default(),
                block_len: 250,
                packets: 3,
                duplicates: 0,
                block_hint_kib: 128,
                bitmap: &[0x07],
            },
        },
    );
    h.drain();
    // Node 1 asks about its block again: the answer carries node 3's ask.
    h.recv(1, &relay_bsyn(250));
    assert_eq!(hints_to(&h.drain(), 1), vec![128]);
}

#[test]
fn a_source_cuts_no_larger_block_than_its_first_hop_asks_for() {
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(shared_cfg()));
    let key = FlowKey { src: 1, id: 4 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; 1000])))
        .unwrap();
    h.drain();
    // The next hop takes the whole block and asks for blocks of 1 KiB.
    let mut back = source_back(&[0xff, 0x03]);
    back.header.flags = FLAG_COMPLETE;
    if let HopBody::Back { block_hint_kib, .. } = &mut back.body {
        *block_hint_kib = 1;
    }
    h.recv(2, &back);
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![2u8; 5000])))
        .unwrap();
    let out = h.drain();
    let lens = bodies(&out, |b| match b {
        HopBody::Data { geom, .. } | HopBody::Bsyn { geom, .. } => Some(geom.block_len),
        _ => None,
    });
    assert!(!lens.is_empty());
    assert!(lens.iter().all(|&l| l == 1024), "{lens:?}");
}

/// Node 2 (block size 1,600 bytes) serves node 1's block while node 3 asks for a turn for a
/// 900-byte block, then node 4 for a block of `later_len`; node 1's block completes. Returns
/// whether the next turn went to node 3 and to node 4.
fn next_turn_after(later_len: u32) -> (bool, bool) {
    let cfg = HopConfig {
        max_block_bytes: 1600,
        ..small_cfg()
    };
    let mut h = Harness::new(2, &[(1, 1), (3, 3), (4, 4)], HopTransport::new(cfg));
    h.recv(1, &bsyn_from(1, 1));
    assert_eq!(backs_to(&h.drain(), 1).len(), 1);
    for (from, len) in [(3, 900), (4, later_len)] {
        let mut m = bsyn_msg(hdr(0, 0), len);
        (m.header.src, m.header.flow_id, m.header.dst) = (from, 1, 2);
        h.recv(from, &m);
    }
    assert!(h.drain().is_empty());
    complete_block_from(&mut h, 1, 1);
    let out = h.drain();
    (!backs_to(&out, 3).is_empty(), !backs_to(&out, 4).is_empty())
}

#[test]
fn large_blocks_take_turns_in_the_order_they_asked_not_by_size() {
    // Blocks over 1/16 of the block size rank alike: a flow's whole first block is not held
    // back behind the smaller blocks of flows already running.
    assert_eq!(
        next_turn_after(300),
        (true, false),
        "the first to ask goes first"
    );
}

/// A block of exactly 1/16 of the block size (the block ramp's first block) is small: it
/// goes ahead of a larger block that asked before it, so a new flow starts within a turn.
#[test]
fn a_block_of_a_sixteenth_of_the_block_size_goes_ahead_of_larger_ones() {
    assert_eq!(
        next_turn_after(100),
        (false, true),
        "the sixteenth goes first"
    );
}

#[test]
fn a_first_block_is_the_smallest_ask_and_a_flow_asked_nothing_then_cuts_whole_blocks() {
    let cfg = HopConfig {
        max_block_bytes: 16_000,
        ..shared_cfg()
    };
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    let key = FlowKey { src: 1, id: 4 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; 50_000])))
        .unwrap();
    let lens = |out: &[Outgoing]| {
        bodies(out, |b| match b {
            HopBody::Data { geom, .. } | HopBody::Bsyn { geom, .. } => Some(geom.block_len),
            _ => None,
        })
    };
    let first = lens(&h.drain());
    assert!(
        !first.is_empty() && first.iter().all(|&l| l == 1000),
        "{first:?}"
    );
    // The next hop takes it whole and asks for nothing: the next block is whole.
    let mut back = source_back(&[0xff, 0x03]);
    back.header.flags = FLAG_COMPLETE;
    h.recv(2, &back);
    let next = lens(&h.drain());
    assert!(
        !next.is_empty() && next.iter().all(|&l| l == 16_000),
        "{next:?}"
    );
}
