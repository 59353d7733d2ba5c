//! The TCP-like baseline on the simulated 802.11b medium: the goodput a single flow gets over
//! a lossless line of one and of three hops (every node senses every other, so there are no
//! hidden terminals), and Hop and tcp side by side in one `compare` run. Run with
//! `--nocapture` to see the measured goodputs.

use hop_sim::compare::{compare, Variant};
use hop_sim::{Registry, Scenario, SimResult, Simulation};

/// Nodes 200 m apart on a line, radio range 250 m (neighbours only), carrier sense 1000 m
/// (everyone), no loss; one 2 MB flow from the first node to the last.
fn line(nodes: u32, transport: &str) -> String {
    let mut s = String::from(
        "seed = 1\nduration = 60.0\n[topology]\ngenerator = \"none\"\nrange_m = 250.0\n\
         carrier_sense_range_m = 1000.0\nloss_free_fraction = 1.0\n",
    );
    for i in 0..nodes {
        s.push_str(&format!(
            "[[topology.nodes]]\nid = {i}\nx = {}.0\ny = 0.0\n",
            i * 200
        ));
    }
    s.push_str(&format!(
        "[[flows]]\nsrc = 0\ndst = {}\nsize = \"2MB\"\ntransport = \"{transport}\"\n",
        nodes - 1
    ));
    s
}

fn run(text: &str) -> SimResult {
    let sc = Scenario::from_toml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    Simulation::new(sc, Registry::builtin()).unwrap().run()
}

#[test]
fn tcp_goodput_over_one_and_three_lossless_hops() {
    let mut goodput = Vec::new();
    for nodes in [2, 4] {
        let r = run(&line(nodes, "tcp"));
        let f = &r.flows[0];
        assert!(f.completed && f.identical, "{f:?}");
        assert_eq!(f.bytes_delivered, 2_000_000);
        assert_eq!(f.hops, Some(nodes - 1));
        // Only the source sends segments; nothing is lost on a lossless line with
        // everyone in carrier sense (collisions of equal backoffs are retried by the MAC).
        assert_eq!(r.efficiency.data_retransmissions, 0, "{:?}", r.efficiency);
        assert_eq!(r.medium.link_drops, 0);
        // Every frame is unicast with a link-layer ACK, and all of its air is data air.
        assert!(r.medium.acks_sent > r.medium.frames_sent / 2);
        for n in &r.nodes {
            assert_eq!(n.mac.control_frames, 0);
            assert_eq!(n.mac.data_airtime_ns, n.mac.airtime_ns);
        }
        println!(
            "tcp over {} hop(s): {:.3} Mbit/s",
            nodes - 1,
            f.goodput_bps / 1e6
        );
        goodput.push(f.goodput_bps);
    }
    // 802.11b at 11 Mb/s with the long preamble: one-hop TCP gets 4-6 Mbit/s; three hops
    // that share one collision domain get about a third of it.
    assert!((4.0e6..6.0e6).contains(&goodput[0]), "{goodput:?}");
    let ratio = goodput[1] / goodput[0];
    assert!((0.25..0.45).contains(&ratio), "3-hop / 1-hop = {ratio}");
}

#[test]
fn compare_runs_hop_and_tcp_side_by_side() {
    let text = line(4, "hop");
    let variants = [Variant::baseline(), Variant::transport("tcp")];
    let out = compare(&text, &[1], &variants, 1).unwrap();
    assert_eq!(out.len(), 2);
    for v in &out {
        assert_eq!(v.runs[0].delivered_bytes, 2_000_000, "{}", v.variant.name);
    }
    // The tcp variant really ran tcp: its result differs from Hop's.
    assert_ne!(
        out[0].runs[0].mean_goodput_bps,
        out[1].runs[0].mean_goodput_bps
    );
    let tcp_alone = run(&line(4, "tcp"));
    assert_eq!(
        out[1].runs[0].mean_goodput_bps,
        tcp_alone.flows[0].goodput_bps
    );
    let t = hop_sim::compare::table("line", &[1], &out);
    assert!(
        t.contains("transport=tcp") && t.contains("1st/this mean"),
        "{t}"
    );
}
