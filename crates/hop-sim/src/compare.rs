//! `hop-sim compare`: one scenario at several seeds and in several variants, reduced to the
//! figures issue 46 judges a busy mesh by (delivered bytes, mean and median flow goodput, the
//! share of flows that delivered anything, hop-weighted Jain, resend share, air per
//! delivered byte-hop), and each variant's mean and median goodput against the first's.
//!
//! A variant may run the flows over another transport: `transport=NAME` (or the
//! `--transport NAME` flag) sets the transport of every `[[flows]]` and `[[flow_sets]]`
//! entry, so that e.g. Hop and the `tcp` baseline run side by side on the same topology,
//! flows and seeds.

use serde::Serialize;

use crate::error::ScenarioError;
use crate::result::{jain, SimResult};
use crate::scenario::Scenario;
use crate::sim::Simulation;
use crate::transports::Registry;

/// One variant of the scenario: settings applied to its TOML before it is parsed.
#[derive(Debug, Clone, Serialize)]
pub struct Variant {
    pub name: String,
    /// (dotted key, value); a key without a dot is one of `[transports.hop]`.
    #[serde(skip)]
    pub sets: Vec<(String, toml::Value)>,
    /// Every flow and flow set runs over this transport (`transport=NAME`).
    #[serde(skip)]
    pub transport: Option<String>,
}

impl Variant {
    /// The scenario as written.
    pub fn baseline() -> Self {
        Variant {
            name: "as written".into(),
            sets: Vec::new(),
            transport: None,
        }
    }

    /// The scenario with every flow over `transport`.
    pub fn transport(transport: &str) -> Self {
        Variant {
            name: format!("transport={transport}"),
            sets: Vec::new(),
            transport: Some(transport.to_string()),
        }
    }

    /// `KEY=VALUE[;KEY=VALUE...]`. VALUE is read as a TOML value (`false`, `3`, `0.5`,
    /// `"200ms"`), or taken as a string when it is not one (`200ms`). The key `transport`
    /// names the transport every flow runs over.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut sets = Vec::new();
        let mut transport = None;
        for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("--set {part:?}: expected KEY=VALUE"))?;
            let (k, v) = (k.trim(), v.trim());
            if k.is_empty() {
                return Err(format!("--set {part:?}: empty key"));
            }
            if k == "transport" {
                let name = v.trim_matches('"');
                if name.is_empty() {
                    return Err(format!("--set {part:?}: empty transport name"));
                }
                transport = Some(name.to_string());
                continue;
            }
            let key = if k.contains('.') {
                k.to_string()
            } else {
                format!("transports.hop.{k}")
            };
            let value = toml::from_str::<toml::Table>(&format!("v = {v}"))
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or_else(|| toml::Value::String(v.to_string()));
            sets.push((key, value));
        }
        if sets.is_empty() && transport.is_none() {
            return Err(format!("--set {spec:?}: no KEY=VALUE"));
        }
        Ok(Variant {
            name: spec.trim().to_string(),
            sets,
            transport,
        })
    }

    /// The scenario text with this variant's settings applied.
    pub fn apply(&self, text: &str) -> Result<Scenario, ScenarioError> {
        let mut root: toml::Table = toml::from_str(text).map_err(|e| {
            ScenarioError::Parse(e.to_string().replace('\n', " ").trim().to_string())
        })?;
        for (key, value) in &self.sets {
            let parts: Vec<&str> = key.split('.').collect();
            let (last, path) = parts.split_last().expect("split yields one part at least");
            let mut t = &mut root;
            for p in path {
                let entry = t
                    .entry(p.to_string())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()));
                t = entry.as_table_mut().ok_or_else(|| {
                    ScenarioError::Invalid(format!("--set {key}: {p} is not a table"))
                })?;
            }
            t.insert(last.to_string(), value.clone());
        }
        if let Some(name) = &self.transport {
            for list in ["flows", "flow_sets"] {
                let Some(v) = root.get_mut(list) else {
                    continue;
                };
                let entries = v.as_array_mut().ok_or_else(|| {
                    ScenarioError::Invalid(format!("transport={name}: {list} is not an array"))
                })?;
                for e in entries {
                    if let Some(t) = e.as_table_mut() {
                        t.insert("transport".into(), toml::Value::String(name.clone()));
                    }
                }
            }
        }
        Scenario::from_table(root)
    }
}

