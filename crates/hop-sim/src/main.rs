//! `hop-sim`: run a scenario file and print its JSON result.

use std::process::ExitCode;

/// mimalloc instead of the system allocator: a run allocates and frees a buffer per block
/// and frame, and glibc's malloc spent a tenth of the 20-node benchmark's time on it.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use hop_sim::compare::{compare, parse_seeds, table, Variant};
use hop_sim::{Registry, Scenario, Simulation};

const USAGE: &str = "usage:
  hop-sim run SCENARIO.toml [--seed N] [--out FILE] [--set 'KEY=VALUE[;KEY=VALUE]']
                  [--transport NAME]                  run and print the JSON result (--set
                                                      and --transport as in compare)
  hop-sim check SCENARIO.toml [--set ...]             validate a scenario
  hop-sim compare SCENARIO.toml [--seeds 1-5] [--set 'KEY=VALUE[;KEY=VALUE]']...
                  [--transport NAME]... [--jobs N] [--json]
                                                      the scenario as written and one variant
                                                      per --set or --transport, at every seed:
                                                      delivered bytes, mean/median goodput,
                                                      flows that delivered anything,
                                                      hop-weighted Jain, resend share, air per
                                                      byte-hop, and the first variant's mean
                                                      and median goodput over each one's (a
                                                      KEY without a dot is in
                                                      [transports.hop]; KEY `transport` or
                                                      --transport NAME runs every flow over
                                                      NAME, e.g. --transport tcp for Hop and
                                                      the TCP baseline side by side)
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
    seeds: Option<String>,
    sets: Vec<String>,
    jobs: usize,
    json: bool,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let cmd = it.next().ok_or("missing command")?;
    let mut a = Args {
        cmd,
        file: None,
        seed: None,
        out: None,
        seeds: None,
        sets: Vec::new(),
        jobs: 1,
        json: false,
    };
    while let Some(x) = it.next() {
        match x.as_str() {
            "--seed" => {
                let v = it.next().ok_or("--seed needs a value")?;
                a.seed = Some(v.parse().map_err(|_| format!("--seed {v:?}: not a u64"))?);
            }
            "--out" => a.out = Some(it.next().ok_or("--out needs a file")?),
            "--seeds" => a.seeds = Some(it.next().ok_or("--seeds needs e.g. 1-5")?),
            "--set" => a.sets.push(it.next().ok_or("--set needs KEY=VALUE")?),
            "--transport" => {
                let name = it.next().ok_or("--transport needs a transport name")?;
                a.sets.push(format!("transport={name}"));
            }
            "--jobs" => {
                let v = it.next().ok_or("--jobs needs a number")?;
                a.jobs = v
                    .parse()
                    .map_err(|_| format!("--jobs {v:?}: not a number"))?;
            }
            "--json" => a.json = true,
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

/// Write to standard output; a reader that went away (`hop-sim run … | head`) ends the output
/// quietly, as it does for other command-line tools, instead of a panic.
fn emit(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    match o.write_all(text.as_bytes()).and_then(|()| o.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(format!("cannot write to standard output: {e}"))
        }
        _ => Ok(()),
    }
}

fn real_main(a: Args) -> Result<(), String> {
    match a.cmd.as_str() {
        "run" | "check" => {
            if a.seeds.is_some() {
                return Err("--seeds is for compare; run takes one --seed".into());
            }
            let file = a.file.ok_or("missing SCENARIO.toml")?;
            let sc = if a.sets.is_empty() {
                Scenario::from_file(file.as_ref()).map_err(|e| format!("{file}: {e}"))?
            } else {
                // Several --set/--transport flags make one variant: their settings in order.
                let text = std::fs::read_to_string(&file)
                    .map_err(|e| format!("cannot read {file}: {e}"))?;
                Variant::parse(&a.sets.join(";"))?
                    .apply(&text)
                    .map_err(|e| format!("{file}: {e}"))?
            };
            let sim = Simulation::with_seed(sc, Registry::builtin(), a.seed)
                .map_err(|e| format!("{file}: {e}"))?;
            if a.cmd == "check" {
                emit(&format!("{file}: ok\n"))?;
                return Ok(());
            }
            let json = sim.run().to_json();
            match a.out {
                Some(out) => std::fs::write(&out, json + "\n")
                    .map_err(|e| format!("cannot write {out}: {e}"))?,
                None => emit(&(json + "\n"))?,
            }
            Ok(())
        }
        "compare" => {
            let file = a.file.ok_or("missing SCENARIO.toml")?;
            let text =
                std::fs::read_to_string(&file).map_err(|e| format!("cannot read {file}: {e}"))?;
            let seeds = parse_seeds(a.seeds.as_deref().unwrap_or("1-5"))?;
            let mut variants = vec![Variant::baseline()];
            for s in &a.sets {
                variants.push(Variant::parse(s)?);
            }
            let results =
                compare(&text, &seeds, &variants, a.jobs).map_err(|e| format!("{file}: {e}"))?;
            if a.json {
                let json = serde_json::to_string_pretty(&results).map_err(|e| e.to_string())?;
                emit(&(json + "\n"))?;
            } else {
                emit(&table(&file, &seeds, &results))?;
            }
            Ok(())
        }
        "bench" => {
            let sc = Scenario::from_toml(BENCH).map_err(|e| e.to_string())?;
            let sim = Simulation::with_seed(sc, Registry::builtin(), a.seed)
                .map_err(|e| e.to_string())?;
            let r = sim.run();
            let completed = r.flows.iter().filter(|f| f.completed).count();
            emit(&format!(
                "{{\"bench\":\"grid20-30flows\",\"virtual_seconds\":{:.3},\"wall_seconds\":{:.3},\"sim_seconds_per_wall_second\":{:.2},\"frames_sent\":{},\"flows_completed\":{},\"flows\":{}}}\n",
                r.virtual_seconds,
                r.wall_seconds,
                r.virtual_seconds / r.wall_seconds.max(1e-9),
                r.medium.frames_sent,
                completed,
                r.flows.len()
            ))?;
            Ok(())
        }
        "transports" => {
            for n in Registry::builtin().names() {
                emit(&format!("{n}\n"))?;
            }
            Ok(())
        }
        other => Err(format!("unknown command {other:?}\n{USAGE}")),
    }
}
