//! HxH end to end over the test network: loss, multi-hop, the 4-flow dumbbell (HxH paper
//! §4.1) and the reverse-ACK sync path (§3.3.1).

#[path = "hxh_harness/mod.rs"]
mod harness;

use std::time::Duration;

use harness::{assert_all_delivered, jain, pattern, secs, LinkCfg, Net};
use hop_proto::hxh::{HxhConfig, HxhTransport};
use hop_proto::{NodeId, Transport, TransportId};

fn make() -> Box<dyn Transport> {
    Box::new(HxhTransport::new(HxhConfig::default()))
}

fn run_to_completion(net: &mut Net, limit: f64) {
    net.run_until(secs(limit), |n| n.all_done());
    assert!(
        net.all_done(),
        "not finished by {limit} s: {:?}",
        summary(net)
    );
    // Let relay state time out (§3.1: two seconds) and check every node reclaimed it.
    let end = net.now + Duration::from_secs(3);
    net.run_until(end, |_| false);
    assert_eq!(net.flows_with_state(), 0, "flow state left behind");
}

fn summary(net: &Net) -> Vec<(usize, usize, bool, bool)> {
    net.flows
        .values()
        .map(|r| {
            (
                r.received.len(),
                r.payload.len(),
                r.flow_finished.is_some(),
                r.send_complete.is_some(),
            )
        })
        .collect()
}

#[test]
fn single_hop_with_loss() {
    let mut net = Net::chain(1, 2, TransportId::Hxh, &make);
    net.default_link.loss = 0.1;
    net.start_flow(secs(0.0), 0, 1, pattern(300_000, 1));
    run_to_completion(&mut net, 30.0);
    assert_all_delivered(&net);
    assert!(
        net.lost > 0,
        "the link lost nothing; the test is not exercising loss"
    );
}

#[test]
fn multi_hop_chain_with_loss() {
    let mut net = Net::chain(2, 6, TransportId::Hxh, &make);
    net.default_link.loss = 0.05;
    net.start_flow(secs(0.0), 0, 5, pattern(400_000, 2));
    net.start_flow(secs(0.2), 5, 0, pattern(100_000, 3));
    run_to_completion(&mut net, 60.0);
    assert_all_delivered(&net);
}

#[test]
fn empty_and_tiny_flows() {
    let mut net = Net::chain(3, 3, TransportId::Hxh, &make);
    net.start_flow(secs(0.0), 0, 2, pattern(0, 0));
    net.start_flow(secs(0.0), 0, 2, pattern(1, 0));
    net.start_flow(secs(0.0), 2, 0, pattern(1001, 9));
    run_to_completion(&mut net, 10.0);
    assert_all_delivered(&net);
}

/// Four sources feed a four-hop path (HxH paper Fig. 3), starting one second apart.
fn dumbbell(seed: u64, loss: f64) -> (Net, Vec<hop_proto::FlowKey>) {
    // Sources 10..13 -> 1 -> 2 -> 3 -> 4 -> 5 -> receivers 20..23.
    let sources: Vec<NodeId> = (10..14).collect();
    let sinks: Vec<NodeId> = (20..24).collect();
    let mut routes: Vec<(NodeId, Vec<(NodeId, NodeId)>)> = Vec::new();
    for (i, &s) in sources.iter().enumerate() {
        routes.push((s, vec![(sinks[i], 1)]));
    }
    for (i, &d) in sinks.iter().enumerate() {
        routes.push((d, vec![(sources[i], 5)]));
    }
    for x in 1..=5u32 {
        let mut t = Vec::new();
        for (i, &s) in sources.iter().enumerate() {
            t.push((s, if x == 1 { s } else { x - 1 }));
            t.push((sinks[i], if x == 5 { sinks[i] } else { x + 1 }));
        }
        routes.push((x, t));
    }
    let mut net = Net::new(seed, TransportId::Hxh, &make, &routes);
    net.default_link = LinkCfg {
        rate_bps: 11_000_000,
        delay: Duration::from_micros(50),
        loss,
    };
    for (i, &s) in sources.iter().enumerate() {
        net.start_flow(secs(i as f64), s, sinks[i], pattern(3_000_000, i as u8));
    }
    net.run_until(secs(3.0), |_| false);
    let keys = sources
        .iter()
        .map(|&s| {
            *net.flows
                .iter()
                .find(|(_, r)| r.src == s)
                .expect("flow started")
                .0
        })
        .collect();
    (net, keys)
}

#[test]
fn dumbbell_four_flows_share_the_bottleneck_fairly() {
    let (mut net, keys) = dumbbell(4, 0.02);
    // All four flows are active from t = 3 s; measure 3.5 s .. 6 s.
    net.run_until(secs(6.0), |_| false);
    let tput: Vec<f64> = keys
        .iter()
        .map(|&k| net.delivered_between(k, secs(3.5), secs(6.0)) as f64 * 8.0 / 2.5 / 1e6)
        .collect();
    let j = jain(&tput);
    eprintln!(
        "hxh dumbbell per-flow Mbit/s {tput:?} total {:.2} jain {j:.4}",
        tput.iter().sum::<f64>()
    );
    assert!(tput.iter().all(|&t| t > 0.0), "a flow starved: {tput:?}");
    assert!(j > 0.95, "Jain's index {j} for {tput:?}");
    // The bottleneck relay never holds more than its advertised buffer plus the reserve.
    let cfg = HxhConfig::default();
    let peak = net.nodes[&1].stats().transports[0].1.buffered_blocks_peak;
    assert!(
        peak <= u64::from(cfg.buffer_packets + cfg.reserve_packets),
        "peak {peak}"
    );
    // And everything still arrives intact.
    net.run_until(secs(120.0), |n| n.all_done());
    assert_all_delivered(&net);
}