/// Seeds as `1-5`, `1,3,7` or a mix (`1-3,9`).
pub fn parse_seeds(s: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("--seeds {s:?}: expected e.g. 1-5 or 1,3,7");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u64, u64) = (
                    a.trim().parse().map_err(|_| bad())?,
                    b.trim().parse().map_err(|_| bad())?,
                );
                if a > b || b - a >= 10_000 {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    if out.is_empty() {
        return Err(format!("--seeds {s:?}: no seed"));
    }
    Ok(out)
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct RunFigures {
    pub seed: u64,
    /// Flows that started before the run ended (the others are left out of every figure).
    pub flows: usize,
    pub delivered_bytes: u64,
    pub mean_goodput_bps: f64,
    pub median_goodput_bps: f64,
    /// Share of the flows that delivered at least one byte.
    pub started_share: f64,
    /// Share of the flows whose first byte arrived within [`FIRST_BYTE_WITHIN`] seconds of
    /// their start (issue 46: every flow starts within 10 s).
    pub first_byte_share: f64,
    /// Share of the flows that went more than [`STALL_LIMIT`] seconds without a new byte
    /// (from the start to the first byte, between deliveries, or to the end of the run).
    pub stalled_share: f64,
    pub hop_weighted_jain: Option<f64>,
    pub resend_share: Option<f64>,
    pub air_ns_per_byte_hop: Option<f64>,
}

/// The time within which a flow's first byte should arrive (issue 46, "every flow starts").
pub const FIRST_BYTE_WITHIN: f64 = 10.0;
/// The longest a running flow should go without a new byte (issue 46, "no flow stalls").
pub const STALL_LIMIT: f64 = 30.0;

/// A flow's goodput as the lab's report takes it: bytes over the time to the last byte for a
/// flow that delivered everything, and bytes over the time it had (its start to the end of
/// the run) for one the end cut off, so that a flow starved after a good start is not
/// credited with its early rate (Hop §5.3 measures long-lived flows at a point in time).
pub fn flow_goodput(r: &SimResult, f: &crate::FlowResult) -> f64 {
    if f.identical {
        return f.goodput_bps;
    }
    let had = r.virtual_seconds - f.start;
    if had > 0.0 {
        f.bytes_delivered as f64 * 8.0 / had
    } else {
        0.0
    }
}

fn median(xs: &mut [f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    let m = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[m]
    } else {
        (xs[m - 1] + xs[m]) / 2.0
    }
}

impl RunFigures {
    pub fn of(r: &SimResult) -> Self {
        let flows: Vec<&crate::FlowResult> = r
            .flows
            .iter()
            .filter(|f| f.start < r.virtual_seconds)
            .collect();
        let mut goodputs: Vec<f64> = flows.iter().map(|f| flow_goodput(r, f)).collect();
        // Hop §5.3.2: JFI = (Σ x_i h_i)² / (n Σ (x_i h_i)²), over the flows with a route.
        let weighted: Vec<f64> = flows
            .iter()
            .zip(&goodputs)
            .filter_map(|(f, g)| f.hops.map(|h| g * f64::from(h)))
            .collect();
        let n = flows.len();
        RunFigures {
            seed: r.seed,
            flows: n,
            delivered_bytes: flows.iter().map(|f| f.bytes_delivered).sum(),
            mean_goodput_bps: goodputs.iter().sum::<f64>() / n.max(1) as f64,
            median_goodput_bps: median(&mut goodputs),
            started_share: flows.iter().filter(|f| f.bytes_delivered > 0).count() as f64
                / n.max(1) as f64,
            first_byte_share: flows
                .iter()
                .filter(|f| {
                    f.first_delivery_time
                        .is_some_and(|t| t <= FIRST_BYTE_WITHIN)
                })
                .count() as f64
                / n.max(1) as f64,
            stalled_share: flows
                .iter()
                .filter(|f| f.longest_stall.is_some_and(|t| t > STALL_LIMIT))
                .count() as f64
                / n.max(1) as f64,
            hop_weighted_jain: jain(&weighted),
            resend_share: r.efficiency.data_resend_share,
            air_ns_per_byte_hop: r.efficiency.data_air_ns_per_byte_hop,
        }
    }
}

/// The runs of one variant.
#[derive(Debug, Clone, Serialize)]
pub struct VariantRuns {
    pub variant: Variant,
    pub runs: Vec<RunFigures>,
}

/// Run `text` at every seed in every variant, `jobs` runs at a time.
pub fn compare(
    text: &str,
    seeds: &[u64],
    variants: &[Variant],
    jobs: usize,
) -> Result<Vec<VariantRuns>, ScenarioError> {
    let mut work: Vec<(usize, Scenario, u64)> = Vec::new();
    for (vi, v) in variants.iter().enumerate() {
        let sc = v.apply(text)?;
        for &seed in seeds {
            // Fail before running anything if a variant's overrides are not accepted.
            Simulation::with_seed(sc.clone(), Registry::builtin(), Some(seed))?;
            work.push((vi, sc.clone(), seed));
        }
    }
    let jobs = jobs.clamp(1, work.len().max(1));
    let mut figures: Vec<Option<RunFigures>> = vec![None; work.len()];
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::Mutex::new(&mut figures);
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((_, sc, seed)) = work.get(i) else {
                    return;
                };
                let r = Simulation::with_seed(sc.clone(), Registry::builtin(), Some(*seed))
                    .expect("built once already")
                    .run();
                let f = RunFigures::of(&r);
                done.lock().expect("no run panicked")[i] = Some(f);
            });
        }
    });
    let mut out: Vec<VariantRuns> = variants
        .iter()
        .map(|v| VariantRuns {
            variant: v.clone(),
            runs: Vec::new(),
        })
        .collect();
    for ((vi, _, _), f) in work.iter().zip(figures) {
        out[*vi].runs.push(f.expect("every run finished"));
    }
    Ok(out)
}

