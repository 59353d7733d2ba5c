//! What the result says about completion, the state left on the nodes, and the air spent per
//! delivered byte and hop.

use hop_sim::{Registry, Scenario, SimResult, Simulation};

fn run(text: &str) -> SimResult {
    let sc = Scenario::from_toml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    Simulation::new(sc, Registry::builtin()).unwrap().run()
}

fn one_hop(transport: &str, events: &str) -> String {
    format!(
        r#"
duration = 20.0
[topology]
nodes = 2
generator = "chain"
[[flows]]
src = 0
dst = 1
size = "20KB"
transport = "{transport}"
{events}
"#
    )
}

#[test]
fn a_flow_whose_source_never_learns_of_delivery_is_not_completed() {
    for transport in ["hop", "hxh", "atp"] {
        let clean = run(&one_hop(transport, ""));
        let f = &clean.flows[0];
        assert!(f.completed && f.identical, "{transport}: {f:?}");
        let (delivered, learned) = (f.completion_time.unwrap(), f.send_complete_time.unwrap());
        assert!(delivered < learned, "{transport}: {f:?}");
        assert_eq!(
            clean.flows_at_end, clean.nodes[1].flows_at_end,
            "the source let go"
        );
        // The same run, but from just after the destination had every byte on, nothing it
        // sends reaches the source.
        let cut = format!(
            "[[events]]\nat = {}\nkind = \"set_loss\"\na = 0\nb = 1\nloss_ba = 1.0\n",
            delivered + 1e-6
        );
        let r = run(&one_hop(transport, &cut));
        let f = &r.flows[0];
        assert!(
            f.identical && f.bytes_delivered == 20_000,
            "{transport}: {f:?}"
        );
        assert_eq!(f.completion_time, Some(delivered), "{transport}");
        assert!(
            !f.completed && f.send_complete_time.is_none(),
            "{transport}: {f:?}"
        );
        assert!(!r.all_flows_completed);
        if f.failed.is_none() {
            // Still trying: the source holds the flow at the end.
            assert_eq!(r.stop_reason, "duration");
            assert!(
                r.nodes[0].flows_at_end >= 1,
                "{transport}: {:?}",
                r.nodes[0]
            );
            assert!(r.flows_at_end >= 1);
        }
    }
}

