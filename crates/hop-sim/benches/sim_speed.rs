//! Simulated seconds per wall second on four scenarios (crates/hop-sim/benches/README.md):
//! the 20-node, 30-flow shared-medium grid, a burst of 10,000 small flows from one node,
//! 1,000 sources with 10 small flows each on a point-to-point grid, and a 1,000-node random
//! mesh with 200 flows on a shared medium (last, with the process's peak memory). Run with
//! `cargo bench -p hop-sim` (`HOP_SIM_BENCH_RUNS` seeds of the first, one of the others;
//! `HOP_SIM_BENCH_SKIP_1000=1` leaves the 1,000-node mesh out).

use hop_sim::{Registry, Scenario, Simulation};

/// The allocator `hop-sim` runs with (src/main.rs).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const GRID20: &str = include_str!("../../../examples/scenarios/bench-grid20-30flows.toml");
const FLOOD: &str = include_str!("../../../examples/scenarios/flood-10k-small-flows.toml");
const MESH_1000: &str = include_str!("random-mesh-1000-nodes.toml");
/// 1,000 nodes (25 x 40 grid of point-to-point links), each opening 10 flows of 1 B-16 KB to
/// random destinations within the first 10 s: 10,000 flows, all complete by about 11 s.
const SOURCES_1000: &str = "name = \"sources-1000x10-p2p\"\nseed = 1\nduration = 15.0\n\
    [medium]\nkind = \"p2p\"\n[topology]\ngenerator = \"grid\"\nrows = 25\ncols = 40\n\
    [[flow_sets]]\ncount = 10\neach_source = true\nsize = [\"1B\", \"16KB\"]\n\
    start_window = [0.0, 10.0]\n";

/// Run `text` at `seed`; print one line and return simulated seconds per wall second.
fn run(name: &str, text: &str, seed: u64) -> f64 {
    let sim = Scenario::from_toml(text)
        .map_err(|e| e.to_string())
        .and_then(|sc| {
            Simulation::with_seed(sc, Registry::builtin(), Some(seed)).map_err(|e| e.to_string())
        });
    let sim = match sim {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench scenario {name}: {e}");
            std::process::exit(1);
        }
    };
    let r = sim.run();
    let rate = r.virtual_seconds / r.wall_seconds.max(1e-9);
    println!(
        "{name} seed {seed}: {:.1} simulated s in {:.3} wall s = {rate:.1} sim-s/wall-s, {} frames ({:.2} µs each), {}/{} flows completed",
        r.virtual_seconds,
        r.wall_seconds,
        r.medium.frames_sent,
        r.wall_seconds * 1e6 / r.medium.frames_sent.max(1) as f64,
        r.flows.iter().filter(|f| f.completed).count(),
        r.flows.len()
    );
    rate
}

fn main() {
    let runs: u64 = std::env::var("HOP_SIM_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut rates: Vec<f64> = (1..=runs.max(1))
        .map(|seed| run("grid20-30flows", GRID20, seed))
        .collect();
    rates.sort_by(f64::total_cmp);
    println!(
        "grid20-30flows: median {:.1} simulated seconds per wall second",
        rates[rates.len() / 2]
    );
    run("flood-10k-small-flows", FLOOD, 1);
    run("sources-1000x10-p2p", SOURCES_1000, 1);
    if std::env::var_os("HOP_SIM_BENCH_SKIP_1000").is_none() {
        run("random-mesh-1000-nodes", MESH_1000, 1);
        if let Some(peak) = peak_memory() {
            println!("peak memory of this process (VmHWM): {peak}");
        }
    }
}

/// The process's peak resident memory as Linux reports it (None elsewhere).
fn peak_memory() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.trim_start_matches("VmHWM:").trim().to_string())
}