/// Data packet (src, seq) decoded from an envelope, if it is HxH data.
fn data_seq(datagram: &[u8]) -> Option<(u32, u8)> {
    let env = hop_wire::Envelope::parse(datagram).ok()?;
    match hop_wire::hxh::parse(env.body).ok()? {
        hop_wire::hxh::Message::Data(d) => Some((d.seq, d.flags)),
        _ => None,
    }
}

#[test]
fn reverse_ack_sync_path_with_a_gap() {
    // 0 -> 1 -> 2 -> 3. Packet 20 never crosses 1 -> 2 until the source retransmits it end
    // to end, so the relay gives up on it, the last hop (2) sees a gap, sets the sync bit
    // and the destination answers; the destination NACKs 20 and the source resends it.
    let mut net = Net::chain(5, 4, TransportId::Hxh, &make);
    net.drop_filter = Some(Box::new(|_, from, to, bytes| {
        from == 1
            && to == 2
            && data_seq(bytes)
                .is_some_and(|(seq, flags)| seq == 20 && flags & hop_wire::hxh::DATA_RETX == 0)
    }));
    net.start_flow(secs(0.0), 0, 3, pattern(100_000, 7));
    run_to_completion(&mut net, 30.0);
    assert_all_delivered(&net);
    assert!(
        net.extra(1, "hop_drops") >= 1,
        "relay never gave up on the packet"
    );
    assert!(
        net.extra(2, "sync_requests") >= 1,
        "last hop never saw the gap"
    );
    assert!(
        net.extra(2, "sync_replies") >= 1,
        "destination never answered the sync bit"
    );
    assert!(
        net.extra(0, "e2e_retransmissions") >= 1,
        "source never retransmitted"
    );
    let src = net.nodes[&0].stats().transports[0].1.clone();
    assert!(src.received_by_type.get("nack").copied().unwrap_or(0) >= 1);
}

#[test]
fn same_seed_same_run() {
    let run = || {
        let mut net = Net::chain(9, 4, TransportId::Hxh, &make);
        net.default_link.loss = 0.05;
        net.start_flow(secs(0.0), 0, 3, pattern(50_000, 1));
        net.run_until(secs(20.0), |n| n.all_done());
        (net.now, net.sent_by_class.clone())
    };
    assert_eq!(run(), run());
}

#[test]
fn source_without_route_fails_and_aborted_flows_are_reclaimed() {
    let make_short = || {
        Box::new(HxhTransport::new(HxhConfig {
            give_up: Duration::from_secs(3),
            ..HxhConfig::default()
        })) as Box<dyn Transport>
    };
    // Node 0 has no route to 7.
    let mut net = Net::new(
        21,
        TransportId::Hxh,
        &make_short,
        &[(0, vec![(1, 1)]), (1, vec![(0, 0)])],
    );
    net.start_flow(secs(0.0), 0, 7, pattern(5_000, 1));
    net.run_until(secs(10.0), |_| false);
    let r = net.flows.values().next().unwrap();
    assert!(r.send_failed, "no SendFailed without a route");
    assert_eq!(net.flows_with_state(), 0);

    // A flow aborted mid-transfer leaves no state behind once relays time out (§3.1).
    let mut net = Net::chain(22, 4, TransportId::Hxh, &make);
    net.start_flow(secs(0.0), 0, 3, pattern(2_000_000, 2));
    net.run_until(secs(0.3), |_| false);
    let key = *net.flows.keys().next().unwrap();
    net.nodes.get_mut(&0).unwrap().abort(net.now, key).unwrap();
    net.flows.get_mut(&key).unwrap().send_failed = true;
    assert!(net.flows_with_state() > 0);
    // Relays expire after 2 s; the destination after `give_up`.
    let end = net.now + HxhConfig::default().give_up + Duration::from_secs(1);
    net.run_until(end, |_| false);
    assert_eq!(net.flows_with_state(), 0);
    // ... and the destination told its application (it can delete what it kept).
    assert!(net.flows[&key].flow_abandoned.is_some());
}

#[test]
fn four_hops_on_a_shared_medium() {
    // The same scenario as the ATP chain test: one channel for all nodes, 3 % loss.
    let mut net = Net::chain(12, 5, TransportId::Hxh, &make);
    net.shared_medium = true;
    net.default_link.loss = 0.03;
    net.start_flow(secs(0.0), 0, 4, pattern(300_000, 2));
    run_to_completion(&mut net, 200.0);
    assert_all_delivered(&net);
    let (t, _) = net.flows.values().next().unwrap().flow_finished.unwrap();
    eprintln!("hxh 4-hop shared medium 300 kB in {:.2} s", t.as_secs_f64());
}