#[test]
fn completed_flows_report_hops_and_air_per_delivered_byte_hop() {
    let r = run(r#"
[topology]
nodes = 4
generator = "chain"
[[flows]]
src = 0
dst = 3
size = "300KB"
[[flows]]
src = 2
dst = 1
size = "100KB"
"#);
    assert!(r.all_flows_completed, "{:?}", r.flows);
    assert_eq!((r.flows[0].hops, r.flows[1].hops), (Some(3), Some(1)));
    let e = &r.efficiency;
    assert_eq!(e.delivered_byte_hops, 300_000 * 3 + 100_000);
    assert_eq!(e.data_airtime_ns, r.medium.data_airtime_ns);
    let per_node: u64 = r.nodes.iter().map(|n| n.mac.data_airtime_ns).sum();
    assert_eq!(per_node, e.data_airtime_ns);
    assert!(e.data_airtime_ns > 0 && e.data_airtime_ns < r.medium.airtime_ns);
    // At 11 Mb/s a byte takes 727 ns of air; headers and preambles only add to it.
    let per = e.data_air_ns_per_byte_hop.unwrap();
    assert!((727.0..2000.0).contains(&per), "{per}");
    assert_eq!(
        e.data_packets_sent,
        r.nodes
            .iter()
            .map(|n| n.sent_by_type.get("data").copied().unwrap_or(0))
            .sum::<u64>()
    );
    let share = e.data_resend_share.unwrap();
    assert!((0.0..0.5).contains(&share), "{share}");
    // Flows 3 and 1 hops long with equal goodputs would give 1.0; the index weighs them.
    let hw = r.hop_weighted_jain_fairness.unwrap();
    assert!(hw > 0.0 && hw <= 1.0);
    assert!(r.nodes.iter().all(|n| n.position.is_none()));
}

#[test]
fn positions_are_reported_with_the_radio_model() {
    let r = run(r#"
[topology]
nodes = 8
generator = "random"
width_m = 300.0
height_m = 300.0
range_m = 150.0
[[flow_sets]]
count = 2
size = "10KB"
"#);
    assert_eq!(r.flows.len(), 2);
    assert!(r.flows.iter().all(|f| f.hops.is_some_and(|h| h >= 1)));
    for n in &r.nodes {
        let [x, y] = n.position.expect("placed");
        assert!((0.0..=300.0).contains(&x) && (0.0..=300.0).contains(&y));
    }
}

/// `first_delivery_time` and `longest_stall`: a flow on a clean hop starts at once and never
/// stalls; the same flow behind a link cut for 8 s from its start waits those 8 s for its
/// first byte; one that never gets a byte stalls from its start to the end of the run.
#[test]
fn first_byte_and_longest_stall_say_when_a_flow_waited() {
    let clean = run(&one_hop("hop", ""));
    let f = &clean.flows[0];
    let first = f.first_delivery_time.expect("a byte arrived");
    assert!(first > 0.0 && first <= f.completion_time.unwrap(), "{f:?}");
    assert!(
        f.longest_stall.unwrap() <= f.completion_time.unwrap(),
        "{f:?}"
    );

    let cut = "[[events]]\nat = 0.0\nkind = \"set_loss\"\na = 0\nb = 1\nloss_ab = 1.0\nloss_ba = 1.0\n\
               [[events]]\nat = 8.0\nkind = \"set_loss\"\na = 0\nb = 1\nloss_ab = 0.0\nloss_ba = 0.0\n";
    let r = run(&one_hop("hop", cut));
    let f = &r.flows[0];
    assert!(f.identical, "{f:?}");
    let first = f.first_delivery_time.unwrap();
    assert!(first >= 8.0, "{f:?}");
    assert!(f.longest_stall.unwrap() >= 8.0, "{f:?}");

    let never =
        "[[events]]\nat = 0.0\nkind = \"set_loss\"\na = 0\nb = 1\nloss_ab = 1.0\nloss_ba = 1.0\n";
    let r = run(&one_hop("hop", never));
    let f = &r.flows[0];
    assert_eq!(
        (f.bytes_delivered, f.first_delivery_time),
        (0, None),
        "{f:?}"
    );
    assert!(
        (f.longest_stall.unwrap() - (r.virtual_seconds - f.start)).abs() < 1e-9,
        "{f:?}"
    );
}

/// `losses_at_next_hop`: two senders 400 m apart with a receiver between them (range 250 m)
/// are hidden from each other, and what they lose at the receiver is counted as hidden (a
/// waiting sender's BSYNs against the served sender's data); with
/// carrier sense out to 450 m they hear each other and no loss is.
#[test]
fn losses_at_the_next_hop_say_which_were_hidden() {
    let mesh = |sense: f64| {
        format!(
            r#"
duration = 20.0
[medium]
data_broadcast = true
[topology]
generator = "none"
range_m = 250.0
carrier_sense_range_m = {sense}
loss_free_fraction = 1.0
[[topology.nodes]]
id = 0
x = 0.0
y = 0.0
[[topology.nodes]]
id = 1
x = 200.0
y = 0.0
[[topology.nodes]]
id = 2
x = 400.0
y = 0.0
[[flows]]
src = 0
dst = 1
size = "2MB"
[[flows]]
src = 2
dst = 1
size = "2MB"
"#
        )
    };
    let hidden = run(&mesh(250.0));
    let l = &hidden.medium.losses_at_next_hop;
    let of = |l: &std::collections::BTreeMap<String, u64>, tag: &str| -> u64 {
        l.iter()
            .filter(|(k, _)| k.ends_with(tag))
            .map(|(_, v)| v)
            .sum()
    };
    assert!(of(l, "(hidden)") > 0, "{l:?}");
    // Ack withholding keeps the two senders' data apart (one block at a time at the
    // receiver, §3.5); what collides is the waiting sender's BSYN with the served one's data.
    assert!(
        l.get("bsyn by data (hidden)").is_some_and(|&n| n > 0),
        "{l:?}"
    );
    assert!(
        l.get("data by bsyn (hidden)").is_some_and(|&n| n > 0),
        "{l:?}"
    );
    let sensed = run(&mesh(450.0));
    let l = &sensed.medium.losses_at_next_hop;
    assert_eq!(of(l, "(hidden)"), 0, "{l:?}");
}

/// A flow's route is the path of the tables the run starts with, source to destination, and
/// its `hops` that path's length; a flow with no route has neither.
#[test]
fn a_flows_route_names_its_nodes() {
    let flow = |topology: &str, src: u32, dst: u32| {
        let text = format!(
            "duration = 5.0\n[topology]\n{topology}\n[[flows]]\nsrc = {src}\ndst = {dst}\nsize = \"2KB\"\n"
        );
        run(&text).flows[0].clone()
    };
    let f = flow("nodes = 5\ngenerator = \"chain\"", 4, 1);
    assert_eq!(f.route.as_deref(), Some(&[4, 3, 2, 1][..]));
    assert_eq!(f.hops, Some(3));
    // Node 2 has no link: no route to it.
    let f = flow("nodes = 3\n[[topology.links]]\na = 0\nb = 1", 0, 2);
    assert_eq!((f.route.as_ref(), f.hops), (None, None));
}
