//! The medium, queues, crash semantics and determinism, checked with the test-only probe
//! transport (tests/common).

mod common;

use common::{json_without_wall, run};

fn one_hop(medium: &str, loss: f64, control: bool, size: &str, extra: &str) -> String {
    format!(
        r#"
seed = 3
duration = 60.0
[medium]
kind = "{medium}"
{extra}
[topology]
nodes = 2
generator = "chain"
loss = {loss}
[[flows]]
src = 0
dst = 1
size = "{size}"
transport = "probe"
[transports.probe]
control = {control}
"#
    )
}

#[test]
fn p2p_lossless_one_hop_delivers_identical_bytes_at_a_plausible_rate() {
    let r = run(&one_hop("p2p", 0.0, false, "200KB", ""));
    let f = &r.flows[0];
    assert!(f.completed && f.identical, "{f:?}");
    assert_eq!(f.bytes_delivered, 200_000);
    // 1000-byte chunks, 11 Mb/s, 192 µs preamble: never faster than the line rate, and the
    // pull model must keep the link busy (well above half of the per-frame limit).
    let frame_s = 192e-6 + (1021.0 + 16.0 + 4.0 + 56.0) * 8.0 / 11e6;
    let best = 1000.0 * 8.0 / frame_s;
    assert!(f.goodput_bps <= best * 1.001, "{} > {best}", f.goodput_bps);
    assert!(f.goodput_bps > best * 0.5, "{} << {best}", f.goodput_bps);
    assert_eq!(r.medium.collisions, 0);
    assert_eq!(r.schema_version, hop_sim::SCHEMA_VERSION);
}

#[test]
fn control_frames_are_retried_data_frames_are_not() {
    let ctl = run(&one_hop("shared", 0.1, true, "100KB", ""));
    assert!(
        ctl.flows[0].completed && ctl.flows[0].identical,
        "{:?}",
        ctl.flows[0]
    );
    assert!(ctl.medium.link_retries > 0);
    assert!(ctl.medium.acks_sent > 0);
    let data = run(&one_hop("shared", 0.1, false, "100KB", ""));
    assert_eq!(data.medium.link_retries, 0);
    assert_eq!(data.medium.acks_sent, 0);
    // Without retries, ~10% of chunks are lost and the in-order probe stalls. (Its source
    // completes once everything is sent: the probe has no end-to-end acknowledgement.)
    assert!(!data.flows[0].identical);
    assert!(data.medium.random_losses > 0);
}

#[test]
fn retry_limit_drops_control_frames() {
    let r = run(&one_hop("shared", 0.6, true, "50KB", "retry_limit = 1"));
    assert!(r.medium.link_drops > 0, "{:?}", r.medium);
    let r7 = run(&one_hop("shared", 0.6, true, "50KB", ""));
    assert!(r7.medium.link_drops < r.medium.link_drops);
}

#[test]
fn without_link_acks_a_frame_is_sent_and_forgotten() {
    // A wire or a veth (`link_acks = false`): no ACK follows a unicast frame and the sender
    // does not wait for one, so control frames go back to back as data frames do.
    let acked = run(&one_hop("p2p", 0.0, true, "200KB", "retry_limit = 0"));
    let wire = run(&one_hop(
        "p2p",
        0.0,
        true,
        "200KB",
        "retry_limit = 0\nacked_retry_limit = 0\nlink_acks = false",
    ));
    assert!(acked.flows[0].identical && wire.flows[0].identical);
    assert!(acked.medium.acks_sent > 0);
    assert_eq!(wire.medium.acks_sent, 0);
    assert_eq!(wire.medium.link_retries, 0);
    assert!(
        wire.flows[0].goodput_bps > acked.flows[0].goodput_bps * 1.1,
        "{} against {} with ACKs",
        wire.flows[0].goodput_bps,
        acked.flows[0].goodput_bps
    );
}

