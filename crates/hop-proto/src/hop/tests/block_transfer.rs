//! §3.1 Reliable per-hop block transfer: BSYN, BACK and the rounds between them.

use super::*;

#[test]
fn back_waits_only_for_announced_packets() {
    // Blocks 0 and 1 of one sender are in progress together, which ack withholding (one
    // block at a time) would not allow.
    let cfg = HopConfig {
        back_quiet: Duration::from_millis(10),
        ack_withholding: false,
        ..small_cfg()
    };
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(cfg));
    let pkt = [7u8; 100];
    // Nothing in flight: answered at once.
    h.recv(1, &bsyn_with_expect(0, 500, 0));
    assert_eq!(backs_to(&h.drain(), 1).len(), 1);
    // The sender handed packets 0 and 1 to its link; the BSYN overtook them.
    h.recv(1, &bsyn_with_expect(0, 500, 2));
    assert!(backs_to(&h.drain(), 1).is_empty());
    h.recv(1, &data_packet(0, 500, 0, &pkt));
    assert!(backs_to(&h.drain(), 1).is_empty());
    // The second announced packet arrives: the BACK goes at once, without waiting for quiet.
    h.recv(1, &data_packet(0, 500, 1, &pkt));
    let out = h.drain();
    let backs: Vec<Vec<u8>> = out
        .iter()
        .filter(|o| o.next_hop == 1)
        .filter_map(|o| match HopMessage::parse(o.message()).ok()?.body {
            HopBody::Back { bitmap, .. } => Some(bitmap.to_vec()),
            _ => None,
        })
        .collect();
    assert_eq!(backs, vec![vec![0x03u8]]);
    // A lost packet: three announced, two more arrive, then the data pauses for back_quiet.
    h.recv(1, &bsyn_with_expect(0, 500, 5));
    h.recv(1, &data_packet(0, 500, 2, &pkt));
    h.recv(1, &data_packet(0, 500, 4, &pkt));
    assert!(backs_to(&h.drain(), 1).is_empty());
    h.now += Duration::from_millis(11);
    h.with(|t, ctx| t.handle_timeout(ctx));
    assert_eq!(backs_to(&h.drain(), 1), vec![(0, 5)]);
    // Data of this round that paused long before the BSYN arrived is lost: answered at once.
    h.recv(1, &bsyn_with_expect(1, 500, 0));
    assert_eq!(backs_to(&h.drain(), 1).len(), 1);
    h.now += Duration::from_millis(1);
    h.recv(1, &data_packet(1, 500, 0, &pkt));
    h.recv(1, &data_packet(1, 500, 1, &pkt));
    h.now += Duration::from_millis(20);
    h.recv(1, &bsyn_with_expect(1, 500, 3));
    assert_eq!(backs_to(&h.drain(), 1), vec![(0, 5)]);
}

#[test]
fn final_bsyn_announces_the_packets_sent() {
    // Node 1 is the source; node 2 its next hop.
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(small_cfg()));
    let key = FlowKey { src: 1, id: 4 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; 1000])))
        .unwrap();
    let expects = |out: &[Outgoing]| -> Vec<u16> {
        out.iter()
            .filter_map(|o| match HopMessage::parse(o.message()).ok()?.body {
                HopBody::Bsyn { expect, .. } => Some(expect),
                _ => None,
            })
            .collect()
    };
    assert_eq!(expects(&h.drain()), vec![0]);
    let back = |bitmap: &'static [u8]| HopMessage {
        header: HopHeader {
            src: 1,
            flow_id: 4,
            ..hdr(0, 0)
        },
        body: HopBody::Back {
            ctl: ControlSeq::default(),
            duplicates: 0,
            block_hint_kib: 0,
            block_len: 1000,
            packets: 10,
            bitmap,
        },
    };
    // Nothing held downstream: all ten packets go, then a BSYN announcing ten.
    h.recv(2, &back(&[0, 0]));
    let out = h.drain();
    assert_eq!(out.iter().filter(|o| o.class == Class::Data).count(), 10);
    assert_eq!(expects(&out), vec![10]);
    // Eight held, the last two missing: they were handed to the link after the newest
    // packet that arrived, so they are probably still queued here. Nothing is sent again and
    // the BSYN still announces ten.
    h.recv(2, &back(&[0xff, 0]));
    let out = h.drain();
    assert_eq!(out.iter().filter(|o| o.class == Class::Data).count(), 0);
    assert_eq!(expects(&out), vec![10]);
    // The next BACK shows nothing new long after: the two are lost and go again.
    h.now += Duration::from_secs(1);
    h.recv(2, &back(&[0xff, 0]));
    let out = h.drain();
    assert_eq!(out.iter().filter(|o| o.class == Class::Data).count(), 2);
    assert_eq!(expects(&out), vec![10]);
}

/// A BSYN of block 0 (500 bytes in 100-byte packets) announcing `expect` packets, whose
/// round ended with packet `last`.
fn bsyn_ending_at(expect: u16, last: u16) -> HopMessage<'static> {
    let mut m = bsyn_with_expect(0, 500, expect);
    if let HopBody::Bsyn { packet_num, .. } = &mut m.body {
        *packet_num = last + 1;
    }
    m
}

