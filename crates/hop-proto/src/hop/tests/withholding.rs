//! §3.5 Ack withholding: one upstream sender at a time.

use super::*;

#[test]
fn ack_withholding_prefers_small_blocks_and_skips_silent_senders() {
    // Node 2 is the destination of three flows from nodes 1, 3 and 4 (its neighbours).
    let mut h = Harness::new(2, &[(1, 1), (3, 3), (4, 4)], HopTransport::new(small_cfg()));
    let bsyn = |src: NodeId, len: u32| HopMessage {
        header: HopHeader {
            priority: 0,
            flags: 0,
            ttl: 0,
            src,
            flow_id: 1,
            dst: 2,
            block_num: 0,
        },
        body: HopBody::Bsyn {
            ctl: ControlSeq::default(),
            offset: 0,
            geom: BlockGeom {
                block_len: len,
                packet_size: 100,
            },
            packet_num: 0,
            expect: 0,
            payload: &[],
        },
    };
    h.recv(1, &bsyn(1, 250));
    h.recv(3, &bsyn(3, 900));
    h.recv(4, &bsyn(4, 300));
    let out = h.drain();
    assert_eq!(backs_to(&out, 1).len(), 1);
    assert!(backs_to(&out, 3).is_empty() && backs_to(&out, 4).is_empty());
    assert_eq!(h.t.stats().extra["acks_withheld"], 2);
    // Node 1 completes its block: the smaller waiting block (node 4's) is served next.
    let geom = BlockGeom {
        block_len: 250,
        packet_size: 100,
    };
    for p in 0..3u16 {
        let r = geom.packet_range(u32::from(p)).unwrap();
        let data = [1u8; 100];
        h.recv(
            1,
            &HopMessage {
                header: HopHeader {
                    src: 1,
                    flow_id: 1,
                    dst: 2,
                    ..hdr(0, 0)
                },
                body: HopBody::Data {
                    offset: 0,
                    geom,
                    packet_num: p,
                    payload: &data[..r.len()],
                },
            },
        );
    }
    let out = h.drain();
    let to1 = backs_to(&out, 1);
    assert_eq!(to1.len(), 1);
    assert_eq!(to1[0].0 & FLAG_COMPLETE, FLAG_COMPLETE);
    assert_eq!(backs_to(&out, 4), vec![(0, 3)]);
    assert!(backs_to(&out, 3).is_empty());
    // Node 4 goes silent: after the withholding timeout node 3 gets its turn.
    let t = h.now + DEFAULT_WITHHOLD_TIMEOUT + HOUSEKEEPING_INTERVAL * 2;
    while h.now < t {
        h.now = h.t.poll_timeout().unwrap().min(t);
        h.with(|t, ctx| t.handle_timeout(ctx));
        let out = h.drain();
        if !backs_to(&out, 3).is_empty() {
            assert!(h.now >= Instant::ZERO + DEFAULT_WITHHOLD_TIMEOUT);
            return;
        }
    }
    panic!("node 3 never got a BACK");
}

#[test]
fn ack_withholding_serves_one_block_at_a_time_in_order_of_asking() {
    let mut h = Harness::new(2, &[(1, 1), (3, 3), (4, 4)], HopTransport::new(small_cfg()));
    h.recv(1, &bsyn_from(1, 1));
    assert_eq!(backs_to(&h.drain(), 1).len(), 1);
    // A second block from the sender being served waits too (one block at a time, §3.5).
    h.recv(1, &bsyn_from(1, 2));
    h.now += Duration::from_millis(1);
    h.recv(3, &bsyn_from(3, 1));
    h.now += Duration::from_millis(1);
    h.recv(4, &bsyn_from(4, 1));
    // Node 3 asks again: a retry does not send it to the back of the queue.
    h.now += Duration::from_millis(5);
    h.recv(3, &bsyn_from(3, 1));
    assert!(h.drain().is_empty());
    assert_eq!(h.t.stats().extra["acks_withheld"], 4);
    // Node 1's block completes: node 1's other block asked first but node 1 was just
    // served, so node 3 (asked before node 4) is next.
    complete_block_from(&mut h, 1, 1);
    let out = h.drain();
    assert_eq!(backs_to(&out, 3), vec![(0, 3)]);
    assert!(backs_to(&out, 4).is_empty());
    assert_eq!(
        backs_to(&out, 1).len(),
        1,
        "only the completed block's BACK"
    );
    // Then node 1's second block (asked before node 4), then node 4.
    complete_block_from(&mut h, 3, 1);
    let out = h.drain();
    assert_eq!(backs_to(&out, 1), vec![(0, 3)]);
    assert!(backs_to(&out, 4).is_empty());
    complete_block_from(&mut h, 1, 2);
    assert_eq!(backs_to(&h.drain(), 4), vec![(0, 3)]);
}

