//! End-to-end reliability by virtual retransmission, caches, and partitions.

mod hop_harness;

use hop_harness::{secs, LinkSpec, Net};
use hop_proto::hop::HopConfig;
use hop_proto::Instant;

const SIZE: usize = 3 << 20;

#[test]
fn relay_crash_is_recovered_by_virtual_retransmission_from_caches() {
    // Every packet a data packet: no opening micro-block, whose packet rides on a BSYN.
    let cfg = HopConfig {
        opening_block_packets: 0,
        ..HopConfig::default()
    };
    let mut net = Net::chain(4, LinkSpec::default(), cfg, 21);
    net.transfer(1, 4, SIZE);
    // Crash the second relay (node 3) right after it took custody of its first block (sent
    // the completing BACK upstream) while still forwarding it; back after 2 s.
    let limit = Instant::ZERO + secs(60.0);
    net.run_until(limit, |n| {
        n.stats(3).buffered_blocks_peak >= 1
            && n.stats(4)
                .received_by_type
                .get("data")
                .copied()
                .unwrap_or(0)
                > 0
    });
    // Let the completing BACK reach node 2 (a few frame times), not the rest of the block.
    let t = net.now + secs(0.003);
    net.run_until(t, |_| false);
    assert!(net.stats(2).received_by_type["back"] >= 2);
    assert!(
        net.apps[0].complete_at.is_none(),
        "transfer finished before the crash"
    );
    net.crash(3);
    let up = net.now + secs(2.0);
    net.run_until(up, |_| false);
    net.restart(3);
    net.run_to_completion(secs(900.0));
    net.dump();
    net.assert_all_identical();
    let src = net.stats(1);
    let first_relay = net.stats(2);
    let packets = (SIZE as u64).div_ceil(1380);
    assert!(
        src.extra.get("vtx_sent").copied().unwrap_or(0) >= 1,
        "no virtual retransmission"
    );
    // The source never re-sent data: what node 3 lost came from node 2's cache.
    assert_eq!(src.sent_by_type["data"], packets);
    assert_eq!(src.data_retransmissions, 0);
    assert!(
        first_relay.sent_by_type["data"] > packets,
        "node 2 did not re-send from its cache"
    );
    assert!(first_relay.extra["cache_hits"] >= 1);
}

#[test]
fn partitioned_path_still_delivers() {
    // Hop paper §5.7: on a 7-hop path the 3rd and 5th nodes are down alternately, so no
    // end-to-end path ever exists; blocks advance hop by hop while the next hop is up.
    let cfg = HopConfig {
        backpressure_limit: 100,
        ..HopConfig::default()
    };
    let mut net = Net::chain(8, LinkSpec::default(), cfg, 22);
    net.transfer(1, 8, SIZE);
    let period = secs(5.0);
    let mut down = 3;
    for (a, b) in [(2, 3), (3, 4)] {
        net.set_link_up(a, b, false);
    }
    for _ in 0..400 {
        let next = net.now + period;
        net.run_until(next, |n| n.apps[0].complete_at.is_some());
        if net.apps[0].complete_at.is_some() {
            break;
        }
        // Swap which node is down; never both up.
        let up = down;
        down = if down == 3 { 5 } else { 3 };
        net.set_link_up(down - 1, down, false);
        net.set_link_up(down, down + 1, false);
        net.set_link_up(up - 1, up, true);
        net.set_link_up(up, up + 1, true);
    }
    net.assert_all_identical();
    let relay = net.stats(4);
    assert!(
        relay.buffered_blocks_peak > 1,
        "node 4 never had to store blocks"
    );
    assert!(relay.buffered_blocks_peak <= 100);
}

#[test]
fn unreachable_next_hop_retries_with_bounded_backoff() {
    let mut net = Net::chain(3, LinkSpec::default(), HopConfig::default(), 23);
    net.set_link_up(2, 3, false);
    net.transfer(1, 3, 200_000);
    let t = Instant::ZERO + secs(60.0);
    net.run_until(t, |_| false);
    let relay = net.stats(2);
    let bsyns = relay.sent_by_type.get("bsyn").copied().unwrap_or(0);
    // The first BSYN waits the initial 200 ms; repeats wait k x 50 ms (the adaptive timer's
    // floor), reaching the 2 s ceiling after 40 repeats (41 s), then one per 2-2.5 s (25 %
    // jitter): at most about 50 BSYNs in a minute, not hundreds, and never fewer than one per
    // ceiling period.
    let cfg = HopConfig::default();
    let floor = cfg.bsyn_min_timeout.as_secs_f64();
    let ceiling = cfg.bsyn_max_backoff.as_secs_f64();
    let (mut t, mut most) = (cfg.bsyn_timeout.as_secs_f64(), 1u64);
    while t < 60.0 {
        t += (floor * most as f64).min(ceiling);
        most += 1;
    }
    let fewest = (60.0 / (ceiling * 1.25)) as u64;
    assert!(
        (fewest..=most).contains(&bsyns),
        "{bsyns} BSYNs in 60 s, expected {fewest}..={most}"
    );
    net.set_link_up(2, 3, true);
    net.run_to_completion(secs(600.0));
    net.assert_all_identical();
    // Once the link was back the block moved within one backoff period (2 s + 25 % jitter)
    // plus the 0.2 s the transfer itself takes at 11 Mb/s.
    let done = net.apps[0].delivered_at.unwrap().as_secs_f64();
    let max_wait = hop_proto::hop::DEFAULT_BSYN_MAX_BACKOFF.as_secs_f64() * 1.25;
    assert!(done < 60.0 + max_wait + 0.5, "delivered at {done}");
}

