//! §3.3 Hop-by-hop backpressure, and the bounds on flows a node holds.

use super::*;

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