#[test]
fn same_seed_same_json_other_seed_differs() {
    let t = one_hop("shared", 0.2, true, "60KB", "");
    let a = run(&t);
    let b = run(&t);
    assert_eq!(json_without_wall(&a), json_without_wall(&b));
    let c = run(&t.replace("seed = 3", "seed = 4"));
    assert_ne!(json_without_wall(&a), json_without_wall(&c));
}

fn hidden(in_range: bool) -> String {
    let extra = if in_range {
        "[[topology.links]]\na = 0\nb = 2\n"
    } else {
        ""
    };
    format!(
        r#"
seed = 11
duration = 5.0
run_to_end = true
[topology]
nodes = 3
{extra}
[[topology.links]]
a = 0
b = 1
[[topology.links]]
a = 2
b = 1
[routing]
metric = "static"
[[routing.routes]]
node = 0
dst = 1
via = 1
[[routing.routes]]
node = 2
dst = 1
via = 1
[[flows]]
src = 0
dst = 1
size = "300KB"
transport = "probe"
[[flows]]
src = 2
dst = 1
size = "300KB"
transport = "probe"
"#
    )
}

#[test]
fn hidden_senders_collide_carrier_sense_avoids_it() {
    let h = run(&hidden(false));
    let v = run(&hidden(true));
    assert!(h.medium.collisions > 50, "hidden: {:?}", h.medium);
    assert!(
        v.medium.collisions * 10 < h.medium.collisions,
        "in range {} vs hidden {}",
        v.medium.collisions,
        h.medium.collisions
    );
}

#[test]
fn neighbours_overhear_and_relays_forward() {
    // Triangle, but 0 routes to 2 through 1: node 2 overhears 0's frames to 1.
    let t = r#"
duration = 10.0
[topology]
nodes = 3
generator = "chain"
[[topology.links]]
a = 0
b = 2
[routing]
metric = "static"
[[routing.paths]]
path = [0, 1, 2]
[[flows]]
src = 0
dst = 2
size = "20KB"
transport = "probe"
[transports.probe]
control = true
"#;
    let r = run(t);
    assert!(
        r.flows[0].completed && r.flows[0].identical,
        "{:?}",
        r.flows[0]
    );
    assert!(r.nodes[2].datagrams_overheard >= 20, "{:?}", r.nodes[2]);
    assert_eq!(
        r.nodes[2].extra.get("overheard").copied(),
        Some(r.nodes[2].datagrams_overheard)
    );
    assert!(r.nodes[1].datagrams_sent >= 20);
}

#[test]
fn p2p_has_no_overhearing() {
    let t = r#"
duration = 10.0
[medium]
kind = "p2p"
[topology]
nodes = 3
generator = "chain"
[[topology.links]]
a = 0
b = 2
[routing]
metric = "static"
[[routing.paths]]
path = [0, 1, 2]
[[flows]]
src = 0
dst = 2
size = "20KB"
transport = "probe"
"#;
    let r = run(t);
    assert!(r.flows[0].completed && r.flows[0].identical);
    assert_eq!(r.nodes[2].datagrams_overheard, 0);
}

fn chain_with_events(events: &str) -> String {
    format!(
        r#"
duration = 20.0
run_to_end = true
[medium]
kind = "p2p"
[topology]
nodes = 3
generator = "chain"
rate_mbps = 1.0
[[flows]]
src = 0
dst = 2
size = "500KB"
transport = "probe"
[transports.probe]
control = true
{events}
"#
    )
}