#[test]
fn overheard_packets_are_cached_and_serve_virtual_retransmissions() {
    // Star-free chain 1-2-3 plus a node 4 that neighbours both 1 and 2 but is not on the path:
    // it overhears node 1's data to node 2 and caches it.
    let mut net = hop_harness::Net::new(24);
    let spec = LinkSpec::default();
    net.link(1, 2, spec);
    net.link(2, 3, spec);
    net.link(1, 4, spec);
    net.link(2, 4, spec);
    net.overhear = true;
    let cfg = HopConfig::default();
    net.add_node(1, vec![(2, 2), (3, 2), (4, 4)], cfg.clone());
    net.add_node(2, vec![(1, 1), (3, 3), (4, 4)], cfg.clone());
    net.add_node(3, vec![(1, 2), (2, 2), (4, 2)], cfg.clone());
    net.add_node(4, vec![(1, 1), (2, 2), (3, 2)], cfg);
    net.transfer(1, 3, 300_000);
    net.run_to_completion(secs(120.0));
    net.assert_all_identical();
    let s4 = net.stats(4);
    let cached = s4.extra.get("overheard_cached").copied().unwrap_or(0);
    assert_eq!(
        cached,
        300_000u64.div_ceil(1380),
        "node 4 cached {cached} packets"
    );
    assert!(s4.cache_bytes_peak >= 300_000);
}

#[test]
fn source_gives_up_without_progress_and_releases_state() {
    let cfg = HopConfig {
        give_up_after: secs(30.0),
        ..HopConfig::default()
    };
    let mut net = Net::chain(3, LinkSpec::default(), cfg, 25);
    // An idle flow (nothing offered) must not fail.
    let idle = net
        .nodes
        .get_mut(&1)
        .unwrap()
        .open(Instant::ZERO, hop_wire::TransportId::Hop, 3)
        .unwrap();
    net.set_link_up(1, 2, false);
    net.transfer(1, 3, 100_000);
    let t = Instant::ZERO + secs(40.0);
    net.run_until(t, |_| false);
    assert!(net.apps[0].failed, "stuck flow not abandoned");
    let s = net.stats(1);
    assert_eq!(s.flows, 1, "only the idle flow remains");
    assert_eq!(s.cache_bytes, 0);
    // The idle flow still works once the link is back.
    net.set_link_up(1, 2, true);
    let now = net.now;
    let node = net.nodes.get_mut(&1).unwrap();
    assert_eq!(
        node.send(now, idle, bytes::Bytes::from_static(b"late"))
            .unwrap(),
        4
    );
    node.finish(now, idle).unwrap();
    let until = net.now + secs(10.0);
    net.run_until(until, |_| false);
    // Completed end to end: the source released it.
    assert_eq!(net.stats(1).flows, 0);
}

/// A flow with a lifetime is tried past the give-up time while its path is cut, and fails
/// once the lifetime passes, aborted along its path; one whose path heals in time completes.
#[test]
fn a_flow_with_a_lifetime_outlasts_the_give_up_time_and_expires_at_its_end() {
    let cfg = HopConfig {
        give_up_after: secs(30.0),
        ..HopConfig::default()
    };
    let mut net = Net::chain(3, LinkSpec::default(), cfg, 26);
    net.set_link_up(2, 3, false);
    let cut = net.transfer(1, 3, 100_000);
    let healed = net.transfer(1, 3, 50_000);
    for app in [cut, healed] {
        let (now, flow) = (net.now, net.apps[app].flow);
        let until = now + secs(if app == cut { 90.0 } else { 300.0 });
        net.nodes
            .get_mut(&1)
            .unwrap()
            .set_lifetime(now, flow, until)
            .unwrap();
    }
    let t = Instant::ZERO + secs(60.0);
    net.run_until(t, |_| false);
    assert!(!net.apps[cut].failed, "gave up before its lifetime passed");
    assert!(net.stats(2).cache_bytes > 0, "the relay holds the blocks");
    let t = Instant::ZERO + secs(95.0);
    net.run_until(t, |_| false);
    assert!(
        net.apps[cut].failed,
        "not expired at the end of its lifetime"
    );
    net.set_link_up(2, 3, true);
    let t = Instant::ZERO + secs(200.0);
    net.run_until(t, |_| false);
    assert!(net.apps[healed].delivered_at.is_some());
    assert!(
        net.apps[cut].delivered_at.is_none(),
        "an expired flow was delivered"
    );
    assert_eq!(net.stats(2).flows, 0);
    assert_eq!(net.stats(2).cache_bytes, 0);
}

