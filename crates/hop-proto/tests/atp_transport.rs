//! ATP (default, aggressive, adaptive) end to end over the test network: loss, multi-hop,
//! several flows at a bottleneck, pacing and state reclamation.

#[path = "hxh_harness/mod.rs"]
mod harness;

use std::time::Duration;

use harness::{assert_all_delivered, jain, pattern, secs, Net};
use hop_proto::atp::{AtpConfig, AtpTransport, AtpVariant};
use hop_proto::{NodeId, Transport, TransportId};

const VARIANTS: [AtpVariant; 3] = [
    AtpVariant::Default,
    AtpVariant::Aggressive,
    AtpVariant::Adaptive,
];

fn maker(v: AtpVariant) -> impl Fn() -> Box<dyn Transport> {
    move || Box::new(AtpTransport::new(AtpConfig::for_variant(v))) as Box<dyn Transport>
}

fn run_to_completion(net: &mut Net, limit: f64) {
    net.run_until(secs(limit), |n| n.all_done());
    assert!(net.all_done(), "not finished by {limit} s at {:?}", net.now);
    // Receivers drop state on completion, senders on SendComplete, relays hold none.
    assert_eq!(net.flows_with_state(), 0, "flow state left behind");
}

#[test]
fn single_hop_with_loss_all_variants() {
    for v in VARIANTS {
        let make = maker(v);
        let mut net = Net::chain(11, 2, TransportId::Atp, &make);
        net.default_link.loss = 0.1;
        net.start_flow(secs(0.0), 0, 1, pattern(200_000, 1));
        run_to_completion(&mut net, 120.0);
        assert_all_delivered(&net);
        assert!(net.lost > 0);
        let s = net.nodes[&0].stats().transports[0].1.clone();
        assert!(
            s.data_retransmissions > 0,
            "{v:?}: losses but no retransmission"
        );
    }
}

#[test]
fn multi_hop_chain_all_variants() {
    for v in VARIANTS {
        let make = maker(v);
        let mut net = Net::chain(12, 5, TransportId::Atp, &make);
        net.shared_medium = true;
        net.default_link.loss = 0.03;
        net.start_flow(secs(0.0), 0, 4, pattern(300_000, 2));
        run_to_completion(&mut net, 200.0);
        assert_all_delivered(&net);
        let hops = net.nodes[&4].stats().transports[0].1.clone();
        assert!(hops.received_by_type.get("data").copied().unwrap_or(0) > 0);
        let (t, _) = net.flows.values().next().unwrap().flow_finished.unwrap();
        eprintln!(
            "atp {v:?} 4-hop shared medium 300 kB in {:.2} s",
            t.as_secs_f64()
        );
    }
}

#[test]
fn bottleneck_with_several_flows() {
    for v in VARIANTS {
        let make = maker(v);
        // Three sources 10, 11, 12 -> 1 -> 2 -> 3 -> receivers 20, 21, 22.
        let srcs: Vec<NodeId> = vec![10, 11, 12];
        let dsts: Vec<NodeId> = vec![20, 21, 22];
        let mut routes: Vec<(NodeId, Vec<(NodeId, NodeId)>)> = Vec::new();
        for i in 0..3 {
            routes.push((srcs[i], vec![(dsts[i], 1)]));
            routes.push((dsts[i], vec![(srcs[i], 3)]));
        }
        for x in 1..=3u32 {
            let mut t = Vec::new();
            for i in 0..3 {
                t.push((srcs[i], if x == 1 { srcs[i] } else { x - 1 }));
                t.push((dsts[i], if x == 3 { dsts[i] } else { x + 1 }));
            }
            routes.push((x, t));
        }
        let mut net = Net::new(13, TransportId::Atp, &make, &routes);
        for i in 0..3 {
            net.start_flow(secs(0.0), srcs[i], dsts[i], pattern(2_000_000, i as u8));
        }
        net.run_until(secs(8.0), |_| false);
        let keys: Vec<_> = net.flows.keys().copied().collect();
        let tput: Vec<f64> = keys
            .iter()
            .map(|&k| net.delivered_between(k, secs(3.0), secs(8.0)) as f64 * 8.0 / 5.0 / 1e6)
            .collect();
        eprintln!(
            "atp {v:?} 3 flows at one bottleneck Mbit/s {tput:?} total {:.2} jain {:.3}",
            tput.iter().sum::<f64>(),
            jain(&tput)
        );
        assert!(
            tput.iter().all(|&t| t > 0.0),
            "{v:?}: a flow starved {tput:?}"
        );
        run_to_completion(&mut net, 300.0);
        assert_all_delivered(&net);
    }
}

#[test]
fn empty_and_tiny_flows() {
    let make = maker(AtpVariant::Adaptive);
    let mut net = Net::chain(14, 3, TransportId::Atp, &make);
    net.start_flow(secs(0.0), 0, 2, pattern(0, 0));
    net.start_flow(secs(0.0), 0, 2, pattern(1, 0));
    net.start_flow(secs(0.0), 2, 0, pattern(1001, 9));
    run_to_completion(&mut net, 20.0);
    assert_all_delivered(&net);
}

#[test]
fn same_seed_same_run() {
    let run = || {
        let make = maker(AtpVariant::Adaptive);
        let mut net = Net::chain(15, 4, TransportId::Atp, &make);
        net.default_link.loss = 0.05;
        net.start_flow(secs(0.0), 0, 3, pattern(50_000, 1));
        net.run_until(secs(60.0), |n| n.all_done());
        (net.now, net.sent_by_class.clone())
    };
    assert_eq!(run(), run());
}

