//! Reliable per-hop block transfer, pipelining and micro-blocks over a test network.

mod hop_harness;

use hop_harness::{secs, LinkSpec, Net};
use hop_proto::hop::HopConfig;

fn one_hop(loss: f64, seed: u64) -> Net {
    let spec = LinkSpec {
        loss,
        ..LinkSpec::default()
    };
    let mut net = Net::chain(2, spec, HopConfig::default(), seed);
    net.transfer(1, 2, 300_000);
    net.run_to_completion(secs(600.0));
    net
}

#[test]
fn one_hop_lossless() {
    let net = one_hop(0.0, 1);
    net.assert_all_identical();
    let s = net.stats(1);
    assert_eq!(s.data_retransmissions, 0);
    // 300 000 bytes in 1380-byte packets.
    assert_eq!(s.sent_by_type["data"], 300_000u64.div_ceil(1380));
}

/// The source hears the acknowledged prefix grow block by block (`Event::Acknowledged`, what
/// an application's progress shows), ending at the flow's length.
#[test]
fn the_source_hears_the_acknowledged_prefix_grow_per_block() {
    let mut net = Net::chain(3, LinkSpec::default(), HopConfig::default(), 3);
    let len = 3 * (1 << 20) + 1000;
    net.transfer(1, 3, len);
    net.run_to_completion(secs(600.0));
    net.assert_all_identical();
    let acked = &net.apps[0].acked;
    assert!(acked.len() >= 4, "{acked:?}");
    assert!(acked.windows(2).all(|w| w[0] <= w[1]), "{acked:?}");
    // A lone flow: its opening packet (a micro-block), then whole blocks of 1 MiB.
    assert!(acked.contains(&1380), "{acked:?}");
    assert!(acked.contains(&(1380 + (1 << 20))), "{acked:?}");
    assert_eq!(acked.last().copied(), Some(len as u64));
}

#[test]
fn one_hop_lossy_links_deliver_identical_bytes() {
    for (i, loss) in [0.2, 0.5, 0.8].into_iter().enumerate() {
        let net = one_hop(loss, 10 + i as u64);
        net.assert_all_identical();
        let s = net.stats(1);
        assert!(s.data_retransmissions > 0, "loss {loss}: no retransmission");
    }
}

#[test]
fn seven_hop_chain() {
    let mut net = Net::chain(
        8,
        LinkSpec {
            loss: 0.1,
            ..LinkSpec::default()
        },
        HopConfig::default(),
        3,
    );
    net.transfer(1, 8, 2_500_000);
    net.run_to_completion(secs(600.0));
    net.assert_all_identical();
    for id in 1..=8 {
        let s = net.stats(id);
        assert!(
            s.buffered_blocks_peak <= 1,
            "node {id}: {} blocks",
            s.buffered_blocks_peak
        );
    }
}

#[test]
fn relays_pipeline_before_the_block_is_complete() {
    // With pipelining a relay starts forwarding after a txop, so a 1 MiB block crosses two
    // hops in much less than twice its one-hop time.
    let run = |pipelining: bool| {
        let cfg = HopConfig {
            pipelining,
            ..HopConfig::default()
        };
        let mut net = Net::chain(3, LinkSpec::default(), cfg, 4);
        net.transfer(1, 3, 1 << 20);
        net.run_to_completion(secs(600.0));
        net.assert_all_identical();
        net.apps[0].delivered_at.unwrap().as_secs_f64()
    };
    let with = run(true);
    let without = run(false);
    assert!(
        with < without * 0.75,
        "pipelined {with} s vs store-and-forward {without} s"
    );
}

#[test]
fn four_kilobytes_in_one_bsyn_back_round_trip() {
    let mut net = Net::chain(2, LinkSpec::default(), HopConfig::default(), 5);
    net.transfer(1, 2, 4096);
    net.run_to_completion(secs(60.0));
    net.assert_all_identical();
    let s1 = net.stats(1);
    let s2 = net.stats(2);
    // 4096 bytes = 3 packets, each on a micro-block BSYN; one BACK answers them all.
    assert_eq!(s1.sent_by_type.get("micro"), Some(&3));
    assert_eq!(s1.sent_by_type.get("data"), None);
    assert_eq!(s1.sent_by_type.get("bsyn"), None);
    assert_eq!(s2.sent_by_type.get("back"), Some(&1));
    // Delivered after one one-way trip of the BSYNs (well under a millisecond per frame).
    assert!(net.apps[0].delivered_at.unwrap().as_secs_f64() < 0.02);
}

#[test]
fn flow_state_is_reclaimed_everywhere() {
    let cfg = HopConfig {
        flow_idle_timeout: secs(5.0),
        ..HopConfig::default()
    };
    let mut net = Net::chain(
        4,
        LinkSpec {
            loss: 0.1,
            ..LinkSpec::default()
        },
        cfg,
        6,
    );
    net.transfer(1, 4, 200_000);
    net.transfer(4, 1, 5_000);
    net.run_to_completion(secs(120.0));
    net.assert_all_identical();
    let until = net.now + secs(30.0);
    net.run_until(until, |_| false);
    for id in 1..=4 {
        let s = net.stats(id);
        assert_eq!(s.flows, 0, "node {id} keeps flows");
        assert_eq!(s.cache_bytes, 0, "node {id} keeps bytes");
    }
}

/// Two equal transfers share a 2-hop path; the second is expedited, the first bulk. Every
/// node sends the expedited flow's data first (the relay learns the class from its BSYNs and
/// DATA), so it arrives in about the time it would take alone; with both of one class the two
/// share the path and arrive together.
#[test]
fn an_expedited_flow_goes_ahead_of_a_bulk_one_at_every_hop() {
    use hop_wire::hop::{PRIORITY_BULK, PRIORITY_EXPEDITED, PRIORITY_NORMAL};
    let size = 8 << 20;
    let run = |first: u8, second: u8| {
        let mut net = Net::chain(3, LinkSpec::default(), HopConfig::default(), 5);
        let a = net.transfer(1, 3, size);
        let b = net.transfer(1, 3, size);
        let now = net.now;
        for (app, p) in [(a, first), (b, second)] {
            let flow = net.apps[app].flow;
            net.nodes
                .get_mut(&1)
                .unwrap()
                .set_priority(now, flow, p)
                .unwrap();
        }
        net.run_to_completion(secs(600.0));
        net.assert_all_identical();
        let took = |app: usize| {
            let n = &net.apps[app];
            (n.delivered_at.expect("delivered") - n.start).as_secs_f64()
        };
        (took(a), took(b))
    };
    let (alike_a, alike_b) = run(PRIORITY_NORMAL, PRIORITY_NORMAL);
    let (bulk, expedited) = run(PRIORITY_BULK, PRIORITY_EXPEDITED);
    assert!(
        alike_b > 0.8 * alike_a,
        "flows of one class should share the path: {alike_a:.2} s and {alike_b:.2} s"
    );
    assert!(
        expedited < 0.7 * bulk && expedited < 0.7 * alike_b,
        "the expedited flow took {expedited:.2} s (bulk {bulk:.2} s; alike {alike_a:.2}/{alike_b:.2} s)"
    );
}
