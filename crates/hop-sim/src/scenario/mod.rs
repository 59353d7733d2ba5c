//! Scenario files (TOML): topology, medium, routing, flows, events and transport overrides.
//!
//! Every table rejects unknown keys so that a typo in a scenario is an error, not a silently
//! ignored setting. `docs/scenarios.md` documents every key.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::error::ScenarioError;

mod flows;
mod medium;
mod topology;

pub use flows::*;
pub use medium::*;
pub use topology::*;

/// Default virtual-time limit of a run, seconds.
pub const DEFAULT_DURATION_S: f64 = 600.0;

/// A whole scenario.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Free-form name reported in the result.
    #[serde(default)]
    pub name: String,
    /// Seed of every random draw (medium losses, backoff, node randomness, byte patterns).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Virtual-time limit in seconds (alias `stop_at`).
    #[serde(default, alias = "stop_at")]
    pub duration: Option<f64>,
    /// Keep running until `duration` even when every flow is done.
    #[serde(default)]
    pub run_to_end: bool,
    #[serde(default)]
    pub medium: MediumSpec,
    pub topology: TopologySpec,
    #[serde(default)]
    pub routing: RoutingSpec,
    #[serde(default)]
    pub flows: Vec<FlowSpec>,
    /// Flows drawn at random (seeded), expanded into `flows` when the simulation is built.
    #[serde(default)]
    pub flow_sets: Vec<FlowSetSpec>,
    #[serde(default)]
    pub events: Vec<EventSpec>,
    /// Per-transport configuration overrides, keyed by transport name.
    #[serde(default)]
    pub transports: BTreeMap<String, toml::Table>,
}

fn default_seed() -> u64 {
    1
}

impl NodesSpec {
    /// The number of nodes.
    pub fn len(&self) -> u32 {
        match self {
            NodesSpec::Count(n) => *n,
            NodesSpec::Placed(v) => v.len() as u32,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Scenario {
    /// Parse a scenario from TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ScenarioError> {
        let sc: Scenario = toml::from_str(text).map_err(|e| {
            ScenarioError::Parse(e.to_string().replace('\n', " ").trim().to_string())
        })?;
        sc.validate()?;
        Ok(sc)
    }

    /// A scenario from an already parsed TOML table (e.g. a file with settings applied).
    pub fn from_table(table: toml::Table) -> Result<Self, ScenarioError> {
        let sc: Scenario = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| {
                ScenarioError::Parse(e.to_string().replace('\n', " ").trim().to_string())
            })?;
        sc.validate()?;
        Ok(sc)
    }

    /// Read and parse a scenario file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ScenarioError::Io(format!("{}: {e}", path.display())))?;
        Self::from_toml(&text)
    }

    /// Number of nodes after applying the generator.
    pub fn node_count(&self) -> Result<u32, ScenarioError> {
        let t = &self.topology;
        match t.generator {
            Generator::Grid => {
                let (r, c) = match (t.rows, t.cols) {
                    (Some(r), Some(c)) if r > 0 && c > 0 => (r, c),
                    _ => {
                        return Err(ScenarioError::Invalid(
                            "topology.generator = \"grid\" needs rows and cols >= 1".into(),
                        ))
                    }
                };
                let n = r.checked_mul(c).ok_or_else(|| {
                    ScenarioError::Invalid("topology: rows * cols is too large".into())
                })?;
                if let Some(k) = t.nodes.as_ref().map(NodesSpec::len) {
                    if k != n {
                        return Err(ScenarioError::Invalid(format!(
                            "topology: nodes = {k} but rows * cols = {n}; drop `nodes` or fix it"
                        )));
                    }
                }
                Ok(n)
            }
            _ => t.nodes.as_ref().map(NodesSpec::len).ok_or_else(|| {
                ScenarioError::Invalid("topology.nodes is required (node ids are 0..nodes)".into())
            }),
        }
    }