#[test]
fn a_bsyn_that_follows_its_rounds_last_packet_is_answered_at_once() {
    let cfg = HopConfig {
        back_quiet: Duration::from_millis(10),
        ..small_cfg()
    };
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(cfg));
    let pkt = [7u8; 100];
    h.recv(1, &bsyn_with_expect(0, 500, 0));
    h.drain();
    h.now += Duration::from_millis(1);
    // Packets 0-4 were handed to the link in order; 3 was lost. The BSYN comes after packet
    // 4, the round's last (a FIFO link): nothing else of the round can still arrive.
    for p in [0, 1, 2, 4] {
        h.recv(1, &data_packet(0, 500, p, &pkt));
    }
    h.drain();
    h.recv(1, &bsyn_ending_at(5, 4));
    // The BACK says the BSYN came behind its round's end (rounds_behind.rs).
    assert_eq!(backs_to(&h.drain(), 1), vec![(FLAG_END_HEARD, 5)]);
    // Packet 3 again, then a BSYN that overtakes it (802.11's voice queue): it waits for the
    // data behind it as before, and this time the packet arrives.
    h.recv(1, &bsyn_ending_at(5, 3));
    assert!(backs_to(&h.drain(), 1).is_empty());
    h.now += Duration::from_millis(1);
    h.recv(1, &data_packet(0, 500, 3, &pkt));
    assert_eq!(backs_to(&h.drain(), 1), vec![(FLAG_COMPLETE, 5)]);
}

#[test]
fn a_bsyn_that_overtook_its_data_waits_for_the_pause_even_after_the_rounds_end() {
    let cfg = HopConfig {
        back_quiet: Duration::from_millis(10),
        ..small_cfg()
    };
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(cfg));
    let pkt = [7u8; 100];
    h.recv(1, &bsyn_with_expect(0, 500, 0));
    h.drain();
    h.now += Duration::from_millis(1);
    h.recv(1, &bsyn_ending_at(5, 4));
    for p in [0, 1, 2, 4] {
        h.recv(1, &data_packet(0, 500, p, &pkt));
    }
    // The round's end is here but the BSYN came first: the pause it leaves is air for this
    // node's other senders, so the BACK waits for back_quiet.
    assert!(backs_to(&h.drain(), 1).is_empty());
    h.now += Duration::from_millis(11);
    h.with(|t, ctx| t.handle_timeout(ctx));
    assert_eq!(backs_to(&h.drain(), 1), vec![(0, 5)]);
}

/// Each BSYN's `expect` and `packet_num` (the round end of a block's BSYN).
fn bsyn_fields(out: &[Outgoing]) -> Vec<(u16, u16)> {
    bodies(out, |b| match b {
        HopBody::Bsyn {
            expect, packet_num, ..
        } => Some((expect, packet_num)),
        _ => None,
    })
}

fn bsyn_round_ends(out: &[Outgoing]) -> Vec<u16> {
    bsyn_fields(out).into_iter().map(|(_, end)| end).collect()
}

#[test]
fn a_bsyn_names_the_last_packet_its_round_handed_to_the_link() {
    // Ten packets in order: the round ends with packet 9 (wire value 10).
    let (mut h, out) = source_round(small_cfg());
    assert_eq!(data_nums(&out).len(), 10);
    assert_eq!(bsyn_round_ends(&out), vec![10]);
    // Packets 2 and 5 lost (handed over before packet 9, which arrived): they go again, 5
    // last.
    h.recv(2, &source_back(&[0b1101_1011, 0b11]));
    let out = h.drain();
    assert_eq!(data_nums(&out), vec![2, 5]);
    assert_eq!(bsyn_round_ends(&out), vec![6]);
}

fn bsyn_expects(out: &[Outgoing]) -> Vec<u16> {
    bsyn_fields(out)
        .into_iter()
        .map(|(expect, _)| expect)
        .collect()
}

#[test]
fn unanswered_bsyn_is_repeated_alone_and_judges_no_packet_lost() {
    let (mut h, out) = source_round(small_cfg());
    assert_eq!(data_nums(&out).len(), 10);
    // The BSYN of this round (or its BACK) is lost: when its timer fires only the BSYN is
    // sent again, announcing just what the next hop reported, so it is answered at once.
    let mut repeated = Vec::new();
    for _ in 0..20 {
        let Some(t) = h.t.poll_timeout() else { break };
        h.now = t;
        h.with(|t, ctx| t.handle_timeout(ctx));
        repeated = h.drain();
        if !bsyn_expects(&repeated).is_empty() {
            break;
        }
    }
    assert!(data_nums(&repeated).is_empty());
    assert_eq!(bsyn_expects(&repeated), vec![0]);
    // Asking for an answer at once, it names no round end either.
    assert_eq!(bsyn_round_ends(&repeated), vec![0]);
    assert!(!h.t.stats().extra.contains_key("lost_unanswered"));
    // Its BACK: all but the newest packet arrived, so that one is still in flight (FIFO
    // queue) and nothing is sent again.
    h.recv(2, &source_back(&[0xff, 0x01]));
    assert!(data_nums(&h.drain()).is_empty());
    assert_eq!(h.t.stats().data_retransmissions, 0);
}