/// A BSYN of `bsyn_from`'s block announcing `expect` packets held once the round arrives.
fn bsyn_expecting(src: NodeId, flow: u32, expect: u16) -> HopMessage<'static> {
    let mut m = bsyn_from(src, flow);
    if let HopBody::Bsyn { expect: e, .. } = &mut m.body {
        *e = expect;
    }
    m
}

#[test]
fn a_turn_lasts_until_the_block_completes() {
    // The paper's rule (§3.5), the default: no turn horizon.
    let mut h = node_1_holds_the_turn(small_cfg());
    // Node 1 sends its three packets round after round and none arrives.
    for _ in 0..20 {
        h.now += Duration::from_millis(300);
        h.recv(1, &bsyn_expecting(1, 1, 3));
        h.recv(3, &bsyn_from(3, 1));
        let out = h.drain();
        assert_eq!(backs_to(&out, 1).len(), 1);
        assert!(backs_to(&out, 3).is_empty());
    }
}

/// Node 2 (a destination, neighbours 1 and 3) gives its turn to node 1's block; node 3's
/// block waits for it (§3.5).
fn node_1_holds_the_turn(cfg: HopConfig) -> Harness {
    let mut h = Harness::new(2, &[(1, 1), (3, 3)], HopTransport::new(cfg));
    h.recv(1, &bsyn_from(1, 1));
    h.recv(3, &bsyn_from(3, 1));
    assert_eq!(backs_to(&h.drain(), 1).len(), 1);
    h
}

/// `small_cfg` with a turn horizon of 30 s.
fn horizon_cfg() -> HopConfig {
    HopConfig {
        turn_horizon: Duration::from_secs(30),
        ..small_cfg()
    }
}

/// Node 1 holds node 2's turn and node 3 waits (`node_1_holds_the_turn`). Node 1 repeats
/// its BSYN every 300 ms (it is never silent; its timers run first at each step) and, when
/// `packet_at` says so, one of its block's packets arrives. Returns when node 3 got the turn,
/// if it did within `until`.
fn turn_passes(h: &mut Harness, packet_at: &[u64], until: Duration) -> Option<Duration> {
    let start = h.now;
    let data = [1u8; 100];
    let mut step = 0u64;
    while h.now < start + until {
        h.now += Duration::from_millis(300);
        step += 1;
        h.with(|t, ctx| t.handle_timeout(ctx));
        if packet_at.contains(&step) {
            let p = packet_at.iter().position(|&s| s == step).unwrap() as u16;
            let mut m = data_packet(0, 250, p, &data);
            m.header.src = 1;
            m.header.flow_id = 1;
            m.header.dst = 2;
            h.recv(1, &m);
        }
        h.recv(1, &bsyn_expecting(1, 1, 3));
        h.recv(3, &bsyn_from(3, 1));
        if !backs_to(&h.drain(), 3).is_empty() {
            return Some(h.now - start);
        }
    }
    None
}

#[test]
fn a_turn_whose_block_barely_moves_goes_to_the_sender_waiting() {
    // Node 1's packets do not arrive: at that pace its block would never complete, so once
    // the turn has lasted twice the silence timeout node 3 gets it.
    let mut h = node_1_holds_the_turn(horizon_cfg());
    let passed = turn_passes(&mut h, &[], Duration::from_secs(10)).expect("node 3 waited");
    assert!(passed >= DEFAULT_WITHHOLD_TIMEOUT * 2, "{passed:?}");
    assert!(
        passed <= DEFAULT_WITHHOLD_TIMEOUT * 2 + Duration::from_millis(600),
        "{passed:?}"
    );
    assert_eq!(h.t.stats().extra["released_slow"], 1);
    // Node 1's block waits for its next turn, which comes when node 3's block is done.
    h.recv(1, &bsyn_expecting(1, 1, 3));
    assert!(backs_to(&h.drain(), 1).is_empty());
    complete_block_from(&mut h, 3, 1);
    assert_eq!(backs_to(&h.drain(), 1).len(), 1);
}

