//! `hop-sim`: run a scenario file and print its JSON result.

use std::process::ExitCode;

use hop_sim::{Registry, Scenario, Simulation};

const USAGE: &str = "usage:
  hop-sim run SCENARIO.toml [--seed N] [--out FILE]   run and print the JSON result
  hop-sim check SCENARIO.toml                         validate a scenario
  hop-sim bench [--seed N]                            simulated seconds per wall second
                                                      (20-node grid, 30 flows, shared medium)
  hop-sim transports                                  list transport names";

/// The benchmark scenario (also in examples/scenarios/).
const BENCH: &str = include_str!("../../../examples/scenarios/bench-grid20-30flows.toml");

struct Args {
    cmd: String,
    file: Option<String>,
    seed: Option<u64>,
    out: Option<String>,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let cmd = it.next().ok_or("missing command")?;
    let mut a = Args {
        cmd,
        file: None,
        seed: None,
        out: None,
    };
    while let Some(x) = it.next() {
        match x.as_str() {
            "--seed" => {
                let v = it.next().ok_or("--seed needs a value")?;
                a.seed = Some(v.parse().map_err(|_| format!("--seed {v:?}: not a u64"))?);
            }
            "--out" => a.out = Some(it.next().ok_or("--out needs a file")?),
            "-h" | "--help" => return Err(String::new()),
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            s if a.file.is_none() => a.file = Some(s.to_string()),
            s => return Err(format!("unexpected argument {s:?}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("hop-sim: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match real_main(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hop-sim: {e}");
            ExitCode::from(1)
        }
    }
}

fn real_main(a: Args) -> Result<(), String> {
    match a.cmd.as_str() {
        "run" | "check" => {
            let file = a.file.ok_or("missing SCENARIO.toml")?;
            let sc = Scenario::from_file(file.as_ref()).map_err(|e| format!("{file}: {e}"))?;
            let sim = Simulation::with_seed(sc, Registry::builtin(), a.seed)
                .map_err(|e| format!("{file}: {e}"))?;
            if a.cmd == "check" {
                println!("{file}: ok");
                return Ok(());
            }
            let json = sim.run().to_json();
            match a.out {
                Some(out) => std::fs::write(&out, json + "\n")
                    .map_err(|e| format!("cannot write {out}: {e}"))?,
                None => println!("{json}"),
            }
            Ok(())
        }
        "bench" => {
            let sc = Scenario::from_toml(BENCH).map_err(|e| e.to_string())?;
            let sim = Simulation::with_seed(sc, Registry::builtin(), a.seed)
                .map_err(|e| e.to_string())?;
            let r = sim.run();
            let completed = r.flows.iter().filter(|f| f.completed).count();
            println!(
                "{{\"bench\":\"grid20-30flows\",\"virtual_seconds\":{:.3},\"wall_seconds\":{:.3},\"sim_seconds_per_wall_second\":{:.2},\"frames_sent\":{},\"flows_completed\":{},\"flows\":{}}}",
                r.virtual_seconds,
                r.wall_seconds,
                r.virtual_seconds / r.wall_seconds.max(1e-9),
                r.medium.frames_sent,
                completed,
                r.flows.len()
            );
            Ok(())
        }
        "transports" => {
            for n in Registry::builtin().names() {
                println!("{n}");
            }
            Ok(())
        }
        other => Err(format!("unknown command {other:?}\n{USAGE}")),
    }
}
