//! Backpressure, ack withholding and round-robin scheduling.

mod hop_harness;

use hop_harness::{secs, LinkSpec, Net};
use hop_proto::hop::HopConfig;

/// 1 - 2 - 3 with a slow second link: node 2 is where blocks pile up.
fn slow_downstream(cfg: HopConfig, seed: u64) -> Net {
    let mut net = Net::chain(3, LinkSpec::default(), cfg, seed);
    let slow = LinkSpec {
        rate: 11e6 / 8.0 / 10.0,
        ..LinkSpec::default()
    };
    net.link(2, 3, slow);
    net.transfer(1, 3, 6 << 20);
    net.run_to_completion(secs(900.0));
    net
}

#[test]
fn backpressure_bounds_blocks_held_per_flow() {
    for h in [1usize, 3] {
        let cfg = HopConfig {
            backpressure_limit: h,
            max_block_bytes: 512 * 1024,
            ..HopConfig::default()
        };
        let net = slow_downstream(cfg, 31);
        net.assert_all_identical();
        for id in 1..=3 {
            let s = net.stats(id);
            assert!(
                s.buffered_blocks_peak <= h as u64,
                "H={h}: node {id} held {} blocks",
                s.buffered_blocks_peak
            );
        }
        // The limit is what binds at the relay in front of the slow link.
        assert_eq!(net.stats(2).buffered_blocks_peak, h as u64);
        assert!(net.stats(2).extra["backpressure_withheld"] > 0);
    }
}

#[test]
fn without_backpressure_blocks_pile_up() {
    let cfg = HopConfig {
        backpressure: false,
        max_block_bytes: 512 * 1024,
        ..HopConfig::default()
    };
    let net = slow_downstream(cfg, 32);
    net.assert_all_identical();
    assert!(net.stats(2).buffered_blocks_peak > 3);
}

/// Nodes 1 and 3 both send to node 2 and cannot hear each other (hidden terminals).
fn hidden_senders(ack_withholding: bool, seed: u64, limit: f64) -> Net {
    let mut net = Net::new(seed);
    net.collisions = true;
    let spec = LinkSpec::default();
    net.link(1, 2, spec);
    net.link(3, 2, spec);
    // The paper's sender (no link window, every missing packet resent): the window alone
    // already paces hidden senders; this isolates ack withholding (§3.5).
    let cfg = HopConfig {
        ack_withholding,
        queue_aware: false,
        link_window_packets: 0,
        ..HopConfig::default()
    };
    net.add_node(1, vec![(2, 2), (3, 2)], cfg.clone());
    net.add_node(2, vec![(1, 1), (3, 3)], cfg.clone());
    net.add_node(3, vec![(2, 2), (1, 2)], cfg);
    net.transfer(1, 2, 2 << 20);
    net.transfer(3, 2, 2 << 20);
    net.run_to_completion(secs(limit));
    net
}

#[test]
fn ack_withholding_serialises_hidden_senders() {
    let with = hidden_senders(true, 41, 900.0);
    with.assert_all_identical();
    assert!(with.stats(2).extra["acks_withheld"] > 0);
    let took = with.now.as_secs_f64();
    // Without withholding, give the same pair of transfers twice as long.
    let without = hidden_senders(false, 41, 2.0 * took);
    let delivered = |n: &Net| n.apps.iter().map(|a| a.received.len()).sum::<usize>();
    assert!(
        with.data_collisions * 10 < without.data_collisions,
        "collisions with withholding {} vs without {}",
        with.data_collisions,
        without.data_collisions
    );
    assert!(delivered(&without) < delivered(&with));
}

#[test]
fn micro_blocks_are_not_held_behind_large_blocks() {
    // A 2 MiB transfer from node 1 holds node 2; node 3's 4 KB micro-block still gets through
    // at once (§3.6: micro-blocks circumvent ack withholding).
    let mut net = Net::new(42);
    net.collisions = true;
    let spec = LinkSpec::default();
    net.link(1, 2, spec);
    net.link(3, 2, spec);
    let cfg = HopConfig::default();
    net.add_node(1, vec![(2, 2), (3, 2)], cfg.clone());
    net.add_node(2, vec![(1, 1), (3, 3)], cfg.clone());
    net.add_node(3, vec![(2, 2), (1, 2)], cfg);
    net.transfer(1, 2, 2 << 20);
    let t = net.now + secs(0.2);
    net.run_until(t, |_| false);
    let start = net.now;
    let small = net.transfer(3, 2, 4096);
    net.run_to_completion(secs(900.0));
    net.assert_all_identical();
    let small_delay = net.apps[small].delivered_at.unwrap() - start;
    let big_done = net.apps[0].delivered_at.unwrap() - start;
    assert!(
        small_delay < big_done / 4,
        "micro-block took {small_delay:?}, big {big_done:?}"
    );
}

fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let q: f64 = x.iter().map(|v| v * v).sum();
    s * s / (x.len() as f64 * q)
}

#[test]
fn thirty_long_flows_share_a_relay_fairly() {
    // Ack withholding serves one block at a time (§3.5), so thirty flows through one relay
    // take turns by whole blocks: fair over a span of several blocks per flow, which is how
    // the paper measures long-lived flows (a snapshot, §5.3), not within one block.
    let mut net = Net::chain(
        3,
        LinkSpec {
            loss: 0.05,
            ..LinkSpec::default()
        },
        HopConfig::default(),
        51,
    );
    for _ in 0..30 {
        net.transfer(1, 3, 6 << 20);
    }
    // Snapshot when the flows have delivered four blocks each on average.
    let snapshot = 30 * 4 * (1 << 20);
    let limit = net.now + secs(3600.0);
    net.run_until(limit, |n| {
        n.apps.iter().map(|a| a.received.len()).sum::<usize>() >= snapshot
    });
    let got: Vec<f64> = net.apps.iter().map(|a| a.received.len() as f64).collect();
    assert!(got.iter().sum::<f64>() >= snapshot as f64, "{got:?}");
    let j = jain(&got);
    assert!(j > 0.9, "Jain index {j}: {got:?}");
    assert!(net.stats(2).flows <= 30);
}

/// Twelve flows from node 1 through relay 2 to node 3 over links that lose `loss` of the
/// frames: data packets per BSYN sent by the source, and Jain's index of the flows' goodputs.
fn twelve_flows_through_one_relay(round_per_next_hop: bool, loss: f64, seed: u64) -> (f64, f64) {
    // Without ack withholding the relay takes every flow's block at once, which is where
    // the scheduler decides how many packets a round carries; with it (one block at a time)
    // the source's blocks to the relay go one after another anyway.
    let cfg = HopConfig {
        round_per_next_hop,
        ack_withholding: false,
        ..HopConfig::default()
    };
    let spec = LinkSpec {
        loss,
        ..LinkSpec::default()
    };
    let mut net = Net::chain(3, spec, cfg, seed);
    for _ in 0..12 {
        net.transfer(1, 3, 300_000);
    }
    net.run_to_completion(secs(900.0));
    net.assert_all_identical();
    let s = net.stats(1);
    let count = |k: &str| s.sent_by_type.get(k).copied().unwrap_or(0) as f64;
    let goodput: Vec<f64> = net
        .apps
        .iter()
        .map(|a| a.data.len() as f64 / (a.delivered_at.unwrap() - a.start).as_secs_f64())
        .collect();
    (count("data") / count("bsyn").max(1.0), jain(&goodput))
}

#[test]
fn rounds_per_next_hop_carry_more_packets_and_stay_fair() {
    // Interleaving a txop of every flow splits the link window among twelve blocks, so each
    // BSYN/BACK round carries a few packets; with `round_per_next_hop` the flows take turns
    // by rounds, which carry more, and each flow keeps its place in the rotation.
    // Fairness varies with the seed far more than with anything else: over seeds 1-8 Jain's
    // index was 0.54-0.99 at 5 % loss and 0.44-1.00 at 30 % (2026-11-25; the paper's
    // scheduler: 0.999-1.000), so the test asks for a fair mean over eight seeds, not for
    // any one of them.
    for loss in [0.05, 0.3] {
        let (per_bsyn_off, _) = twelve_flows_through_one_relay(false, loss, 7);
        let (per_bsyn_on, _) = twelve_flows_through_one_relay(true, loss, 7);
        assert!(
            per_bsyn_on > 2.0 * per_bsyn_off,
            "loss {loss}: {per_bsyn_on:.1} data packets per BSYN with rounds per next hop, {per_bsyn_off:.1} without"
        );
        let js: Vec<f64> = (1..=8)
            .map(|seed| twelve_flows_through_one_relay(true, loss, seed).1)
            .collect();
        let mean = js.iter().sum::<f64>() / js.len() as f64;
        assert!(mean > 0.8, "loss {loss}: Jain index over seeds 1-8 {js:?}");
    }
}