#[test]
fn a_turn_whose_block_moves_is_kept() {
    // One of node 1's three packets arrives in the first second: at that pace the other two
    // take seconds, well within the horizon, so node 3 keeps waiting.
    let mut h = node_1_holds_the_turn(horizon_cfg());
    assert_eq!(turn_passes(&mut h, &[2], Duration::from_secs(10)), None);
    assert!(!h.t.stats().extra.contains_key("released_slow"));
}

#[test]
fn a_turn_alone_is_kept_however_slow() {
    // Nobody waits: the slow turn has no one to go to.
    let mut h = Harness::new(2, &[(1, 1), (3, 3)], HopTransport::new(horizon_cfg()));
    h.recv(1, &bsyn_from(1, 1));
    assert_eq!(backs_to(&h.drain(), 1).len(), 1);
    for _ in 0..20 {
        h.now += Duration::from_millis(300);
        h.with(|t, ctx| t.handle_timeout(ctx));
        h.recv(1, &bsyn_expecting(1, 1, 3));
        assert_eq!(backs_to(&h.drain(), 1).len(), 1);
    }
    assert!(!h.t.stats().extra.contains_key("released_slow"));
}

#[test]
fn a_block_released_by_silence_waits_for_its_next_turn() {
    let mut h = Harness::new(2, &[(1, 1), (3, 3)], HopTransport::new(small_cfg()));
    h.recv(1, &bsyn_from(1, 1));
    h.recv(3, &bsyn_from(3, 1));
    let out = h.drain();
    assert_eq!(backs_to(&out, 1).len(), 1);
    assert!(backs_to(&out, 3).is_empty());
    // Node 1 goes silent: node 3 gets the turn.
    let t = h.now + DEFAULT_WITHHOLD_TIMEOUT + HOUSEKEEPING_INTERVAL * 2;
    let mut served = false;
    while h.now < t && !served {
        h.now = h.t.poll_timeout().unwrap().min(t);
        h.with(|t, ctx| t.handle_timeout(ctx));
        served = !backs_to(&h.drain(), 3).is_empty();
    }
    assert!(served, "node 3 never got a BACK");
    // Node 1 comes back to the block it had started: it waits until node 3's block is done.
    h.recv(1, &bsyn_from(1, 1));
    assert!(backs_to(&h.drain(), 1).is_empty());
    complete_block_from(&mut h, 3, 1);
    let out = h.drain();
    assert_eq!(backs_to(&out, 1), vec![(0, 3)]);
}

#[test]
fn a_waiting_bsyn_for_a_block_cached_under_another_geometry_gets_its_turn() {
    // Both flows go on to node 3: without backpressure per next hop, so that node 1's
    // complete block does not hold node 4's back for want of room toward node 3.
    let cfg = HopConfig {
        next_hop_backpressure: false,
        ..small_cfg()
    };
    let mut h = Harness::new(2, &[(3, 3), (1, 1), (4, 4)], HopTransport::new(cfg));
    let theirs = HopHeader {
        priority: 0,
        flags: 0,
        ttl: 0,
        src: 4,
        flow_id: 7,
        dst: 3,
        block_num: 0,
    };
    // Node 1's block holds the turn; node 4 asks for its 250-byte block 0 and waits.
    h.recv(1, &bsyn_msg(hdr(0, 0), 250));
    h.recv(4, &bsyn_msg(theirs, 250));
    let out = h.drain();
    assert_eq!(backs_to(&out, 1).len(), 1);
    assert!(backs_to(&out, 4).is_empty());
    // Then node 2 overhears a packet of a 1000-byte block 0 of the same flow (an older copy,
    // from before node 4 restarted), sent to another node, and caches it.
    h.overhear(
        4,
        5,
        &HopMessage {
            header: theirs,
            body: HopBody::Data {
                offset: 0,
                geom: BlockGeom {
                    block_len: 1000,
                    packet_size: 100,
                },
                packet_num: 0,
                payload: &[1; 100],
            },
        },
    );
    // Node 1's block completes: node 4's turn comes, although the cached copy of its block
    // is larger than the block it now sends.
    feed_block(&mut h, 0, &[9; 250]);
    let out = h.drain();
    assert_eq!(backs_to(&out, 4).len(), 1);
}