    /// Checks that do not need the transport registry.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let inv = |m: String| Err(ScenarioError::Invalid(m));
        let n = self.node_count()?;
        if n == 0 {
            return inv("topology.nodes must be at least 1".into());
        }
        if n > 100_000 {
            return inv(format!("topology.nodes = {n} is too large (limit 100000)"));
        }
        let node_ok = |what: &str, id: u32| -> Result<(), ScenarioError> {
            if id >= n {
                Err(ScenarioError::Invalid(format!(
                    "{what}: node {id} does not exist (ids are 0..{n})"
                )))
            } else {
                Ok(())
            }
        };
        if let Some(d) = self.duration {
            if !(d.is_finite() && d > 0.0) {
                return inv(format!(
                    "duration = {d}: must be a positive number of seconds"
                ));
            }
        }
        let m = &self.medium;
        for (k, v) in [
            ("medium.preamble_us", m.preamble_us),
            ("medium.difs_us", m.difs_us),
            ("medium.sifs_us", m.sifs_us),
            ("medium.slot_us", m.slot_us),
            ("medium.txop_us", m.txop_us),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return inv(format!("{k} = {v}: must be >= 0"));
            }
        }
        if !(m.ack_rate_mbps.is_finite() && m.ack_rate_mbps > 0.0) {
            return inv("medium.ack_rate_mbps must be > 0".into());
        }
        if m.cw_min > m.cw_max || m.cw_max > 65535 {
            return inv("medium: need cw_min <= cw_max <= 65535".into());
        }
        if m.control_cw_min > m.control_cw_max || m.control_cw_max > 65535 {
            return inv("medium: need control_cw_min <= control_cw_max <= 65535".into());
        }
        if m.queue_frames == 0 || m.queue_frames > 100_000 {
            return inv("medium.queue_frames must be in 1..=100000".into());
        }
        if m.mac_queue_frames == 0 || m.mac_queue_frames > 100_000 {
            return inv("medium.mac_queue_frames must be in 1..=100000".into());
        }
        if !(m.mac_queue_max_delay_ms.is_finite() && m.mac_queue_max_delay_ms >= 0.0) {
            return inv("medium.mac_queue_max_delay_ms must be >= 0".into());
        }
        if m.retry_limit > 1000 {
            return inv("medium.retry_limit must be <= 1000".into());
        }
        if m.acked_retry_limit > 1000 {
            return inv("medium.acked_retry_limit must be <= 1000".into());
        }
        if !m.link_acks && (m.retry_limit > 0 || m.acked_retry_limit > 0 || m.data_arq) {
            return inv(
                "medium.link_acks = false: nothing is retried without link acknowledgements; \
                 set retry_limit = 0 and acked_retry_limit = 0 (and data_arq = false)"
                    .into(),
            );
        }
        let t = &self.topology;
        check_loss("topology.loss", t.loss)?;
        check_rate("topology.rate_mbps", t.rate_mbps)?;
        check_delay("topology.delay_us", t.delay_us)?;
        for (i, l) in t.links.iter().enumerate() {
            let w = format!("topology.links[{i}]");
            node_ok(&w, l.a)?;
            node_ok(&w, l.b)?;
            if l.a == l.b {
                return inv(format!("{w}: a link needs two different nodes"));
            }
            for v in [l.loss, l.loss_ab, l.loss_ba].into_iter().flatten() {
                check_loss(&w, v)?;
            }
            for v in [l.rate_mbps, l.rate_ab_mbps, l.rate_ba_mbps]
                .into_iter()
                .flatten()
            {
                check_rate(&w, v)?;
            }
            if let Some(d) = l.delay_us {
                check_delay(&w, d)?;
            }
        }
        self.validate_radio(n)?;
        for (i, r) in self.routing.routes.iter().enumerate() {
            let w = format!("routing.routes[{i}]");
            node_ok(&w, r.node)?;
            node_ok(&w, r.dst)?;
            node_ok(&w, r.via)?;
        }
        for (i, p) in self.routing.paths.iter().enumerate() {
            let w = format!("routing.paths[{i}]");
            if p.path.len() < 2 {
                return inv(format!("{w}: a path needs at least two nodes"));
            }
            for &x in &p.path {
                node_ok(&w, x)?;
            }
        }
        for (i, f) in self.flows.iter().enumerate() {
            let w = format!("flows[{i}]");
            node_ok(&w, f.src)?;
            node_ok(&w, f.dst)?;
            if f.src == f.dst {
                return inv(format!("{w}: src and dst are both {}", f.src));
            }
            let size = f
                .size
                .bytes()
                .map_err(|e| ScenarioError::Invalid(format!("{w}: {e}")))?;
            if size > 1 << 34 {
                return inv(format!("{w}: size {size} is too large (limit 16 GiB)"));
            }
            if !(f.start.is_finite() && f.start >= 0.0) {
                return inv(format!("{w}: start must be >= 0 seconds"));
            }
        }
        for (i, fs) in self.flow_sets.iter().enumerate() {
            let w = format!("flow_sets[{i}]");
            if fs.count == 0 || fs.count > 1_000_000 {
                return inv(format!("{w}: count must be in 1..=1000000"));
            }
            for e in [fs.src, fs.dst] {
                if let Endpoint::Node(x) = e {
                    node_ok(&w, x)?;
                }
            }
            if let (Endpoint::Node(a), Endpoint::Node(b)) = (fs.src, fs.dst) {
                if a == b {
                    return inv(format!("{w}: src and dst are both {a}"));
                }
            }
            if fs.min_hops == 0 {
                return inv(format!("{w}: min_hops must be at least 1"));
            }
            let (_, hi) = fs
                .size
                .bounds()
                .map_err(|e| ScenarioError::Invalid(format!("{w}: {e}")))?;
            if hi > 1 << 34 {
                return inv(format!("{w}: size {hi} is too large (limit 16 GiB)"));
            }
            if !(fs.start.is_finite() && fs.start >= 0.0) {
                return inv(format!("{w}: start must be >= 0 seconds"));
            }
            if let Some(r) = fs.rate_per_s {
                if !(r.is_finite() && r > 0.0) {
                    return inv(format!("{w}: rate_per_s must be > 0"));
                }
            }
            if let Some([a, b]) = fs.start_window {
                if !(a.is_finite() && b.is_finite() && 0.0 <= a && a <= b) {
                    return inv(format!(
                        "{w}: start_window = [{a}, {b}] needs 0 <= from <= to seconds"
                    ));
                }
                if fs.rate_per_s.is_some() {
                    return inv(format!(
                        "{w}: give rate_per_s (Poisson arrivals) or start_window (uniform), not both"
                    ));
                }
            }
        }
        for (i, e) in self.events.iter().enumerate() {
            let w = format!("events[{i}] ({:?})", e.kind);
            if !(e.at.is_finite() && e.at >= 0.0) {
                return inv(format!("{w}: at must be >= 0 seconds"));
            }
            if let Some(ev) = e.every {
                if !(ev.is_finite() && ev > 0.0) {
                    return inv(format!("{w}: every must be > 0 seconds"));
                }
            }
            if e.count.is_some() && e.every.is_none() {
                return inv(format!("{w}: count needs every"));
            }
            match e.kind {
                EventKind::LinkDown | EventKind::LinkUp | EventKind::SetLoss => {
                    let (Some(a), Some(b)) = (e.a, e.b) else {
                        return inv(format!("{w}: needs a and b (the link's nodes)"));
                    };
                    node_ok(&w, a)?;
                    node_ok(&w, b)?;
                    if e.node.is_some() {
                        return inv(format!("{w}: takes a and b, not node"));
                    }
                    if e.kind == EventKind::SetLoss {
                        if e.loss.is_none() && e.loss_ab.is_none() && e.loss_ba.is_none() {
                            return inv(format!("{w}: needs loss, loss_ab or loss_ba"));
                        }
                        for v in [e.loss, e.loss_ab, e.loss_ba].into_iter().flatten() {
                            check_loss(&w, v)?;
                        }
                    } else if e.loss.is_some() || e.loss_ab.is_some() || e.loss_ba.is_some() {
                        return inv(format!("{w}: loss only applies to set_loss"));
                    }
                }
                EventKind::NodeDown
                | EventKind::NodeUp
                | EventKind::NodeCrash
                | EventKind::NodeRestart => {
                    let Some(x) = e.node else {
                        return inv(format!("{w}: needs node"));
                    };
                    node_ok(&w, x)?;
                    if e.a.is_some() || e.b.is_some() || e.loss.is_some() {
                        return inv(format!("{w}: takes node only"));
                    }
                }
            }
        }
        Ok(())
    }
}