/// A flow its source aborts ends at the destination too (`FlowAbandoned`, so the runtime can
/// free what it kept of it); a flow that finished beside it does not.
#[test]
fn an_aborted_flow_is_abandoned_at_its_destination() {
    let mut net = Net::chain(3, LinkSpec::default(), HopConfig::default(), 5);
    let small = net.transfer(1, 3, 200_000);
    let big = net.transfer(1, 3, 8 << 20);
    let limit = Instant::ZERO + secs(120.0);
    net.run_until(limit, |n| n.apps[big].received.len() >= 1 << 20);
    assert!(
        net.apps[big].received.len() >= 1 << 20,
        "no block delivered"
    );
    assert!(net.apps[big].delivered_at.is_none());
    let (now, flow) = (net.now, net.apps[big].flow);
    net.nodes.get_mut(&1).unwrap().abort(now, flow).unwrap();
    net.apps[big].finished_sending = true;
    let limit = net.now + secs(10.0);
    net.run_until(limit, |n| n.apps[big].abandoned_at.is_some());
    assert!(net.apps[big].abandoned_at.is_some(), "not abandoned");
    assert!(net.apps[small].delivered_at.is_some());
    assert!(net.apps[small].abandoned_at.is_none());
    assert_eq!(net.stats(3).extra.get("flows_abandoned"), Some(&1));
    // The relay held no destination state: nothing abandoned there.
    assert_eq!(net.stats(2).extra.get("flows_abandoned"), None);
}

/// An abort reaches a relay that was cut off when it was sent: the relay before the cut
/// repeats it until the one behind it hears it, so the block that relay held in custody is
/// freed and never delivered after the path heals (docs/design/hop.md#aborts-along-the-path).
#[test]
fn an_abort_reaches_a_relay_that_was_cut_off_and_its_custody_is_never_delivered() {
    let mut net = Net::chain(4, LinkSpec::default(), HopConfig::default(), 7);
    net.set_link_up(3, 4, false);
    let app = net.transfer(1, 4, 300_000);
    let limit = Instant::ZERO + secs(60.0);
    net.run_until(limit, |n| n.stats(3).cache_bytes >= 300_000);
    assert!(
        net.stats(3).cache_bytes >= 300_000,
        "the block never reached node 3"
    );
    net.set_link_up(2, 3, false);
    let (now, flow) = (net.now, net.apps[app].flow);
    net.nodes.get_mut(&1).unwrap().abort(now, flow).unwrap();
    net.apps[app].finished_sending = true;
    let limit = net.now + secs(20.0);
    net.run_until(limit, |_| false);
    assert_eq!(
        net.stats(3).flows,
        1,
        "node 3 heard the abort through a cut link"
    );
    net.set_link_up(2, 3, true);
    net.set_link_up(3, 4, true);
    let limit = net.now + secs(120.0);
    net.run_until(limit, |_| false);
    assert!(
        net.apps[app].delivered_at.is_none(),
        "an aborted flow was delivered"
    );
    assert!(net.apps[app].received.is_empty());
    let relay = net.stats(3);
    assert_eq!((relay.flows, relay.cache_bytes), (0, 0));
    assert!(net.stats(2).extra.get("abort_sent").copied().unwrap_or(0) >= 2);
    // Every notice ended once its next hop heard it: nothing is sent any more.
    let sent = |n: &Net| {
        (1..=4)
            .map(|i| n.stats(i).sent_by_type.values().sum::<u64>())
            .sum::<u64>()
    };
    let before = sent(&net);
    let limit = net.now + secs(30.0);
    net.run_until(limit, |_| false);
    assert_eq!(
        sent(&net),
        before,
        "aborts still repeated after they were heard"
    );
}