/// Mean, min and max of the values present.
fn stats(xs: impl Iterator<Item = Option<f64>>) -> Option<(f64, f64, f64)> {
    let v: Vec<f64> = xs.flatten().collect();
    if v.is_empty() {
        return None;
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((mean, lo, hi))
}

/// Mean over a variant's runs of one figure.
fn mean_of(v: &VariantRuns, get: fn(&RunFigures) -> f64) -> f64 {
    v.runs.iter().map(get).sum::<f64>() / v.runs.len().max(1) as f64
}

/// The comparison as a text table: per variant, each figure's mean over the seeds and, under
/// it, its range; then the first variant's mean (and median) goodput divided by this
/// variant's, both averaged over the seeds first (with Hop as written first and
/// `transport=tcp` second, the tcp row reads Hop/TCP).
pub fn table(scenario: &str, seeds: &[u64], results: &[VariantRuns]) -> String {
    type Col = (&'static str, fn(&RunFigures) -> Option<f64>, usize);
    let cols: [Col; 9] = [
        ("delivered MB", |r| Some(r.delivered_bytes as f64 / 1e6), 2),
        ("mean Mb/s", |r| Some(r.mean_goodput_bps / 1e6), 3),
        ("median Mb/s", |r| Some(r.median_goodput_bps / 1e6), 3),
        ("flows >0 B", |r| Some(r.started_share), 2),
        ("1st B <=10s", |r| Some(r.first_byte_share), 2),
        ("stall >30s", |r| Some(r.stalled_share), 2),
        ("Jain (hops)", |r| r.hop_weighted_jain, 2),
        ("resends", |r| r.resend_share, 2),
        ("air ns/B/hop", |r| r.air_ns_per_byte_hop, 0),
    ];
    let seeds_s: Vec<String> = seeds.iter().map(u64::to_string).collect();
    let mut out = format!(
        "{scenario}: seeds {} (mean over seeds, [min, max] below)\n",
        seeds_s.join(",")
    );
    let w = results
        .iter()
        .map(|v| v.variant.name.len())
        .max()
        .unwrap_or(0)
        .max(7);
    out.push_str(&format!("{:w$}", "variant"));
    for (name, _, _) in &cols {
        out.push_str(&format!("  {name:>15}"));
    }
    out.push_str(&format!(
        "  {:>15}  {:>15}",
        "1st/this mean", "1st/this median"
    ));
    out.push('\n');
    let ratio = |first: f64, this: f64| -> String {
        if this > 0.0 && first.is_finite() {
            format!("{:>15.2}", first / this)
        } else {
            format!("{:>15}", "-")
        }
    };
    let first_mean = results.first().map(|v| mean_of(v, |r| r.mean_goodput_bps));
    let first_median = results
        .first()
        .map(|v| mean_of(v, |r| r.median_goodput_bps));
    for v in results {
        let mut mean_line = format!("{:w$}", v.variant.name);
        let mut range_line = format!("{:w$}", "");
        for (_, get, prec) in &cols {
            match stats(v.runs.iter().map(get)) {
                Some((m, lo, hi)) => {
                    mean_line.push_str(&format!("  {m:>15.prec$}"));
                    let r = format!("[{lo:.prec$}, {hi:.prec$}]");
                    range_line.push_str(&format!("  {r:>15}"));
                }
                None => {
                    mean_line.push_str(&format!("  {:>15}", "-"));
                    range_line.push_str(&format!("  {:>15}", ""));
                }
            }
        }
        if let (Some(fm), Some(fmed)) = (first_mean, first_median) {
            mean_line.push_str("  ");
            mean_line.push_str(&ratio(fm, mean_of(v, |r| r.mean_goodput_bps)));
            mean_line.push_str("  ");
            mean_line.push_str(&ratio(fmed, mean_of(v, |r| r.median_goodput_bps)));
        }
        out.push_str(&mean_line);
        out.push('\n');
        if v.runs.len() > 1 {
            out.push_str(range_line.trim_end());
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_and_seeds_parse() {
        let v = Variant::parse("next_hop_backpressure=false; medium.txop_us = 0").unwrap();
        assert_eq!(v.sets[0].0, "transports.hop.next_hop_backpressure");
        assert_eq!(v.sets[0].1, toml::Value::Boolean(false));
        assert_eq!(v.sets[1].0, "medium.txop_us");
        assert_eq!(v.sets[1].1, toml::Value::Integer(0));
        let t = Variant::parse("transport=tcp; medium.acked_retry_limit=4").unwrap();
        assert_eq!(t.transport.as_deref(), Some("tcp"));
        assert_eq!(t.sets.len(), 1);
        assert!(Variant::parse("transport=").is_err());
        let s = Variant::parse("bsyn_timeout=200ms").unwrap();
        assert_eq!(s.sets[0].1, toml::Value::String("200ms".into()));
        assert!(Variant::parse("oops").is_err());
        assert_eq!(parse_seeds("1-3,9").unwrap(), vec![1, 2, 3, 9]);
        assert!(parse_seeds("3-1").is_err() && parse_seeds("x").is_err());
    }

    #[test]
    fn a_variant_changes_the_scenario_it_names() {
        let text =
            "[topology]\nnodes = 2\ngenerator = \"chain\"\n[[flows]]\nsrc = 0\ndst = 1\nsize = 1\n";
        let sc = Variant::parse("medium.txop_us=0;x=1")
            .unwrap()
            .apply(text)
            .unwrap();
        assert_eq!(sc.medium.txop_us, 0.0);
        assert_eq!(sc.transports["hop"]["x"], toml::Value::Integer(1));
        // An override the transport does not know is an error before anything runs.
        let e = compare(text, &[1], &[Variant::parse("no_such_key=1").unwrap()], 1);
        assert!(e.unwrap_err().to_string().contains("no_such_key"));
        let e = Variant::parse("topology.nodes.x=1").unwrap().apply(text);
        assert!(e.unwrap_err().to_string().contains("not a table"));
        // transport=NAME moves every flow and flow set onto that transport.
        let sets = format!("{text}[[flow_sets]]\ncount = 1\nsize = 1\n");
        let sc = Variant::transport("tcp").apply(&sets).unwrap();
        assert!(sc.flows.iter().all(|f| f.transport == "tcp"));
        assert!(sc.flow_sets.iter().all(|f| f.transport == "tcp"));
        assert_eq!(sc.flows.len(), 1);
    }

    #[test]
    fn figures_follow_the_lab_and_the_paper() {
        // Two flows on a chain: 0->3 (3 hops) and 1->2 (1 hop); one seed, two variants,
        // two jobs, the same figures as one job.
        let text = "duration = 30.0\n[topology]\nnodes = 4\ngenerator = \"chain\"\n\
                    [[flows]]\nsrc = 0\ndst = 3\nsize = \"200KB\"\n\
                    [[flows]]\nsrc = 1\ndst = 2\nsize = \"200KB\"\n";
        let vs = [
            Variant::baseline(),
            Variant::parse("medium.txop_us=0").unwrap(),
        ];
        let a = compare(text, &[1, 2], &vs, 2).unwrap();
        let b = compare(text, &[1, 2], &vs, 1).unwrap();
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
        let f = &a[0].runs[0];
        assert_eq!((f.seed, f.flows, f.delivered_bytes), (1, 2, 400_000));
        assert_eq!(f.started_share, 1.0);
        let r = Simulation::with_seed(
            Scenario::from_toml(text).unwrap(),
            Registry::builtin(),
            Some(1),
        )
        .unwrap()
        .run();
        let (x, y) = (r.flows[0].goodput_bps, r.flows[1].goodput_bps);
        let jfi = (3.0 * x + y).powi(2) / (2.0 * ((3.0 * x).powi(2) + y * y));
        assert!((f.hop_weighted_jain.unwrap() - jfi).abs() < 1e-12);
        assert!((f.mean_goodput_bps - (x + y) / 2.0).abs() < 1e-6);
        assert!((f.median_goodput_bps - (x + y) / 2.0).abs() < 1e-6);
        let t = table("chain", &[1, 2], &a);
        assert!(
            t.contains("as written") && t.contains("medium.txop_us=0"),
            "{t}"
        );
    }

    #[test]
    fn a_flow_cut_off_by_the_end_counts_over_the_time_it_had() {
        // 0 -> 1 over a link that goes down for good at 4 s: its goodput is what it delivered
        // over the whole 10 s run, not over the time to its last byte.
        let text = "duration = 10.0\n[topology]\nnodes = 2\ngenerator = \"chain\"\n\
                    [[flows]]\nsrc = 0\ndst = 1\nsize = \"50MB\"\n\
                    [[events]]\nat = 4.0\nkind = \"link_down\"\na = 0\nb = 1\n";
        let r = Simulation::new(Scenario::from_toml(text).unwrap(), Registry::builtin())
            .unwrap()
            .run();
        let f = &r.flows[0];
        assert!(f.bytes_delivered > 0 && !f.identical);
        let g = flow_goodput(&r, f);
        assert!((g - f.bytes_delivered as f64 * 8.0 / 10.0).abs() < 1e-6);
        assert!(g < f.goodput_bps / 2.0, "{g} vs {}", f.goodput_bps);
    }
}
