//! Scenario tests of the comparison transports (HxH and the three ATP variants) on the
//! simulated 802.11-like shared medium: one lossy hop, a multi-hop chain, and several flows
//! through one bottleneck. Run with `--nocapture` to see the measured goodputs.

use hop_sim::{NodeResult, Registry, Scenario, SimResult, Simulation};

/// Payload bytes per data packet of both HxH and ATP (HxH paper §4: 1000-byte packets).
const PACKET_PAYLOAD: u64 = 1000;

/// Lower bound on Jain's index for flows sharing one bottleneck path. HxH paper §4.1,
/// Table 1, measures 0.998 for HxH and 0.993 for ATP on the 4-flow dumbbell; the ATP
/// paper (§V-B, Fig. 8c and 11) finds its variants fair among flows sharing one path. 0.8
/// leaves room for the short transfers used here while still failing if one flow starves
/// or takes most of the bottleneck.
const MIN_JAIN: f64 = 0.8;

fn run(text: &str) -> SimResult {
    let sc = Scenario::from_toml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    Simulation::new(sc, Registry::builtin())
        .unwrap_or_else(|e| panic!("{e}"))
        .run()
}

fn sent(n: &NodeResult, t: &str) -> u64 {
    n.sent_by_type.get(t).copied().unwrap_or(0)
}

/// Data packets a node put on its outgoing hop: HxH counts them as "data" at every node,
/// ATP counts the source's as "data" and the relays' as "forwarded".
fn data_sent(n: &NodeResult) -> u64 {
    sent(n, "data") + sent(n, "forwarded")
}

fn print_goodputs(label: &str, r: &SimResult) {
    let per_flow: Vec<String> = r
        .flows
        .iter()
        .map(|f| format!("{:.3}", f.goodput_bps / 1e6))
        .collect();
    println!(
        "{label}: goodput Mbit/s [{}], Jain {:.4}, virtual {:.2} s, wall {:.2} s",
        per_flow.join(", "),
        r.jain_fairness.unwrap_or(f64::NAN),
        r.virtual_seconds,
        r.wall_seconds
    );
}

/// Every flow completed with identical bytes, and the result is consistent.
fn assert_complete(label: &str, r: &SimResult, flows: usize) {
    assert_eq!(r.flows.len(), flows, "{label}");
    assert_eq!(r.stop_reason, "flows_done", "{label}");
    assert!(r.all_flows_completed, "{label}: {:?}", r.flows);
    for f in &r.flows {
        assert!(
            f.completed && f.identical && f.delivered_bytes_match,
            "{label}: flow {} incomplete: {f:?}",
            f.index
        );
        assert_eq!(f.bytes_delivered, f.size, "{label}: flow {}", f.index);
        assert_eq!(f.bytes_sent, f.size, "{label}: flow {}", f.index);
        assert!(f.failed.is_none(), "{label}: {f:?}");
        assert!(f.flow_id.is_some(), "{label}: {f:?}");
        let done = f
            .completion_time
            .expect("completed flow has a completion time");
        assert!(
            done > 0.0 && f.start + done <= r.virtual_seconds + 1e-9,
            "{label}: {f:?}"
        );
        let expected = f.size as f64 * 8.0 / done;
        assert!(
            (f.goodput_bps - expected).abs() <= 1e-6 * expected,
            "{label}: goodput {} != size*8/completion {expected}",
            f.goodput_bps
        );
    }
    // A handled deadline is never reported again (no busy loop in the runtime).
    assert_eq!(r.medium.stale_timeouts, 0, "{label}");
    assert!(r.medium.frames_sent > 0, "{label}");
}