#[test]
fn crashed_node_neither_sends_nor_receives_and_restarts_empty() {
    let base = run(&chain_with_events(""));
    assert!(base.flows[0].completed && base.flows[0].identical);
    let r = run(&chain_with_events(
        "[[events]]\nat = 1.0\nkind = \"node_crash\"\nnode = 1\n",
    ));
    let f = &r.flows[0];
    assert!(!f.completed);
    assert!(
        f.bytes_delivered > 0 && f.bytes_delivered < 500_000,
        "{f:?}"
    );
    assert_eq!(r.nodes[1].crashes, 1);
    assert!(!r.nodes[1].alive);
    // Nothing reached node 1 after the crash: it relayed only what it had before.
    assert!(r.nodes[1].datagrams_sent < base.nodes[1].datagrams_sent / 2);
    // Restarted: a fresh node; the probe has no end-to-end recovery, so the stream stays cut
    // (the destination drops out-of-order chunks) but node 1 relays again.
    let rs = run(&chain_with_events(
        "[[events]]\nat = 1.0\nkind = \"node_crash\"\nnode = 1\n[[events]]\nat = 2.0\nkind = \"node_restart\"\nnode = 1\n",
    ));
    assert!(rs.nodes[1].alive);
    assert!(rs.nodes[1].datagrams_sent > r.nodes[1].datagrams_sent);
    assert!(!rs.flows[0].identical);
}

#[test]
fn link_down_pauses_and_link_up_resumes() {
    let r = run(&chain_with_events(
        "[[events]]\nat = 0.5\nkind = \"link_down\"\na = 1\nb = 2\n[[events]]\nat = 3.0\nkind = \"link_up\"\na = 1\nb = 2\n",
    ));
    // Control chunks to a dead link exhaust their retries and are dropped.
    assert!(r.medium.link_drops > 0);
    assert!(!r.flows[0].identical);
}

#[test]
fn repeated_events_and_set_loss() {
    let r = run(&chain_with_events(
        "[[events]]\nat = 0.2\nkind = \"set_loss\"\na = 0\nb = 1\nloss_ab = 0.3\n[[events]]\nat = 0.1\nevery = 0.1\ncount = 3\nkind = \"node_down\"\nnode = 2\n",
    ));
    assert!(r.medium.random_losses > 0);
    assert!(r.medium.link_retries > 0);
}

#[test]
fn bad_scenarios_give_one_line_errors() {
    let cases = [
        ("[topology]\nnodes = 2\nfoo = 1\n", "foo"),
        (
            "[topology]\nnodes = 2\n[[flows]]\nsrc = 0\ndst = 5\nsize = 10\n",
            "node 5",
        ),
        (
            "[topology]\nnodes = 2\n[[flows]]\nsrc = 0\ndst = 1\nsize = \"3 parsecs\"\n",
            "unit",
        ),
        (
            "[topology]\nnodes = 2\n[[events]]\nat = 1.0\nkind = \"link_down\"\na = 0\n",
            "needs a and b",
        ),
        (
            "[topology]\nnodes = 2\n[[events]]\nat = 1.0\nkind = \"explode\"\nnode = 0\n",
            "explode",
        ),
        (
            "[topology]\ngenerator = \"grid\"\nrows = 2\n",
            "rows and cols",
        ),
        (
            "[medium]\nkind = \"fiber\"\n[topology]\nnodes = 2\n",
            "fiber",
        ),
        (
            "[medium]\nlink_acks = false\n[topology]\nnodes = 2\n",
            "link_acks = false",
        ),
    ];
    for (text, needle) in cases {
        let e = hop_sim::Scenario::from_toml(text).unwrap_err().to_string();
        assert!(e.contains(needle), "{e:?} lacks {needle:?}");
        assert!(!e.contains('\n'), "multi-line: {e:?}");
    }
    let sc = hop_sim::Scenario::from_toml(
        "[topology]\nnodes = 2\n[[flows]]\nsrc = 0\ndst = 1\nsize = 10\ntransport = \"nope\"\n",
    )
    .unwrap();
    let e = hop_sim::Simulation::new(sc, common::registry())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("unknown transport") && e.contains("probe"),
        "{e}"
    );
    let sc = hop_sim::Scenario::from_toml(
        "[topology]\nnodes = 2\n[[flows]]\nsrc = 0\ndst = 1\nsize = 10\ntransport = \"probe\"\n[transports.probe]\nwarp = 9\n",
    )
    .unwrap();
    let e = hop_sim::Simulation::new(sc, common::registry())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("warp"), "{e}");
}

