//! Every scenario in examples/scenarios/, with its own seed and one other, gives the JSON
//! result recorded in tests/golden/examples.txt, byte for byte (less `wall_seconds`, the one field that is not a
//! function of the scenario and seed).
//!
//! The simulator is deterministic, so this pins the behaviour of every transport on every
//! example: a change meant to move no byte (a refactor, a rename, a new module layout) must
//! leave the digests as they are. A change that is meant to alter behaviour updates them on
//! purpose: `HOP_SIM_BLESS=1 cargo test --release -p hop-sim --test examples_golden`, and
//! the diff of examples.txt shows which scenarios moved. On a mismatch the new JSON is
//! written under the test's temporary directory so it can be compared with the old one
//! (`hop-sim run examples/scenarios/NAME.toml` at the earlier commit).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hop_sim::{Registry, Scenario, Simulation};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn golden_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/examples.txt")
}

/// 64-bit FNV-1a: a stable digest (std's hasher may change between Rust releases).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Seeds each scenario runs with: its own, and one more draw.
const SEEDS: [Option<u64>; 2] = [None, Some(101)];

/// The result's JSON without `wall_seconds`.
fn result_json(path: &Path, seed: Option<u64>) -> String {
    let sc = Scenario::from_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let r = Simulation::with_seed(sc, Registry::builtin(), seed)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .run();
    let mut v: serde_json::Value = serde_json::from_str(&r.to_json()).expect("result is JSON");
    v.as_object_mut()
        .expect("result is an object")
        .remove("wall_seconds");
    v.to_string()
}

fn recorded() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(golden_file()).unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, digest) = l.split_once(' ').expect("NAME DIGEST per line");
            (name.to_string(), digest.trim().to_string())
        })
        .collect()
}

#[test]
fn every_example_scenario_gives_its_recorded_json() {
    let dir = root().join("examples/scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("examples/scenarios exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no scenarios in {}", dir.display());

    let mut now = BTreeMap::new();
    for f in &files {
        let stem = f.file_stem().unwrap().to_string_lossy().to_string();
        for seed in SEEDS {
            let name = match seed {
                None => stem.clone(),
                Some(s) => format!("{stem}@{s}"),
            };
            let json = result_json(f, seed);
            let digest = format!("{:016x} {}", fnv1a(json.as_bytes()), json.len());
            now.insert(name, (digest, json));
        }
    }

    if std::env::var_os("HOP_SIM_BLESS").is_some() {
        let mut out = String::from(
            "# Digest (FNV-1a 64) and length of each example scenario's JSON result, less\n\
             # wall_seconds. Written by HOP_SIM_BLESS=1; see tests/examples_golden.rs.\n",
        );
        for (name, (digest, _)) in &now {
            out.push_str(&format!("{name} {digest}\n"));
        }
        std::fs::write(golden_file(), out).expect("write golden file");
        return;
    }

    let want = recorded();
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR")).join("examples_golden");
    let mut moved = Vec::new();
    for (name, (digest, json)) in &now {
        match want.get(name) {
            Some(w) if w == digest => {}
            other => {
                std::fs::create_dir_all(&tmp).expect("temporary directory");
                let out = tmp.join(format!("{name}.json"));
                std::fs::write(&out, json).expect("write new result");
                moved.push(format!(
                    "{name}: recorded {}, now {digest} (new JSON in {})",
                    other.map(String::as_str).unwrap_or("nothing"),
                    out.display()
                ));
            }
        }
    }
    for name in want.keys().filter(|n| !now.contains_key(*n)) {
        moved.push(format!("{name}: recorded, but no such scenario any more"));
    }
    assert!(
        moved.is_empty(),
        "example results changed (bless with HOP_SIM_BLESS=1 if that was meant):\n{}",
        moved.join("\n")
    );
}
