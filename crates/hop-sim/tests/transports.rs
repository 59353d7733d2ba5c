//! Every registered transport runs through the simulator and delivers identical bytes.

use hop_sim::{Registry, Scenario, Simulation};

fn one_hop(transport: &str, medium: &str) -> String {
    format!(
        r#"
seed = 3
duration = 120.0
[medium]
kind = "{medium}"
[topology]
nodes = 3
generator = "chain"
loss = 0.05
[[flows]]
src = 0
dst = 2
size = "300KB"
transport = "{transport}"
"#
    )
}

#[test]
fn every_registered_transport_completes_two_hops() {
    let names = Registry::builtin().names();
    for required in ["hop", "hxh", "atp", "atp-aggressive", "atp-adaptive", "tcp"] {
        assert!(
            names.iter().any(|n| n == required),
            "{required} not registered"
        );
    }
    for name in &names {
        for medium in ["p2p", "shared"] {
            let sc = Scenario::from_toml(&one_hop(name, medium)).unwrap();
            let r = Simulation::new(sc, Registry::builtin()).unwrap().run();
            let f = &r.flows[0];
            assert!(f.completed && f.identical, "{name} over {medium}: {f:?}");
            assert!(r.nodes[1].datagrams_sent > 0, "{name}: relay idle");
        }
    }
}

#[test]
fn transport_overrides_are_checked() {
    for (name, table) in [
        (
            "hop",
            "backpressure = false\nbackpressure_limit = 100\nvtx_initial_timeout = \"2.5s\"",
        ),
        ("hxh", "buffer_packets = 20"),
        ("atp-adaptive", "epoch = 0.05"),
    ] {
        let text = format!("{}\n[transports.{name}]\n{table}\n", one_hop(name, "p2p"));
        let sc = Scenario::from_toml(&text).unwrap();
        assert!(Simulation::new(sc, Registry::builtin()).is_ok(), "{name}");
        let bad = format!(
            "{}\n[transports.{name}]\nno_such_field = 1\n",
            one_hop(name, "p2p")
        );
        let sc = Scenario::from_toml(&bad).unwrap();
        let e = Simulation::new(sc, Registry::builtin())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("no_such_field"), "{e}");
    }
    let wrong_type = format!(
        "{}\n[transports.hop]\nbackpressure = 3\n",
        one_hop("hop", "p2p")
    );
    let sc = Scenario::from_toml(&wrong_type).unwrap();
    let e = Simulation::new(sc, Registry::builtin())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("backpressure"), "{e}");
}

#[test]
fn two_atp_variants_cannot_share_a_scenario() {
    let text = format!(
        "{}\n[[flows]]\nsrc = 2\ndst = 0\nsize = 10\ntransport = \"atp-adaptive\"\n",
        one_hop("atp", "p2p")
    );
    let sc = Scenario::from_toml(&text).unwrap();
    let e = Simulation::new(sc, Registry::builtin())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("wire id"), "{e}");
}
