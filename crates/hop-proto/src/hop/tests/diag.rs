//! Diagnostics: time in each sending state.

use super::*;

#[test]
fn time_in_state_counters_split_a_senders_time() {
    let ms = |h: &Harness, k: &str| h.t.stats().extra.get(k).copied().unwrap_or(0);
    let cfg = HopConfig {
        link_window_packets: 0,
        ..small_cfg()
    };
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    let key = FlowKey { src: 1, id: 4 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    // an open flow without bytes has nothing to send
    h.now += Duration::from_secs(1);
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; 1000])))
        .unwrap();
    assert_eq!(ms(&h, "time_idle_ms"), 1000);
    // the BSYN goes out; its answer comes 40 ms later
    let out = h.drain();
    assert_eq!(bsyn_blocks(&out), vec![0]);
    h.now += Duration::from_millis(40);
    h.recv(2, &source_back(&[0, 0]));
    assert_eq!(ms(&h, "time_round_ms"), 40);
    // the packets wait 5 ms for the link
    h.now += Duration::from_millis(5);
    let out = h.drain();
    assert_eq!(out.iter().filter(|o| o.class == Class::Data).count(), 10);
    assert_eq!(ms(&h, "time_ready_ms"), 5);
    // no answer to the round's BSYN: the first wait is a round, the repeats' are silence
    let start = h.now;
    for _ in 0..3 {
        // (a deadline already passed, housekeeping's, is handled now)
        h.now = h.t.poll_timeout().unwrap().max(h.now);
        h.with(|t, ctx| t.handle_timeout(ctx));
        h.drain();
    }
    let waited = h.now.saturating_duration_since(start).as_millis() as u64;
    let round = ms(&h, "time_round_ms") - 40;
    let silent = ms(&h, "time_silent_ms");
    assert!(round > 0 && silent > 0, "round {round} silent {silent}");
    // (each counter rounds down to whole milliseconds)
    assert!(
        waited - (round + silent) <= 2,
        "{round} + {silent} of {waited}"
    );
    assert_eq!(ms(&h, "time_held_ms"), 0);
    // every millisecond since the flow opened is in one counter
    assert_eq!(ms(&h, "time_feed_ms"), 0);
    let total: u64 = [
        "time_idle_ms",
        "time_ready_ms",
        "time_feed_ms",
        "time_round_ms",
        "time_silent_ms",
        "time_held_ms",
    ]
    .iter()
    .map(|k| ms(&h, k))
    .sum();
    let elapsed = h.now.saturating_duration_since(Instant::ZERO).as_millis() as u64;
    assert!(elapsed - total <= 5, "{total} of {elapsed}");
}

#[test]
fn a_relay_waiting_for_packets_from_upstream_counts_as_fed() {
    let ms = |h: &Harness, k: &str| h.t.stats().extra.get(k).copied().unwrap_or(0);
    // relay 2 on the path 1 -> 2 -> 3, a 1000-byte block of ten 100-byte packets (fewer than
    // a txop): pipelining forwards it only once it is complete
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(small_cfg()));
    h.recv(1, &relay_bsyn(1000));
    let geom = BlockGeom {
        block_len: 1000,
        packet_size: 100,
    };
    let data = |p: u16| HopMessage {
        header: hdr(0, 0),
        body: HopBody::Data {
            offset: 0,
            geom,
            packet_num: p,
            payload: &[7u8; 100],
        },
    };
    for p in 0..5 {
        h.recv(1, &data(p));
    }
    h.drain();
    // the other half arrives 30 ms later
    h.now += Duration::from_millis(30);
    for p in 5..10 {
        h.recv(1, &data(p));
    }
    assert_eq!(ms(&h, "time_feed_ms"), 30);
    // the block is complete: the relay asks its next hop, which answers 10 ms later
    let out = h.drain();
    assert_eq!(bsyn_blocks(&out), vec![0]);
    h.now += Duration::from_millis(10);
    h.recv(
        3,
        &HopMessage {
            header: hdr(0, 0),
            body: HopBody::Back {
                ctl: ControlSeq::default(),
                duplicates: 0,
                block_hint_kib: 0,
                block_len: 1000,
                packets: 10,
                bitmap: &[0, 0],
            },
        },
    );
    assert_eq!(ms(&h, "time_round_ms"), 10);
    h.now += Duration::from_millis(2);
    let out = h.drain();
    assert_eq!(out.iter().filter(|o| o.class == Class::Data).count(), 10);
    assert_eq!(ms(&h, "time_ready_ms"), 2);
    assert_eq!(ms(&h, "time_feed_ms"), 30);
}
