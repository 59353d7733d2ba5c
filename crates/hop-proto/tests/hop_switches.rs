//! Every combination of Hop's mechanisms and options delivers every byte, once and in order:
//! random switches, chain lengths, link losses, overhearing and hidden-terminal collisions,
//! and concurrent transfers of mixed sizes (micro-blocks, partial blocks, several blocks) in
//! both directions; and with a relay that crashes or loses a link.

mod hop_harness;

use std::time::Duration;

use hop_harness::{secs, LinkSpec, Net};
use hop_proto::hop::HopConfig;
use proptest::prelude::*;

fn config(switches: u32) -> HopConfig {
    let on = |bit: u32| switches & (1 << bit) != 0;
    HopConfig {
        // Small blocks and packets keep each case short in virtual and real time.
        max_block_bytes: if on(0) { 64 * 1024 } else { 16 * 1024 },
        packet_payload_bytes: 500,
        txop_bytes: 4000,
        micro_block_threshold: if on(1) { 4000 } else { 0 },
        pipelining: on(2),
        ack_withholding: on(3),
        backpressure: on(4),
        backpressure_limit: if on(5) { 3 } else { 1 },
        queue_aware: on(6),
        duplicate_feedback: on(7),
        adaptive_bsyn_timeout: on(8),
        round_per_next_hop: on(9),
        cache_overheard: on(10),
        link_window_packets: if on(11) { 0 } else { 32 },
        next_hop_backpressure: on(12),
        neighbour_silence: if on(13) {
            Duration::from_secs(6)
        } else {
            Duration::ZERO
        },
        ..HopConfig::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn every_switch_combination_delivers_every_byte(
        switches in any::<u32>(),
        hops in 1u32..4,
        loss_pct in 0u32..60,
        overhear: bool,
        collisions: bool,
        sizes in proptest::collection::vec(0usize..150_000, 1..4),
        seed in any::<u64>(),
    ) {
        let spec = LinkSpec {
            loss: f64::from(loss_pct) / 100.0,
            ..LinkSpec::default()
        };
        let n = hops + 1;
        let mut net = Net::chain(n, spec, config(switches), seed);
        net.overhear = overhear;
        net.collisions = collisions;
        // 802.11b's largest first backoff (CWmin 31 slots of 20 us): without a random wait,
        // two hidden senders can collide on every frame in lockstep, which no MAC does.
        net.backoff = Duration::from_micros(620);
        for (i, &len) in sizes.iter().enumerate() {
            // Alternate directions; the second flow of a direction starts from the middle
            // when there is one.
            let (src, dst) = match i % 3 {
                0 => (1, n),
                1 => (n, 1),
                _ => (1 + (n - 1) / 2, n),
            };
            if src != dst {
                net.transfer(src, dst, len);
            }
        }
        net.run_to_completion(secs(900.0));
        let checked = net.check_all_identical();
        prop_assert!(checked.is_ok(), "switches {switches:#x}: {}", checked.unwrap_err());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// The same with a relay that crashes (losing every block it held) or loses its link
    /// downstream for up to 3 s, early in the transfers.
    #[test]
    fn every_switch_combination_recovers_from_a_relay_crash_or_an_outage(
        switches in any::<u32>(),
        hops in 2u32..5,
        loss_pct in 0u32..25,
        sizes in proptest::collection::vec(0usize..200_000, 1..3),
        crash_ms in 0u64..600,
        down_ms in 0u64..3000,
        outage: bool,
        seed in any::<u64>(),
    ) {
        let spec = LinkSpec { loss: f64::from(loss_pct) / 100.0, ..LinkSpec::default() };
        let n = hops + 1;
        let mut net = Net::chain(n, spec, config(switches), seed);
        net.backoff = Duration::from_micros(620);
        for (i, &len) in sizes.iter().enumerate() {
            let (src, dst) = if i % 2 == 0 { (1, n) } else { (n, 1) };
            net.transfer(src, dst, len);
        }
        let relay = 1 + (seed % u64::from(n - 2)) as u32 + 1;
        net.run_until(net.now + Duration::from_millis(crash_ms), |_| false);
        if outage {
            net.set_link_up(relay, relay + 1, false);
        } else {
            net.crash(relay);
        }
        net.run_until(net.now + Duration::from_millis(down_ms), |_| false);
        if outage {
            net.set_link_up(relay, relay + 1, true);
        } else {
            net.restart(relay);
        }
        net.run_to_completion(secs(1200.0));
        let checked = net.check_all_identical();
        prop_assert!(
            checked.is_ok(),
            "switches {switches:#x}, relay {relay}, outage {outage}: {}",
            checked.unwrap_err()
        );
    }
}
