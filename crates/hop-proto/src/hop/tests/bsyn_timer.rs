//! Extension: the adaptive BSYN timer.

use super::*;

#[test]
fn bsyn_floor_falls_only_on_links_that_drain_fast() {
    let cfg = HopConfig::default();
    let ms = Duration::from_millis;
    // No delivery measured yet: the configured floor.
    assert_eq!(bsyn_floor(&cfg, None), ms(50));
    // 802.11b: a 32-packet window takes ~60-70 ms to drain; the floor stays.
    assert_eq!(bsyn_floor(&cfg, Some(ms(65))), ms(50));
    // 10 ms of queue: twice that (the BSYN names the round's end; the next hop answers
    // when it arrives).
    assert_eq!(bsyn_floor(&cfg, Some(ms(10))), ms(20));
    // A wire delivering in a few hundred microseconds: the lowest floor.
    assert_eq!(bsyn_floor(&cfg, Some(Duration::from_micros(300))), ms(2));
    // Repeats ask for an answer at once: multiples of one delivery delay (within the floors).
    let e = RttEstimate::update(None, Duration::from_micros(400));
    assert_eq!(bsyn_wait(&cfg, Some(&e), Some(ms(1)), 0, false), ms(2));
    assert_eq!(bsyn_wait(&cfg, Some(&e), Some(ms(1)), 2, false), ms(4));
    assert_eq!(bsyn_wait(&cfg, Some(&e), Some(ms(5)), 2, false), ms(10));
    assert_eq!(bsyn_wait(&cfg, Some(&e), Some(ms(65)), 2, false), ms(100));
    assert_eq!(bsyn_wait(&cfg, Some(&e), None, 2, false), ms(100));
}

/// The BSYNs in `out`: (seq, expect).
fn bsyns(out: &[Outgoing]) -> Vec<(u16, u16)> {
    bodies(out, |b| match b {
        HopBody::Bsyn { ctl, expect, .. } => Some((ctl.seq, expect)),
        _ => None,
    })
}

#[test]
fn a_blocks_first_bsyn_on_an_idle_link_waits_the_floor_not_the_initial_timeout() {
    // Nothing of the node's data is queued ahead of it: there is no drain to cover, and the
    // next hop answers at once (expect 0). 50 ms, up to 25 % jitter.
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(small_cfg()));
    let key = FlowKey { src: 1, id: 4 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; 1000])))
        .unwrap();
    assert_eq!(bsyns(&h.drain()).len(), 1);
    let due = h.t.poll_timeout().expect("the BSYN timer");
    let ms = Duration::from_millis;
    assert!(due >= h.now + ms(50) && due <= h.now + ms(63), "{due:?}");
    // With data of the node queued ahead, the first BSYN before any sample waits
    // `bsyn_timeout`, which covers that data's drain (tests/micro.rs: `bsyn_wait`).
}

#[test]
fn a_repeat_whose_back_echoes_it_gives_a_round_trip_sample() {
    let ms = Duration::from_millis;
    for (echo_repeat, sampled) in [(true, true), (false, false)] {
        let (mut h, out) = source_round(small_cfg());
        let first = bsyns(&out)[0].0;
        // The round's BSYN (or its BACK) is lost: the timer sends a repeat.
        h.now = h.t.poll_timeout().unwrap();
        h.with(|t, ctx| t.handle_timeout(ctx));
        let repeat = bsyns(&h.drain());
        assert_eq!(repeat.len(), 1);
        assert_eq!(repeat[0].1, 0, "a repeat asks for an answer at once");
        h.now += ms(3);
        // Its answer names the repeat (or, not sampled, only the round's first BSYN: that
        // BACK may have waited a timer's length at the next hop or on the way).
        let echo = if echo_repeat { repeat[0].0 } else { first };
        let mut back = source_back(&[0xff, 0x03]);
        if let HopBody::Back { ctl, .. } = &mut back.body {
            *ctl = ControlSeq {
                seq: 1,
                echo,
                loss: 0,
            };
        }
        // The block's first BSYN, answered at once, gave the first sample (0).
        let before = h.t.bsyn_rtt.get(&2).map(|e| e.srtt);
        assert_eq!(before, Some(Duration::ZERO));
        h.recv(2, &back);
        let after = h.t.bsyn_rtt.get(&2).map(|e| e.srtt);
        let want = if sampled { ms(3) / 8 } else { Duration::ZERO };
        assert_eq!(after, Some(want), "echo {echo}");
        // The delivery delay keeps Karn's rule: the packets reported arrived long before.
        assert_eq!(h.t.link_queue.delivery_delay, None);
    }
}