fn flows_toml(flows: &[(u32, u32)], size: &str, start_gap: f64, transport: &str) -> String {
    flows
        .iter()
        .enumerate()
        .map(|(i, (src, dst))| {
            format!(
                "[[flows]]\nsrc = {src}\ndst = {dst}\nsize = \"{size}\"\nstart = {}\ntransport = \"{transport}\"\n",
                i as f64 * start_gap
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// (a) One hop, 20 % frame loss on the shared medium.

fn lossy_hop(transport: &str) -> String {
    format!(
        r#"
name = "one-hop-20pct-{transport}"
seed = 11
duration = 120.0
[medium]
kind = "shared"
[topology]
nodes = 2
generator = "chain"
loss = 0.2
{}"#,
        flows_toml(&[(0, 1)], "300KB", 0.0, transport)
    )
}

fn check_lossy_hop(transport: &str) {
    let r = run(&lossy_hop(transport));
    print_goodputs(&format!("one hop 20% loss, {transport}"), &r);
    assert_complete(transport, &r, 1);
    // The loss was applied, and recovered by retransmitting data.
    assert!(r.medium.random_losses > 0, "{transport}");
    let packets = r.flows[0].size / PACKET_PAYLOAD;
    assert!(
        sent(&r.nodes[0], "data") > packets,
        "{transport}: no data retransmitted: {:?}",
        r.nodes[0]
    );
    // The destination sends feedback only, never data.
    assert_eq!(data_sent(&r.nodes[1]), 0, "{transport}");
}

#[test]
fn hxh_one_hop_20_percent_loss() {
    check_lossy_hop("hxh");
}

#[test]
fn atp_one_hop_20_percent_loss() {
    check_lossy_hop("atp");
}

#[test]
fn atp_aggressive_one_hop_20_percent_loss() {
    check_lossy_hop("atp-aggressive");
}

#[test]
fn atp_adaptive_one_hop_20_percent_loss() {
    check_lossy_hop("atp-adaptive");
}

// ---------------------------------------------------------------------------------------
// (b) Four-hop chain.

fn chain(transport: &str) -> String {
    format!(
        r#"
name = "chain4-{transport}"
seed = 7
duration = 120.0
[medium]
kind = "shared"
[topology]
nodes = 5
generator = "chain"
loss = 0.02
{}"#,
        flows_toml(&[(0, 4)], "300KB", 0.0, transport)
    )
}

fn check_chain(transport: &str) {
    let r = run(&chain(transport));
    print_goodputs(&format!("4-hop chain, {transport}"), &r);
    assert_complete(transport, &r, 1);
    let packets = r.flows[0].size / PACKET_PAYLOAD;
    for relay in 1..4 {
        assert!(
            data_sent(&r.nodes[relay]) >= packets,
            "{transport}: relay {relay} forwarded too little: {:?}",
            r.nodes[relay]
        );
    }
    assert_eq!(data_sent(&r.nodes[4]), 0, "{transport}");
}

#[test]
fn hxh_four_hop_chain() {
    check_chain("hxh");
}

#[test]
fn atp_four_hop_chain() {
    check_chain("atp");
}

#[test]
fn atp_aggressive_four_hop_chain() {
    check_chain("atp-aggressive");
}

#[test]
fn atp_adaptive_four_hop_chain() {
    check_chain("atp-adaptive");
}

// ---------------------------------------------------------------------------------------
// (c) Several flows through one bottleneck.

/// Links of a clique over `nodes`: nodes placed close together hear each other.
fn clique(nodes: &[u32]) -> String {
    let mut s = String::new();
    for (i, a) in nodes.iter().enumerate() {
        for b in &nodes[i + 1..] {
            s.push_str(&format!("[[topology.links]]\na = {a}\nb = {b}\n"));
        }
    }
    s
}

/// HxH paper §4.1, Figure 3: four sources feed one path and four destinations leave it.
/// Sources 0-3 are within range of each other and of relay 4; relays 4-5-6 form the shared
/// path; destinations 7-10 are within range of each other and of relay 6.
fn dumbbell(transport: &str) -> String {
    let links = format!(
        "{}{}[[topology.links]]\na = 4\nb = 5\n[[topology.links]]\na = 5\nb = 6\n",
        clique(&[0, 1, 2, 3, 4]),
        clique(&[6, 7, 8, 9, 10])
    );
    format!(
        r#"
name = "dumbbell4-{transport}"
seed = 3
duration = 120.0
[medium]
kind = "shared"
[topology]
nodes = 11
generator = "none"
{links}
{}"#,
        flows_toml(&[(0, 7), (1, 8), (2, 9), (3, 10)], "200KB", 0.0, transport)
    )
}

/// Three sources 0-2 in range of each other and of relay 3, one bottleneck hop 3-4, and
/// three destinations 5-7 in range of each other and of relay 4.
fn bottleneck3(transport: &str) -> String {
    let links = format!(
        "{}{}[[topology.links]]\na = 3\nb = 4\n",
        clique(&[0, 1, 2, 3]),
        clique(&[4, 5, 6, 7])
    );
    format!(
        r#"
name = "bottleneck3-{transport}"
seed = 3
duration = 120.0
[medium]
kind = "shared"
[topology]
nodes = 8
generator = "none"
{links}
{}"#,
        flows_toml(&[(0, 5), (1, 6), (2, 7)], "200KB", 0.0, transport)
    )
}

fn check_bottleneck(label: &str, text: &str, flows: usize, relays: &[usize]) {
    check_bottleneck_seed(label, text, None, flows, relays);
}

fn check_bottleneck_seed(
    label: &str,
    text: &str,
    seed: Option<u64>,
    flows: usize,
    relays: &[usize],
) {
    let sc = Scenario::from_toml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let r = Simulation::with_seed(sc, Registry::builtin(), seed)
        .unwrap_or_else(|e| panic!("{e}"))
        .run();
    print_goodputs(label, &r);
    assert_complete(label, &r, flows);
    let total: u64 = r.flows.iter().map(|f| f.size).sum();
    for &relay in relays {
        assert!(
            data_sent(&r.nodes[relay]) >= total / PACKET_PAYLOAD,
            "{label}: relay {relay} forwarded too little: {:?}",
            r.nodes[relay]
        );
    }
    // Jain's index as reported, recomputed from the per-flow goodputs.
    let g: Vec<f64> = r.flows.iter().map(|f| f.goodput_bps).collect();
    let sum: f64 = g.iter().sum();
    let sq: f64 = g.iter().map(|x| x * x).sum();
    let jain = sum * sum / (g.len() as f64 * sq);
    let reported = r.jain_fairness.expect("flows give a fairness index");
    assert!(
        (reported - jain).abs() < 1e-9,
        "{label}: {reported} vs {jain}"
    );
    assert!(
        jain >= MIN_JAIN,
        "{label}: Jain {jain:.3} < {MIN_JAIN}: {g:?}"
    );
}

#[test]
fn hxh_four_flow_dumbbell() {
    check_bottleneck("4-flow dumbbell, hxh", &dumbbell("hxh"), 4, &[4, 5, 6]);
}

/// HxH §3.2 passive feedback on the dumbbell with link ARQ for the data (HxH relies on the
/// MAC's retries): every flow arrives intact, and the relays send far fewer frames than when
/// the next hop acknowledges every packet (the explicit variant of §3.4), because an upstream
/// node learns of each packet's arrival by overhearing it forwarded.
#[test]
fn hxh_passive_feedback_on_the_dumbbell_saves_the_per_packet_acks() {
    let arq =
        |text: String| text.replace("kind = \"shared\"", "kind = \"shared\"\ndata_arq = true");
    let explicit = arq(dumbbell("hxh"));
    let passive = format!("{explicit}\n[transports.hxh]\npassive_feedback = true\n");
    let (e, p) = (run(&explicit), run(&passive));
    assert_complete("dumbbell, hxh explicit", &e, 4);
    assert_complete("dumbbell, hxh passive", &p, 4);
    let relays = [4, 5];
    let acks = |r: &SimResult| {
        relays
            .iter()
            .map(|&n| sent(&r.nodes[n], "hopack"))
            .sum::<u64>()
    };
    let frames = |r: &SimResult| r.medium.frames_sent;
    println!(
        "hop acks from relays 4-5: explicit {} passive {}; frames {} / {}",
        acks(&e),
        acks(&p),
        frames(&e),
        frames(&p)
    );
    // Relays acknowledge only duplicates and refusals; the frames on the air shrink with them.
    assert!(acks(&p) * 4 < acks(&e), "{} vs {}", acks(&p), acks(&e));
    assert!(frames(&p) < frames(&e), "{} vs {}", frames(&p), frames(&e));
    assert!(
        p.nodes
            .iter()
            .map(|n| n.extra.get("passive_acks").copied().unwrap_or(0))
            .sum::<u64>()
            > 0
    );
}

#[test]
fn atp_three_flows_one_bottleneck() {
    check_bottleneck("3 flows bottleneck, atp", &bottleneck3("atp"), 3, &[3, 4]);
}

#[test]
fn atp_aggressive_three_flows_one_bottleneck() {
    check_bottleneck(
        "3 flows bottleneck, atp-aggressive",
        &bottleneck3("atp-aggressive"),
        3,
        &[3, 4],
    );
}

#[test]
fn atp_adaptive_three_flows_one_bottleneck() {
    check_bottleneck(
        "3 flows bottleneck, atp-adaptive",
        &bottleneck3("atp-adaptive"),
        3,
        &[3, 4],
    );
}

/// ATP paper §V-D, Figure 12: the stack topology, three one-hop flows side by side. Senders
/// 0, 2, 4 send to 1, 3, 5; the middle pair (2, 3) is in range of both outer pairs, the outer
/// pairs are out of range of each other, so the middle flow contends with both while the
/// outer senders do not sense each other (the configuration that starves the middle flow,
/// [22] of that paper). Flows start together (the paper: 3 s apart, longer transfers).
fn stack(transport: &str) -> String {
    let mut links = String::new();
    for (a, b) in [(0, 1), (2, 3), (4, 5), (0, 2), (1, 3), (2, 4), (3, 5)] {
        links.push_str(&format!("[[topology.links]]\na = {a}\nb = {b}\n"));
    }
    format!(
        r#"
name = "stack3-{transport}"
seed = 3
duration = 120.0
[medium]
kind = "shared"
[topology]
nodes = 6
generator = "none"
{links}
{}"#,
        flows_toml(&[(0, 1), (2, 3), (4, 5)], "600KB", 0.0, transport)
    )
}

/// Jain's index of the per-flow goodputs in the ATP paper's Table II (stack experiment):
/// default 0.81, aggressive 0.88, adaptive 0.88; the stack tests use the same bound, on
/// several seeds. (Adaptive at seed 3 gave 0.745 while idle-channel observations left `T_t`
/// at its last busy value: the middle flow kept η times the delay of a contention that had
/// ended, 0.45 Mbit/s for 9 s after the outer flows finished.)
fn check_stack(transport: &str) {
    for seed in 1..=5 {
        let label = format!("3-flow stack, {transport}, seed {seed}");
        check_bottleneck_seed(&label, &stack(transport), Some(seed), 3, &[]);
    }
}

#[test]
fn atp_three_flow_stack() {
    check_stack("atp");
}

#[test]
fn atp_aggressive_three_flow_stack() {
    check_stack("atp-aggressive");
}

#[test]
fn atp_adaptive_three_flow_stack() {
    check_stack("atp-adaptive");
}

#[test]
fn example_scenarios_complete() {
    for (label, text, flows) in [
        (
            "examples/scenarios/hxh-dumbbell.toml",
            include_str!("../../../examples/scenarios/hxh-dumbbell.toml"),
            4,
        ),
        (
            "examples/scenarios/atp-stack.toml",
            include_str!("../../../examples/scenarios/atp-stack.toml"),
            3,
        ),
    ] {
        let r = run(text);
        print_goodputs(label, &r);
        assert_complete(label, &r, flows);
    }
}

// ---------------------------------------------------------------------------------------
// (d) End-to-end NACKs of HxH on a long lossy chain.

/// `examples/scenarios/hxh-chain7.toml`: 2 MB over 7 hops with 5 % frame loss. HxH paper
/// §3.3: per-hop reliability leaves end-to-end loss "rare", and §3.3.1 NACKs a gap as a
/// loss. Here per-hop retransmissions (deviation 3) reorder packets, and the destination
/// must not take reordering for loss: a NACK each time a packet arrives past a gap (about
/// one NACK per two packets before it held gaps off) would make the source resend data that
/// is still on its way. At most one packet in ten may be NACKed; the real losses (packets a
/// relay gave up after its retry limit) are a few per thousand.
#[test]
fn hxh_chain7_nacks_only_gaps_that_outlive_reordering() {
    let text = include_str!("../../../examples/scenarios/hxh-chain7.toml");
    for seed in [1, 2, 3] {
        let sc = Scenario::from_toml(text).unwrap_or_else(|e| panic!("{e}"));
        let r = Simulation::with_seed(sc, Registry::builtin(), Some(seed))
            .unwrap_or_else(|e| panic!("{e}"))
            .run();
        let label = format!("hxh-chain7 seed {seed}");
        print_goodputs(&label, &r);
        assert_complete(&label, &r, 1);
        let packets = r.flows[0].size / PACKET_PAYLOAD;
        let dst = &r.nodes[7];
        let nacks = sent(dst, "nack");
        let drops: u64 = r
            .nodes
            .iter()
            .map(|n| n.extra.get("hop_drops").copied().unwrap_or(0))
            .sum();
        let resent = r.nodes[0]
            .extra
            .get("e2e_retransmissions")
            .copied()
            .unwrap_or(0);
        println!("{label}: {nacks} NACKs, {resent} packets resent end to end, {drops} hop drops");
        assert!(
            nacks * 10 <= packets,
            "{label}: {nacks} NACKs for {packets} packets ({drops} lost at relays)"
        );
        assert!(resent * 10 <= packets, "{label}: {resent} resent");
    }
}

// ---------------------------------------------------------------------------------------
// (e) ATP with 30 hidden senders into one hub (`examples/scenarios/fair-30-flows.toml`).

fn star30(transport: &str) -> String {
    include_str!("../../../examples/scenarios/fair-30-flows.toml").replace(
        "size = \"200KB\"",
        &format!("size = \"200KB\"\ntransport = \"{transport}\""),
    )
}

fn leaf_extra(r: &SimResult, key: &str) -> u64 {
    r.nodes[2..]
        .iter()
        .map(|n| n.extra.get(key).copied().unwrap_or(0))
        .sum()
}

/// ATP paper §V-E, Fig. 14: with 32 simultaneous flows ATP starves 20-30 % of them in the
/// mesh; here at least 70 % of the 30 flows must complete. (19 of 30 did while idle-channel
/// observations kept `T_t` at its busy value.)
#[test]
fn atp_thirty_hidden_senders_mostly_complete() {
    for seed in [1, 2, 3] {
        let sc = Scenario::from_toml(&star30("atp")).unwrap_or_else(|e| panic!("{e}"));
        let r = Simulation::with_seed(sc, Registry::builtin(), Some(seed))
            .unwrap_or_else(|e| panic!("{e}"))
            .run();
        let done = r.flows.iter().filter(|f| f.completed).count();
        println!("30-leaf star, atp, seed {seed}: {done}/30 completed");
        assert!(done * 10 >= 7 * r.flows.len(), "seed {seed}: {done}/30");
        for f in r.flows.iter().filter(|f| f.completed) {
            assert!(f.identical && f.bytes_delivered == f.size, "{f:?}");
        }
        assert_eq!(r.medium.stale_timeouts, 0);
    }
}

/// The aggressive variant (E = 40 ms, §V-A2) in the same star: documents the protocol's
/// behaviour, not a defect of this implementation. A sender restarts quick-start after
/// three missed feedbacks (§II-C), here 3 x 1.1 x 40 ms = 132 ms without feedback, which
/// 30 senders hidden from each other behind one hub exceed all the time; in quick-start a
/// sender sends only probes, and almost all of them collide at the hub. A flow that never
/// gets data through fails by timeout, or is still probing when the run ends with less than
/// a tenth of its bytes delivered (an answered probe now and then keeps its timeout from
/// firing).
#[test]
fn atp_aggressive_thirty_hidden_senders_stall_in_quick_start() {
    let sc = Scenario::from_toml(&star30("atp-aggressive")).unwrap_or_else(|e| panic!("{e}"));
    let r = Simulation::new(sc, Registry::builtin())
        .unwrap_or_else(|e| panic!("{e}"))
        .run();
    let done = r.flows.iter().filter(|f| f.completed).count();
    let probes = leaf_extra(&r, "probes");
    let restarts = leaf_extra(&r, "quick_start_restarts");
    let replies = r.nodes[1].extra.get("probe_replies").copied().unwrap_or(0);
    println!(
        "30-leaf star, atp-aggressive: {done}/30 completed, {probes} probes, {replies} \
         answered, {restarts} quick-start restarts, {} collisions",
        r.medium.collisions
    );
    assert!(restarts >= r.flows.len() as u64, "{restarts}");
    assert!(probes > 10 * replies, "{probes} probes, {replies} answered");
    for f in r.flows.iter().filter(|f| !f.completed) {
        let stalled = f.failed.is_none() && f.bytes_delivered * 10 < f.size;
        assert!(f.failed.as_deref() == Some("Timeout") || stalled, "{f:?}");
    }
    assert_eq!(r.medium.stale_timeouts, 0);
}
