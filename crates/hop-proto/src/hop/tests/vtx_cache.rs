//! §3.2 Virtual retransmission and in-network caches.

use super::*;

#[test]
fn cache_is_bounded_and_never_drops_custody() {
    let cfg = HopConfig {
        cache_limit_bytes: 600,
        backpressure_limit: 10,
        ..small_cfg()
    };
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(cfg));
    // Three 250-byte blocks: the third does not fit beside two blocks in custody.
    for b in 0..3 {
        feed_block(&mut h, b, &[b as u8; 250]);
    }
    let out = h.drain();
    let complete = backs_to(&out, 1)
        .iter()
        .filter(|(f, _)| f & FLAG_COMPLETE != 0)
        .count();
    assert_eq!(complete, 2);
    assert!(h.t.stats().cache_bytes <= 600);
    assert!(h.t.stats().extra["backpressure_withheld"] >= 1);
}

#[test]
fn source_keeps_blocks_until_end_to_end_back_within_its_cache() {
    let cfg = HopConfig {
        max_block_bytes: 250,
        cache_limit_bytes: 300,
        ..small_cfg()
    };
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    let key = FlowKey { src: 1, id: 9 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    let n = h
        .with(|t, ctx| t.send(ctx, key, Bytes::from(vec![7u8; 500])))
        .unwrap();
    assert_eq!(n, 500);
    assert_eq!(bsyn_blocks(&h.drain()), vec![0]);
    let back = |block| {
        whole_back(HopHeader {
            src: 1,
            dst: 3,
            ..hdr(block, FLAG_COMPLETE)
        })
    };
    h.recv(2, &back(0));
    // Block 0 moved to node 2 but is not acknowledged end to end: the source keeps it, and
    // with the cache full it does not cut block 1 yet.
    assert!(bsyn_blocks(&h.drain()).is_empty());
    assert_eq!(h.t.stats().cache_bytes, 500);
    h.recv(
        2,
        &HopMessage {
            header: HopHeader {
                src: 1,
                dst: 3,
                ..hdr(0, 0)
            },
            body: HopBody::E2eBack { cum_blocks: 1 },
        },
    );
    assert_eq!(bsyn_blocks(&h.drain()), vec![1]);
    assert_eq!(h.t.stats().cache_bytes, 250);
}

#[test]
fn virtual_retransmission_ttl_decrements_and_expires() {
    for (ttl, forwarded) in [(5u8, Some(4u8)), (1, None)] {
        let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(small_cfg()));
        let data = [9u8; 250];
        feed_block(&mut h, 0, &data);
        h.drain();
        // Node 3 took the block: node 2 keeps it only as cache.
        h.recv(3, &whole_back(hdr(0, FLAG_COMPLETE)));
        h.drain();
        let vtx = HopMessage {
            header: HopHeader {
                ttl,
                ..hdr(0, FLAG_VTX)
            },
            body: HopBody::Bsyn {
                ctl: ControlSeq::default(),
                offset: 0,
                geom: BlockGeom {
                    block_len: 250,
                    packet_size: 100,
                },
                packet_num: 0,
                expect: 0,
                payload: &[],
            },
        };
        h.recv(1, &vtx);
        let out = h.drain();
        assert_eq!(backs_to(&out, 1), vec![(FLAG_COMPLETE, 3)]);
        let fwd: Vec<u8> = out
            .iter()
            .filter(|o| o.next_hop == 3)
            .filter_map(|o| match HopMessage::parse(o.message()).ok()? {
                HopMessage {
                    header,
                    body: HopBody::Bsyn { .. },
                } if header.flags & FLAG_VTX != 0 => Some(header.ttl),
                _ => None,
            })
            .collect();
        assert_eq!(fwd, forwarded.into_iter().collect::<Vec<_>>(), "ttl {ttl}");
        assert_eq!(h.t.stats().extra["cache_hits"], 1);
    }
}

#[test]
fn a_packet_from_a_shared_datagram_is_cached_by_reference() {
    // Node 2 overhears node 1's DATA to node 3 from a runtime that shares its datagrams
    // (the simulator): the cache holds a slice of that buffer, not a copy.
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(small_cfg()));
    let geom = BlockGeom {
        block_len: 250,
        packet_size: 100,
    };
    let payload = [5u8; 100];
    let mut body = Vec::new();
    HopMessage {
        header: hdr(0, 0),
        body: HopBody::Data {
            offset: 0,
            geom,
            packet_num: 1,
            payload: &payload,
        },
    }
    .emit(&mut body)
    .unwrap();
    let shared = Bytes::from(body);
    h.with(|t, ctx| {
        t.handle(
            ctx,
            Received {
                link_src: 1,
                link_dst: 3,
                overheard: true,
                body: &shared,
                shared: Some(&shared),
            },
        )
    })
    .unwrap();
    let b = &h.t.flows[&FLOW].blocks[&0];
    assert_eq!(b.packet(1), &payload[..]);
    let (start, end) = (
        shared.as_ptr() as usize,
        shared.as_ptr() as usize + shared.len(),
    );
    let held = b.packet(1).as_ptr() as usize;
    assert!(
        start <= held && held + 100 <= end,
        "the cached packet is a copy"
    );
    // The block's accounting is its whole length, as for a copied block (the cap holds).
    assert_eq!(h.t.stats().cache_bytes, 250);
}

/// BSYNs to `to` in `out`.
fn bsyns_to(out: &[Outgoing], to: NodeId) -> usize {
    out.iter()
        .filter(|o| o.next_hop == to)
        .filter(|o| {
            matches!(
                HopMessage::parse(o.message()),
                Ok(HopMessage {
                    body: HopBody::Bsyn { .. },
                    ..
                })
            )
        })
        .count()
}