impl Scenario {
    /// Node positions, the radio range and the placement area.
    fn validate_radio(&self, n: u32) -> Result<(), ScenarioError> {
        let inv = |m: String| Err(ScenarioError::Invalid(m));
        let t = &self.topology;
        if !t.has_radio() {
            for (k, set) in [
                ("width_m", t.width_m.is_some()),
                ("height_m", t.height_m.is_some()),
                ("range_m", t.range_m.is_some()),
                ("carrier_sense_range_m", t.carrier_sense_range_m.is_some()),
                ("layout_seed", t.layout_seed.is_some()),
            ] {
                if set {
                    return inv(format!(
                        "topology.{k} needs node positions: generator = \"random\" or \
                         [[topology.nodes]] tables with id, x, y"
                    ));
                }
            }
            return Ok(());
        }
        if n > MAX_PLACED_NODES {
            return inv(format!(
                "topology: {n} placed nodes is too many (limit {MAX_PLACED_NODES})"
            ));
        }
        let Some(range) = t.range_m else {
            return inv("topology.range_m is required with node positions".into());
        };
        if !(range.is_finite() && range > 0.0) {
            return inv(format!("topology.range_m = {range}: must be > 0 metres"));
        }
        if let Some(cs) = t.carrier_sense_range_m {
            if !(cs.is_finite() && cs >= range) {
                return inv(format!(
                    "topology.carrier_sense_range_m = {cs}: must be >= range_m ({range})"
                ));
            }
        }
        if !(0.0..=1.0).contains(&t.loss_free_fraction) {
            return inv("topology.loss_free_fraction must be in 0..=1".into());
        }
        check_loss("topology.loss_at_range", t.loss_at_range)?;
        match (&t.nodes, t.generator) {
            (Some(NodesSpec::Placed(v)), Generator::None) => {
                let mut seen = vec![false; v.len()];
                for p in v {
                    let w = format!("[[topology.nodes]] id = {}", p.id);
                    if !(p.x.is_finite() && p.y.is_finite()) {
                        return inv(format!("{w}: x and y must be finite metres"));
                    }
                    match seen.get_mut(p.id as usize) {
                        Some(s) if !*s => *s = true,
                        Some(_) => return inv(format!("{w}: given twice")),
                        None => {
                            return inv(format!(
                                "{w}: ids must be 0..{} (one table per node)",
                                v.len()
                            ))
                        }
                    }
                }
            }
            (Some(NodesSpec::Placed(_)), g) => {
                return inv(format!(
                    "topology: [[topology.nodes]] positions go with generator = \"none\" \
                     (the default), not {g:?}"
                ));
            }
            (_, Generator::Random) => {
                for (k, v) in [("width_m", t.width_m), ("height_m", t.height_m)] {
                    match v {
                        Some(x) if x.is_finite() && x >= 0.0 => {}
                        Some(x) => return inv(format!("topology.{k} = {x}: must be >= 0")),
                        None => {
                            return inv(format!(
                                "topology.{k} is required with generator = \"random\""
                            ))
                        }
                    }
                }
                if t.placement_tries == 0 {
                    return inv("topology.placement_tries must be at least 1".into());
                }
            }
            _ => {}
        }
        Ok(())
    }
}

fn check_loss(w: &str, v: f64) -> Result<(), ScenarioError> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(ScenarioError::Invalid(format!(
            "{w}: loss {v} must be a fraction in 0..=1"
        )))
    }
}

fn check_rate(w: &str, v: f64) -> Result<(), ScenarioError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(ScenarioError::Invalid(format!(
            "{w}: rate {v} Mb/s must be > 0"
        )))
    }
}

fn check_delay(w: &str, v: f64) -> Result<(), ScenarioError> {
    if v.is_finite() && (0.0..=60e6).contains(&v) {
        Ok(())
    } else {
        Err(ScenarioError::Invalid(format!(
            "{w}: delay {v} µs must be in 0..=60000000"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4KB").unwrap(), 4000);
        assert_eq!(parse_size("1 MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("12").unwrap(), 12);
        assert!(parse_size("3 parsecs").is_err());
    }

    #[test]
    fn unknown_key_rejected() {
        let e = Scenario::from_toml("[topology]\nnodes = 2\nnodez = 3\n").unwrap_err();
        assert!(e.to_string().contains("nodez"), "{e}");
    }
}