#[test]
fn source_without_route_fails() {
    let make_short = || {
        Box::new(AtpTransport::new(AtpConfig {
            give_up: Duration::from_secs(3),
            ..AtpConfig::for_variant(AtpVariant::Adaptive)
        })) as Box<dyn Transport>
    };
    let mut net = Net::new(
        23,
        TransportId::Atp,
        &make_short,
        &[(0, vec![(1, 1)]), (1, vec![(0, 0)])],
    );
    net.start_flow(secs(0.0), 0, 7, pattern(5_000, 1));
    net.run_until(secs(10.0), |_| false);
    assert!(net.flows.values().next().unwrap().send_failed);
    assert_eq!(net.flows_with_state(), 0);
}

#[test]
fn a_receiver_that_gave_up_never_reopens_the_flow() {
    // The receiver (node 2) abandons the flow after 2 s without data; the link to it is cut
    // from 1 s to 6 s. When packets arrive again they must not open the flow a second time,
    // and the sender, no longer hearing feedback, fails.
    let count = std::cell::Cell::new(0u32);
    let make = || {
        count.set(count.get() + 1);
        let give_up = if count.get() == 3 { 2 } else { 20 };
        Box::new(AtpTransport::new(AtpConfig {
            give_up: Duration::from_secs(give_up),
            ..AtpConfig::for_variant(AtpVariant::Aggressive)
        })) as Box<dyn Transport>
    };
    let mut net = Net::chain(24, 3, TransportId::Atp, &make);
    net.drop_filter = Some(Box::new(|now, _, to, _| {
        to == 2 && now >= secs(1.0) && now < secs(6.0)
    }));
    net.start_flow(secs(0.0), 0, 2, pattern(3_000_000, 4));
    net.run_until(secs(60.0), |_| false);
    let r = net.flows.values().next().unwrap();
    assert_eq!(r.opened, 1, "flow opened twice");
    assert!(!r.out_of_order);
    assert!(r.received.len() < r.payload.len());
    assert!(r.received[..] == r.payload[..r.received.len()]);
    assert!(r.flow_finished.is_none());
    assert!(r.flow_abandoned.is_some(), "the application was not told");
    assert!(r.send_failed, "the sender never gave up");
    assert!(net.extra(2, "abandoned_drops") > 0);
    assert_eq!(net.flows_with_state(), 0);
}

/// A packet leaves the source's send buffer only when feedback acknowledges it, once per
/// epoch (E = 1 s for the default variant). A fixed 256 KiB buffer therefore capped default
/// ATP at 256 KiB per second (2.1 Mbit/s) on any path; the buffer now grows with the rate.
#[test]
fn default_atp_is_not_capped_by_its_send_buffer() {
    let payload = pattern(4_000_000, 9);
    let run = |cfg: AtpConfig| {
        let make = move || Box::new(AtpTransport::new(cfg.clone())) as Box<dyn Transport>;
        let mut net = Net::chain(31, 2, TransportId::Atp, &make);
        net.start_flow(secs(0.0), 0, 1, payload.clone());
        run_to_completion(&mut net, 120.0);
        assert_all_delivered(&net);
        let (t, bytes) = net.flows.values().next().unwrap().flow_finished.unwrap();
        bytes as f64 * 8.0 / t.as_secs_f64()
    };
    let growing = run(AtpConfig::for_variant(AtpVariant::Default));
    let fixed_cfg = AtpConfig {
        send_buffer_max_bytes: hop_proto::atp::config::SEND_BUFFER_BYTES,
        ..AtpConfig::for_variant(AtpVariant::Default)
    };
    let interval = fixed_cfg.epoch.as_secs_f64();
    let fixed = run(fixed_cfg);
    let cap = hop_proto::atp::config::SEND_BUFFER_BYTES as f64 * 8.0 / interval;
    eprintln!(
        "default ATP, one 11 Mbit/s hop, 4 MB: {:.2} Mbit/s with the growing buffer, {:.2} with a fixed 256 KiB (cap {:.2})",
        growing / 1e6,
        fixed / 1e6,
        cap / 1e6
    );
    assert!(fixed <= cap * 1.05, "the fixed buffer should cap the rate");
    assert!(
        growing > 2.0 * cap,
        "the growing buffer still caps the rate"
    );
}

/// A source whose every packet was lost learns nothing from SACK blocks: its receiver holds
/// no state and its epoch feedback never comes. The quick-start probe after three missed
/// feedbacks is answered by the receiver, which now marks the answer SACK-MORE (nothing
/// arrived), so the source resends what is unacknowledged. An empty flow's lone FIN packet
/// lost once used to leave the flow unfinished until the source gave up.
#[test]
fn a_flow_whose_every_packet_was_lost_is_resent_after_the_probe() {
    for v in VARIANTS {
        for len in [0usize, 3000] {
            let make = maker(v);
            let mut net = Net::chain(31, 3, TransportId::Atp, &make);
            // Every non-probe data packet the source sends in its first second is lost.
            net.drop_filter = Some(Box::new(|now, from, _, bytes| {
                let Ok(env) = hop_wire::Envelope::parse(bytes) else {
                    return false;
                };
                let data = matches!(
                    hop_wire::atp::parse(env.body),
                    Ok(hop_wire::atp::Message::Data(d)) if !d.is_probe()
                );
                from == 0 && data && now < secs(1.0)
            }));
            net.start_flow(secs(0.0), 0, 2, pattern(len, 5));
            run_to_completion(&mut net, 60.0);
            assert_all_delivered(&net);
        }
    }
}
