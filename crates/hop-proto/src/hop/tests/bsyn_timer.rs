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

/// When the first BSYN of a block, sent before any round trip to its next hop is measured,
/// is due again, as an offset from when it left.
fn first_bsyn_wait(cfg: HopConfig) -> Duration {
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    let key = FlowKey { src: 1, id: 4 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; 1000])))
        .unwrap();
    // Once, or twice where copies go to a next hop not heard yet (control_copies.rs).
    assert!(!bsyns(&h.drain()).is_empty());
    let due = h.t.poll_timeout().expect("the BSYN timer");
    due - h.now
}

#[test]
fn a_first_bsyn_waits_the_floor_where_the_link_does_not_retry_and_bsyn_timeout_elsewhere() {
    let ms = Duration::from_millis;
    // A wire: its data drains within the floor (50 ms), up to 25 % jitter.
    let wire = first_bsyn_wait(small_cfg().for_link(false));
    assert!(wire >= ms(50) && wire <= ms(63), "{wire:?}");
    // 802.11, which retries control frames, and a runtime that said nothing: 200 ms, which
    // covers a window's drain on a busy medium.
    for cfg in [small_cfg().for_link(true), small_cfg()] {
        let wait = first_bsyn_wait(cfg);
        assert!(wait >= ms(200) && wait <= ms(250), "{wait:?}");
    }
    // Once a round trip is measured, the estimate decides on both kinds of link.
    let cfg = HopConfig::default().for_link(false);
    let e = RttEstimate::update(None, ms(30));
    assert_eq!(bsyn_wait(&cfg, Some(&e), None, 0, false), ms(90));
    assert_eq!(
        bsyn_wait(&cfg.clone().for_link(true), Some(&e), None, 0, false),
        ms(90)
    );
}
