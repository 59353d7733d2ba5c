//! Simulated seconds per wall second on the 20-node, 30-flow shared-medium scenario
//! (examples/scenarios/bench-grid20-30flows.toml). Run with `cargo bench -p hop-sim`.

use hop_sim::{Registry, Scenario, Simulation};

const BENCH: &str = include_str!("../../../examples/scenarios/bench-grid20-30flows.toml");

fn main() {
    let runs: u64 = std::env::var("HOP_SIM_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut rates = Vec::new();
    for seed in 1..=runs {
        let sc = match Scenario::from_toml(BENCH) {
            Ok(sc) => sc,
            Err(e) => {
                eprintln!("bench scenario: {e}");
                std::process::exit(1);
            }
        };
        let sim = match Simulation::with_seed(sc, Registry::builtin(), Some(seed)) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("bench scenario: {e}");
                std::process::exit(1);
            }
        };
        let r = sim.run();
        let rate = r.virtual_seconds / r.wall_seconds.max(1e-9);
        println!(
            "seed {seed}: {:.1} simulated s in {:.3} wall s = {rate:.1} sim-s/wall-s, {} frames, {}/{} flows completed",
            r.virtual_seconds,
            r.wall_seconds,
            r.medium.frames_sent,
            r.flows.iter().filter(|f| f.completed).count(),
            r.flows.len()
        );
        rates.push(rate);
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "grid20-30flows: median {:.1} simulated seconds per wall second",
        rates[rates.len() / 2]
    );
}
