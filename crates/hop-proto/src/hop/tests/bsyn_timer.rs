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