/// The duplicates each BACK in `out` reports.
fn back_duplicates(out: &[Outgoing]) -> Vec<u16> {
    bodies(out, |b| match b {
        HopBody::Back {
            duplicates,
            block_hint_kib: 0,
            ..
        } => Some(duplicates),
        _ => None,
    })
}

/// A receiver counts the DATA packets of a block it gets again from upstream and reports
/// them in its next BACK, once. A packet it held only from an overheard frame is no
/// duplicate the first time its sender sends it.
#[test]
fn a_back_reports_the_data_received_twice_since_the_previous_back() {
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(small_cfg()));
    let data = [7u8; 100];
    let bsyn = |expect| bsyn_with_expect(0, 250, expect);
    let pkt = |p: u16| data_packet(0, 250, p, &data);
    // Packet 1 overheard from node 0 on its way to node 1.
    h.overhear(0, 1, &pkt(1));
    h.recv(1, &bsyn(0));
    assert_eq!(back_duplicates(&h.drain()), vec![0]);
    for p in [0, 1, 0, 1, 1] {
        h.recv(1, &pkt(p));
    }
    h.drain();
    h.recv(1, &bsyn(2));
    assert_eq!(back_duplicates(&h.drain()), vec![3]);
    h.recv(1, &bsyn(2));
    assert_eq!(back_duplicates(&h.drain()), vec![0]);
}

#[test]
fn poll_control_yields_the_queued_acks_and_never_data() {
    // A source with a block to send: nothing is queued yet, so poll_control has nothing;
    // poll_transmit forms the block and opens the round with its BSYN.
    let mut src = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(small_cfg()));
    let key = FlowKey { src: 1, id: 9 };
    src.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    src.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![7u8; 250])))
        .unwrap();
    assert!(src.with(|t, ctx| t.poll_control(ctx)).is_none());
    assert_eq!(bsyn_blocks(&src.drain()), vec![0]);
    // A relay that received a whole block owes node 1 its BACKs: poll_control yields them,
    // all control.
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(small_cfg()));
    feed_block(&mut h, 0, &[5u8; 250]);
    let mut control = Vec::new();
    while let Some(o) = h.with(|t, ctx| t.poll_control(ctx)) {
        control.push(o);
    }
    assert!(control.iter().all(|o| o.class == Class::Control));
    assert!(!backs_to(&control, 1).is_empty(), "the BACK to node 1");
    assert!(backs_to(&h.drain(), 1).is_empty(), "taken once");
}

#[test]
fn a_last_block_completed_by_data_alone_finishes_the_flow() {
    // Node 3, the destination, gets every packet of the flow's last block, each flagged FIN,
    // but no BSYN for it (withheld, lost, or answered before a restart).
    let mut h = Harness::new(3, &[(1, 1)], HopTransport::new(small_cfg()));
    last_block_by_data(&mut h);
    h.drain();
    let mut finished = None;
    while let Some(e) = h.t.poll_event() {
        if let Event::FlowFinished { flow, bytes } = e {
            finished = Some((flow, bytes));
        }
    }
    assert_eq!(finished, Some((FLOW, 250)));
}

/// Node 1 sending 2000 bytes in blocks of 1000 to node 3 via node 2: the BSYNs it sends
/// after the first BACK of block 0 and the data packets of block 0 it sends.
fn two_blocks_after_first_back(overlap: bool) -> Vec<u32> {
    let cfg = HopConfig {
        max_block_bytes: 1000,
        overlap_block_tails: overlap,
        ..small_cfg()
    };
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    let key = FlowKey { src: 1, id: 4 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; 2000])))
        .unwrap();
    assert_eq!(bsyn_blocks(&h.drain()), vec![0]);
    h.recv(2, &source_back(&[0, 0]));
    let out = h.drain();
    assert_eq!(data_nums(&out).len(), 10, "block 0 sent once");
    bsyn_blocks(&out)
}

#[test]
fn with_overlapping_tails_the_next_block_starts_once_the_previous_was_sent_once() {
    assert!(!two_blocks_after_first_back(false).contains(&1));
    assert!(two_blocks_after_first_back(true).contains(&1));
}

/// A block the application handed over in one buffer is cut from it without a copy: the
/// block refers to the application's bytes.
#[test]
fn a_source_block_refers_to_the_applications_buffer() {
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(small_cfg()));
    let key = FlowKey { src: 1, id: 4 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    let app = Bytes::from(vec![7u8; 1000]);
    h.with(|t, ctx| t.send(ctx, key, app.clone())).unwrap();
    h.drain();
    let b = &h.t.flows[&key].blocks[&0];
    assert!(matches!(&b.data, BlockData::Shared(d) if d.as_ptr() == app.as_ptr()));
    // And its packets go out as usual.
    h.recv(2, &source_back(&[0, 0]));
    assert_eq!(data_nums(&h.drain()).len(), 10);
}