/// A source that restarted (and lost its state) aborts a flow of its earlier run: the relay
/// holding that flow's block in custody frees it, and the destination never gets it.
#[test]
fn a_restarted_source_aborts_a_flow_of_its_earlier_run_along_the_path() {
    let mut net = Net::chain(4, LinkSpec::default(), HopConfig::default(), 9);
    net.set_link_up(3, 4, false);
    let app = net.transfer(1, 4, 300_000);
    let limit = Instant::ZERO + secs(60.0);
    net.run_until(limit, |n| n.stats(3).cache_bytes >= 300_000);
    assert!(
        net.stats(3).cache_bytes >= 300_000,
        "the block never reached node 3"
    );
    net.crash(1);
    net.apps[app].finished_sending = true;
    let up = net.now + secs(1.0);
    net.run_until(up, |_| false);
    net.restart(1);
    let (now, flow) = (net.now, net.apps[app].flow);
    net.nodes
        .get_mut(&1)
        .unwrap()
        .abort_earlier(now, hop_proto::TransportId::Hop, flow, 4)
        .unwrap();
    let limit = net.now + secs(20.0);
    net.run_until(limit, |_| false);
    assert_eq!(net.stats(3).flows, 0, "the relay still holds the flow");
    assert_eq!(net.stats(3).cache_bytes, 0);
    net.set_link_up(3, 4, true);
    let limit = net.now + secs(60.0);
    net.run_until(limit, |_| false);
    assert!(net.apps[app].delivered_at.is_none());
    assert!(net.apps[app].received.is_empty());
}

/// A destination flow whose source went silent is reclaimed once the source would have given
/// up (its idle time and the source's give-up time both past), and the runtime is told.
#[test]
fn a_flow_whose_source_vanished_is_abandoned_after_the_idle_time() {
    let cfg = HopConfig {
        flow_idle_timeout: secs(5.0),
        give_up_after: secs(5.0),
        ..HopConfig::default()
    };
    let mut net = Net::chain(2, LinkSpec::default(), cfg, 6);
    let big = net.transfer(1, 2, 8 << 20);
    let limit = Instant::ZERO + secs(120.0);
    net.run_until(limit, |n| n.apps[big].received.len() >= 1 << 20);
    net.crash(1);
    let limit = net.now + secs(30.0);
    net.run_until(limit, |n| n.apps[big].abandoned_at.is_some());
    assert!(net.apps[big].abandoned_at.is_some(), "not abandoned");
    assert!(net.apps[big].delivered_at.is_none());
}

/// A flow starved at its destination for longer than the idle time (here a relay cut off for
/// 20 s; in the lab, busy relays) is slow, not dead: the destination keeps it while its
/// source may still be trying, and the rest of the transfer is delivered after the first block.
#[test]
fn a_flow_starved_longer_than_the_idle_time_still_completes() {
    let cfg = HopConfig {
        flow_idle_timeout: secs(5.0),
        ..HopConfig::default()
    };
    let mut net = Net::chain(3, LinkSpec::default(), cfg, 7);
    let app = net.transfer(1, 3, SIZE);
    let limit = Instant::ZERO + secs(120.0);
    net.run_until(limit, |n| !n.apps[app].received.is_empty());
    assert!(!net.apps[app].received.is_empty(), "no block delivered");
    net.set_link_up(2, 3, false);
    let up = net.now + secs(20.0);
    net.run_until(up, |_| false);
    net.set_link_up(2, 3, true);
    net.run_to_completion(secs(300.0));
    net.assert_all_identical();
    assert!(net.apps[app].abandoned_at.is_none());
    assert_eq!(net.stats(3).extra.get("flows_abandoned"), None);
}

/// Once a destination has given a flow up, a late block of it is refused: opening the flow
/// again would expect block 0, which the source released long ago, and hold every later
/// block without delivering it.
#[test]
fn a_flow_given_up_at_its_destination_is_not_opened_again() {
    let mut net = Net::chain(3, LinkSpec::default(), HopConfig::default(), 8);
    // Only the destination gives up quickly; the source and the relay keep trying.
    net.cfgs.insert(
        3,
        HopConfig {
            flow_idle_timeout: secs(5.0),
            give_up_after: secs(5.0),
            ..HopConfig::default()
        },
    );
    net.restart(3);
    let app = net.transfer(1, 3, SIZE);
    let limit = Instant::ZERO + secs(120.0);
    net.run_until(limit, |n| !n.apps[app].received.is_empty());
    let got = net.apps[app].received.len();
    assert!(got > 0, "no block delivered");
    net.set_link_up(2, 3, false);
    let limit = net.now + secs(30.0);
    net.run_until(limit, |n| n.apps[app].abandoned_at.is_some());
    assert!(net.apps[app].abandoned_at.is_some(), "not abandoned");
    net.set_link_up(2, 3, true);
    let limit = net.now + secs(30.0);
    net.run_until(limit, |_| false);
    let dest = net.stats(3);
    assert!(
        dest.extra.get("closed_flow_refused").copied().unwrap_or(0) > 0,
        "the relay never offered the next block"
    );
    assert_eq!(dest.flows, 0, "the flow was opened again");
    assert_eq!(net.apps[app].received.len(), got);
}
