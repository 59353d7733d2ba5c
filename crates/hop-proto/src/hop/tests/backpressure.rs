//! §3.3 Hop-by-hop backpressure, and the bounds on flows a node holds.

use super::*;

/// Relay 2 with room for two flows: flow 0 delivered end to end (its FIN BACK passed, the
/// source's FIN did not), flow 1 still moving. A third flow takes flow 0's slot; a fourth,
/// with no finished flow left to give one up, is refused.
#[test]
fn at_the_flow_limit_a_finished_flow_gives_up_its_slot() {
    let cfg = HopConfig {
        max_flows: 2,
        ..small_cfg()
    };
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(cfg));
    let with_id = |id: u32, flags: u8| HopHeader {
        flow_id: id,
        ..hdr(0, flags)
    };
    for id in 0..2u32 {
        h.recv(1, &bsyn_msg(with_id(id, 0), 250));
    }
    let e2e = HopMessage {
        header: with_id(0, FLAG_FIN),
        body: HopBody::E2eBack { cum_blocks: 1 },
    };
    h.recv(3, &e2e);
    h.drain();
    h.recv(1, &bsyn_msg(with_id(2, 0), 250));
    assert_eq!(h.t.stats().flows, 2);
    assert_eq!(h.t.stats().extra["finished_flows_reclaimed"], 1);
    assert!(!h.t.stats().extra.contains_key("flows_refused"));
    h.recv(1, &bsyn_msg(with_id(3, 0), 250));
    assert_eq!(h.t.stats().extra["flows_refused"], 1);
}

/// Destination 3 with room for one flow: flow 9, delivered, gives up its slot to a new
/// flow, and a late BSYN of it is still answered as delivered (hop and end to end).
#[test]
fn a_destination_reclaims_a_delivered_flow_and_still_answers_it() {
    let cfg = HopConfig {
        max_flows: 1,
        ..small_cfg()
    };
    let mut h = Harness::new(3, &[(1, 1)], HopTransport::new(cfg));
    feed_block_flags(&mut h, 0, FLAG_FIN, &[5u8; 250]);
    h.drain();
    let other = HopHeader {
        flow_id: FLOW.id + 1,
        ..hdr(0, 0)
    };
    h.recv(1, &bsyn_msg(other, 250));
    assert_eq!(h.t.stats().extra["finished_flows_reclaimed"], 1);
    h.drain();
    h.recv(1, &relay_bsyn(250));
    let out = h.drain();
    assert_eq!(backs_to(&out, 1), vec![(FLAG_COMPLETE, 0)]);
    assert_eq!(e2e_cums(&out), vec![1]);
    assert_eq!(h.t.stats().extra["closed_flow_answered"], 1);
}

#[test]
fn flow_limit_refuses_new_flows() {
    let cfg = HopConfig {
        max_flows: 2,
        max_waiting_flows: 0,
        ..small_cfg()
    };
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(cfg));
    for id in 0..3u32 {
        let msg = HopMessage {
            header: HopHeader {
                flow_id: id,
                ..hdr(0, 0)
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
        h.recv(1, &msg);
    }
    assert_eq!(h.t.stats().flows, 2);
    assert_eq!(h.t.stats().extra["flows_refused"], 1);
    let r = h.with(|t, ctx| t.open(ctx, FlowKey { src: 2, id: 1 }, 9));
    // This node's own flow would wait for room; with no waiting allowed it is refused.
    assert_eq!(r, Err(AppError::TooManyWaitingFlows(0)));
}

#[test]
fn an_older_block_passes_backpressure_without_the_vtx_flag() {
    // Node 2 holds block 5 of the flow (H = 1) and cannot move it on: its next hop waits for
    // block 3, which it lost in a crash. Node 1 starts block 3's transfer again as a plain
    // BSYN. Holding it back behind block 5 would deadlock the flow; block 6 still waits.
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(small_cfg()));
    feed_block(&mut h, 5, &[5; 250]);
    h.drain();
    h.recv(1, &bsyn_msg(hdr(6, 0), 250));
    assert!(backs_to(&h.drain(), 1).is_empty(), "block 6 passed H");
    h.recv(1, &bsyn_msg(hdr(3, 0), 250));
    assert_eq!(backs_to(&h.drain(), 1).len(), 1, "block 3 held back");
}

/// Relay 2 holds a whole block of one flow for next hop 3, its quota per next hop (H = 1).
/// Another flow's micro-block still goes through (§3.6: micro-blocks do not wait behind
/// large blocks), so a flow opened by a one-packet block starts behind a busy relay; a third
/// flow's large block waits for the quota.
#[test]
fn a_micro_block_passes_a_full_next_hop_quota_and_a_large_block_waits() {
    let cfg = HopConfig {
        micro_block_threshold: 200,
        ..small_cfg()
    };
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(cfg));
    feed_block(&mut h, 0, &[5; 250]);
    h.drain();
    let other = |id: u32, flags: u8| HopHeader {
        flow_id: FLOW.id + id,
        ..hdr(0, flags)
    };
    let payload = [7u8; 50];
    let micro = HopMessage {
        header: other(1, FLAG_MICRO | FLAG_ASK),
        body: HopBody::Bsyn {
            ctl: ControlSeq::default(),
            offset: 0,
            geom: BlockGeom {
                block_len: 50,
                packet_size: 100,
            },
            packet_num: 0,
            expect: 0,
            payload: &payload,
        },
    };
    h.recv(1, &micro);
    assert_eq!(backs_to(&h.drain(), 1).len(), 1, "the micro-block waited");
    h.recv(1, &bsyn_msg(other(2, 0), 250));
    assert!(backs_to(&h.drain(), 1).is_empty(), "a large block passed H");
}