/// Relay 2, whose next hop toward destination 3 is `next_hop` (3 itself, or 5 two hops from
/// it), has passed `FLOW`'s last block to it, which took it whole. The BSYNs it sends
/// `next_hop` at each of `times` (seconds after), the end-to-end BACK with FIN arriving
/// from `next_hop` at `e2e_at` (seconds) if given.
fn fin_probes_at(
    cfg: HopConfig,
    next_hop: NodeId,
    e2e_at: Option<u64>,
    times: &[u64],
) -> Vec<usize> {
    let routes = [(3, next_hop), (next_hop, next_hop), (1, 1)];
    let mut h = Harness::new(2, &routes, HopTransport::new(cfg));
    feed_block_flags(&mut h, 0, FLAG_FIN, &[6u8; 250]);
    h.drain();
    h.recv(next_hop, &whole_back(hdr(0, FLAG_COMPLETE | FLAG_FIN)));
    h.drain();
    let mut sent = Vec::new();
    for &s in times {
        h.now = Instant::ZERO + Duration::from_millis(s * 1000);
        if e2e_at == Some(s) {
            let e2e = HopMessage {
                header: hdr(0, FLAG_FIN),
                body: HopBody::E2eBack { cum_blocks: 1 },
            };
            h.recv(next_hop, &e2e);
        }
        h.with(|t, ctx| t.handle_timeout(ctx));
        sent.push(bsyns_to(&h.drain(), next_hop));
    }
    sent
}

/// The end-to-end BACK that finishes a flow is the one no later BACK covers: the
/// destination's last hop asks for it again (1, 2, 4 and 8 s after the destination took the
/// last block, each wait twice the one before) until it passes, and no more than
/// `fin_probes` times; the paper leaves its loss to the source's 60 s timer.
#[test]
fn the_last_hop_asks_the_destination_again_for_the_back_that_finishes_the_flow() {
    let times = [0, 1, 2, 3, 5, 7, 11, 15, 31, 60];
    assert_eq!(
        fin_probes_at(small_cfg(), 3, None, &times),
        vec![0, 1, 0, 1, 0, 1, 0, 1, 0, 0]
    );
    // The BACK passes after the first probe: no more.
    assert_eq!(
        fin_probes_at(small_cfg(), 3, Some(2), &times),
        vec![0, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    let paper = HopConfig {
        fin_probes: 0,
        ..small_cfg()
    };
    assert_eq!(fin_probes_at(paper, 3, None, &times), vec![0; 10]);
}

/// A destination answers the probe as any BSYN of a delivered block: with its BACK and the
/// end-to-end BACK that finishes the flow.
#[test]
fn a_destination_answers_a_probe_with_the_back_that_finished_the_flow() {
    let mut h = Harness::new(3, &[(1, 1)], HopTransport::new(small_cfg()));
    feed_block_flags(&mut h, 0, FLAG_FIN, &[6u8; 250]);
    h.drain();
    h.recv(1, &bsyn_msg(hdr(0, FLAG_FIN), 250));
    let out = h.drain();
    assert_eq!(backs_to(&out, 1), vec![(FLAG_COMPLETE, 0)]);
    assert_eq!(e2e_cums(&out), vec![1]);
}

/// Where control copies are on (links that do not retry control frames), each hop loses the
/// end-to-end BACK that finishes a flow on its own: every node that handed the last block
/// whole asks its next hop again, not only the destination's last hop. On 802.11 (copies
/// off) only the last hop asks.
#[test]
fn where_control_copies_are_on_every_hop_asks_for_the_back_that_finishes_the_flow() {
    let times = [0, 1, 2, 3, 5, 7, 11, 15, 31, 60];
    let copies = HopConfig {
        control_copies: ControlCopies::On,
        ..small_cfg()
    };
    // Each probe goes twice: the next hop has sent nothing numbered, so its loss is not
    // known yet (control_copies.rs).
    assert_eq!(
        fin_probes_at(copies.clone(), 5, None, &times),
        vec![0, 2, 0, 2, 0, 2, 0, 2, 0, 0]
    );
    assert_eq!(
        fin_probes_at(copies, 5, Some(2), &times),
        vec![0, 2, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(fin_probes_at(small_cfg(), 5, None, &times), vec![0; 10]);
}

/// A relay that has passed on the end-to-end BACK that finishes a flow answers a probe from
/// upstream with it again.
#[test]
fn a_relay_answers_a_probe_with_the_back_that_finished_the_flow() {
    let cfg = HopConfig {
        control_copies: ControlCopies::On,
        ..small_cfg()
    };
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(cfg));
    feed_block_flags(&mut h, 0, FLAG_FIN, &[6u8; 250]);
    h.drain();
    h.recv(3, &whole_back(hdr(0, FLAG_COMPLETE | FLAG_FIN)));
    h.recv(
        3,
        &HopMessage {
            header: hdr(0, FLAG_FIN),
            body: HopBody::E2eBack { cum_blocks: 1 },
        },
    );
    h.drain();
    h.recv(1, &bsyn_msg(hdr(0, FLAG_FIN), 250));
    let out = h.drain();
    // The BACK twice (node 1 has sent nothing numbered: its loss is not known yet), the
    // end-to-end BACK twice, as every end-to-end BACK with FIN where copies are on.
    assert_eq!(backs_to(&out, 1).len(), 2);
    assert_eq!(e2e_cums(&out), vec![1, 1]);
}