#[test]
fn cli_rejects_bad_scenario_with_nonzero_exit() {
    let dir = std::env::temp_dir().join(format!("hop-sim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("bad.toml");
    std::fs::write(&p, "[topology]\nnodes = 2\ntypo = true\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hop-sim"))
        .args(["run", p.to_str().unwrap()])
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("typo"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"));
}

/// `run --set` and `--transport` apply to the scenario run (they used to be accepted and
/// ignored): the run's flows go over the transport named and a bad key is an error.
#[test]
fn cli_run_applies_set_and_transport() {
    let dir = std::env::temp_dir().join(format!("hop-sim-cli-set-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("one.toml");
    std::fs::write(
        &p,
        "duration = 5.0\n[topology]\nnodes = 2\ngenerator = \"chain\"\n\
         [[flows]]\nsrc = 0\ndst = 1\nsize = \"10KB\"\ntransport = \"hop\"\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_hop-sim"))
            .arg("run")
            .arg(&p)
            .args(args)
            .output()
            .unwrap()
    };
    let tcp = run(&["--transport", "tcp"]);
    let bad = run(&["--set", "no_such_key=1"]);
    let seeds = run(&["--seeds", "1-3"]);
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        tcp.status.success(),
        "{}",
        String::from_utf8_lossy(&tcp.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&tcp.stdout).unwrap();
    assert_eq!(json["flows"][0]["transport"], "tcp");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no_such_key"));
    assert!(!seeds.status.success());
}

fn detour(recompute: bool) -> String {
    // 0-1-2 clean, 0-2 direct at 50% loss (ETX 4 > 2): routes go through 1 until link 1-2
    // fails at 0.2 s.
    format!(
        r#"
duration = 30.0
[medium]
kind = "p2p"
[topology]
nodes = 3
generator = "chain"
rate_mbps = 1.0
[[topology.links]]
a = 0
b = 2
loss = 0.5
[routing]
metric = "etx"
recompute = {recompute}
[[flows]]
src = 0
dst = 2
size = "100KB"
transport = "probe"
[transports.probe]
control = true
[[events]]
at = 0.2
kind = "link_down"
a = 1
b = 2
"#
    )
}

#[test]
fn routes_recompute_around_a_failed_link_only_when_asked() {
    let got = |r: &hop_sim::SimResult| {
        r.nodes[2]
            .received_by_type
            .get("data")
            .copied()
            .unwrap_or(0)
    };
    let r = run(&detour(true));
    let relayed = r.nodes[1].datagrams_sent;
    // Before the failure node 1 relayed; afterwards the lossy direct link (with link-layer
    // retries) carried the rest: node 2 got chunks that node 1 never sent.
    assert!(relayed > 0);
    assert!(
        got(&r) > relayed && got(&r) >= 90,
        "{} via 1 of {}",
        relayed,
        got(&r)
    );
    assert!(r.medium.link_retries > 0);
    // Disruption-tolerant default: node 1 stays the next hop and chunks die at the dead link.
    let s = run(&detour(false));
    assert!(got(&s) <= s.nodes[1].datagrams_sent);
    assert!(s.medium.link_drops > 0);
    assert!(!s.flows[0].identical);
}

#[test]
fn data_broadcast_reaches_every_neighbour_on_p2p_links() {
    let t = |bcast: bool| {
        format!(
            r#"
duration = 10.0
[medium]
kind = "p2p"
data_broadcast = {bcast}
[topology]
nodes = 3
generator = "chain"
[[topology.links]]
a = 0
b = 2
[routing]
metric = "static"
[[routing.paths]]
path = [0, 1, 2]
[[flows]]
src = 0
dst = 2
size = "20KB"
transport = "probe"
"#
        )
    };
    let b = run(&t(true));
    assert!(b.flows[0].completed && b.flows[0].identical);
    // Node 2 hears node 0's broadcasts meant for node 1 (the envelope still names node 1).
    assert!(b.nodes[2].datagrams_overheard >= 20, "{:?}", b.nodes[2]);
    assert_eq!(run(&t(false)).nodes[2].datagrams_overheard, 0);
}

#[test]
fn lossless_acks_spare_the_acknowledgements_only() {
    // One sender, so no collisions: every retry follows a lost frame or a lost ACK. With
    // `lossless_acks` only the data frames' losses remain, so fewer retries, all explained
    // by counted losses.
    let lossy = run(&one_hop("shared", 0.5, true, "50KB", "retry_limit = 18"));
    let spared = run(&one_hop(
        "shared",
        0.5,
        true,
        "50KB",
        "retry_limit = 18\nlossless_acks = true",
    ));
    assert!(lossy.flows[0].identical && spared.flows[0].identical);
    assert!(lossy.flows[0].completed && spared.flows[0].completed);
    assert_eq!(spared.medium.collisions, 0);
    assert!(
        spared.medium.link_retries < lossy.medium.link_retries,
        "{:?} vs {:?}",
        spared.medium,
        lossy.medium
    );
    assert!(
        spared.medium.link_retries <= spared.medium.random_losses,
        "{:?}",
        spared.medium
    );
}

/// Node 1 sends to node 0 and node 2 to node 1, every frame acknowledged; 0 and 2 cannot hear
/// each other, so node 2 hears node 1's frames but not node 0's ACKs for them.
fn ack_behind_hidden_sender(medium: &str, links: &str) -> String {
    format!(
        r#"
seed = 5
duration = 5.0
run_to_end = true
[medium]
{medium}
[topology]
nodes = 3
generator = "chain"
{links}
[[flows]]
src = 1
dst = 0
size = "300KB"
transport = "probe"
[[flows]]
src = 2
dst = 1
size = "300KB"
transport = "probe"
[transports.probe]
control = true
"#
    )
}

fn acks_lost_to_hidden_frames(r: &hop_sim::SimResult) -> u64 {
    r.medium
        .losses_at_next_hop
        .iter()
        .filter(|(k, _)| k.starts_with("ack by ") && k.ends_with("(hidden)"))
        .map(|(_, v)| *v)
        .sum()
}

#[test]
fn nav_keeps_a_node_off_the_ack_it_cannot_hear() {
    let plain = run(&ack_behind_hidden_sender("nav = false\neifs = false", ""));
    let nav = run(&ack_behind_hidden_sender("eifs = false", ""));
    let (a, b) = (
        acks_lost_to_hidden_frames(&plain),
        acks_lost_to_hidden_frames(&nav),
    );
    eprintln!(
        "without NAV {a}, with {b}: {:?}",
        nav.medium.losses_at_next_hop
    );
    assert!(
        a > 20,
        "without NAV node 2 starts on top of node 0's ACKs: {a}"
    );
    assert!(b * 5 < a, "with NAV {b} ACKs lost against {a} without");
}

#[test]
fn eifs_keeps_a_node_off_the_ack_of_a_frame_it_could_not_decode() {
    // Half of node 1's frames are lost on their way to node 2: it senses them but cannot
    // read their Duration, so NAV cannot help there; EIFS does.
    let lossy = "[[topology.links]]\na = 1\nb = 2\nloss_ab = 0.5\nloss_ba = 0.0\n";
    let nav = run(&ack_behind_hidden_sender("eifs = false", lossy));
    let eifs = run(&ack_behind_hidden_sender("", lossy));
    let (a, b) = (
        acks_lost_to_hidden_frames(&nav),
        acks_lost_to_hidden_frames(&eifs),
    );
    eprintln!("NAV alone {a}, with EIFS {b}");
    assert!(
        a > 20,
        "frames node 2 could not read leave it free to hit node 0's ACKs: {a}"
    );
    assert!(b * 5 < a, "with EIFS {b} ACKs lost against {a} without");
}