#[test]
fn datagrams_handled_before_the_timer_do_not_postpone_housekeeping() {
    // Node 1 holds the turn and goes silent. Node 3 asks every 100 ms, and each time its
    // BSYN is handled before the runtime calls the timer, as a runtime whose socket is
    // always readable does: the silent sender is still released after `withhold_timeout`.
    let mut h = node_1_holds_the_turn(small_cfg());
    let start = h.now;
    while h.now < start + Duration::from_secs(5) {
        h.now += Duration::from_millis(100);
        h.recv(3, &bsyn_from(3, 1));
        h.with(|t, ctx| t.handle_timeout(ctx));
        if !backs_to(&h.drain(), 3).is_empty() {
            let waited = h.now - start;
            assert!(waited >= DEFAULT_WITHHOLD_TIMEOUT, "{waited:?}");
            assert!(
                waited <= DEFAULT_WITHHOLD_TIMEOUT + HOUSEKEEPING_INTERVAL * 2,
                "{waited:?}"
            );
            return;
        }
    }
    panic!("node 3 never got the turn");
}

/// `bsyn_from`'s block, of a flow to `dst`.
fn bsyn_to(src: NodeId, flow: u32, dst: NodeId) -> HopMessage<'static> {
    let mut m = bsyn_from(src, flow);
    m.header.dst = dst;
    m
}

/// Node 2 serves node 1's block while node 3 (a flow to 8, two hops on), node 4 (a flow
/// to its next hop 9) and node 5 (a flow to node 2 itself) wait, in that order of asking.
/// Returns the senders that got the next two turns.
fn turns_after_three_wait(cfg: HopConfig, wait_before: Duration) -> (Vec<NodeId>, Vec<NodeId>) {
    let routes = [(1, 1), (3, 3), (4, 4), (5, 5), (9, 9), (8, 9)];
    let mut h = Harness::new(2, &routes, HopTransport::new(cfg));
    h.recv(1, &bsyn_from(1, 1));
    assert_eq!(backs_to(&h.drain(), 1).len(), 1);
    for (src, dst) in [(3, 8), (4, 9), (5, 2)] {
        h.now += Duration::from_millis(1);
        h.recv(src, &bsyn_to(src, 1, dst));
    }
    assert!(h.drain().is_empty());
    h.now += wait_before;
    let granted = |out: &[Outgoing]| -> Vec<NodeId> {
        [3, 4, 5]
            .into_iter()
            .filter(|s| !backs_to(out, *s).is_empty())
            .collect()
    };
    complete_block_from(&mut h, 1, 1);
    let first = granted(&h.drain());
    let second = if first == vec![5] {
        // Node 5 gets its completed block's BACK; the turn goes to one of the others.
        complete_block_from(&mut h, 5, 1);
        let mut next = granted(&h.drain());
        next.retain(|s| *s != 5);
        next
    } else {
        Vec::new()
    };
    (first, second)
}

#[test]
fn nearest_exit_first_serves_blocks_nearest_their_destination_first() {
    let cfg = HopConfig {
        nearest_exit_first: true,
        ..small_cfg()
    };
    // Node 5's block ends here, node 4's one hop on: both go before node 3's, which asked
    // first.
    assert_eq!(
        turns_after_three_wait(cfg, Duration::ZERO),
        (vec![5], vec![4])
    );
}

#[test]
fn without_nearest_exit_first_turns_go_in_the_order_asked() {
    let (first, _) = turns_after_three_wait(small_cfg(), Duration::ZERO);
    assert_eq!(first, vec![3]);
}

#[test]
fn a_block_waiting_past_the_nearest_exit_age_goes_in_the_order_asked() {
    let cfg = HopConfig {
        nearest_exit_first: true,
        nearest_exit_age: Duration::from_millis(500),
        ..small_cfg()
    };
    let (first, _) = turns_after_three_wait(cfg.clone(), Duration::from_millis(600));
    assert_eq!(first, vec![3]);
    // Before the age the rule holds.
    let (first, _) = turns_after_three_wait(cfg, Duration::from_millis(100));
    assert_eq!(first, vec![5]);
}
