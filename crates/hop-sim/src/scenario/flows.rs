//! The `[[flows]]`, `[[flow_sets]]` and `[[events]]` tables.

use serde::Deserialize;

/// A byte count: an integer, or a string with a unit ("4KB", "1MB", "10 MiB"; KB = 1000).
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "toml::Value")]
pub enum Size {
    Bytes(u64),
    Text(String),
}

impl TryFrom<toml::Value> for Size {
    type Error = String;
    fn try_from(v: toml::Value) -> Result<Self, String> {
        match v {
            toml::Value::Integer(i) if i >= 0 => Ok(Size::Bytes(i as u64)),
            toml::Value::String(s) => Ok(Size::Text(s)),
            other => Err(format!(
                "size must be a number of bytes >= 0 or a string such as \"4KB\" or \"1MiB\", not {other}"
            )),
        }
    }
}

impl Size {
    pub fn bytes(&self) -> Result<u64, String> {
        match self {
            Size::Bytes(b) => Ok(*b),
            Size::Text(s) => parse_size(s),
        }
    }
}

pub(super) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("bad size {s:?}: expected e.g. 4096, \"4KB\", \"1MiB\""))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "kib" => 1024.0,
        "mib" => 1048576.0,
        "gib" => 1073741824.0,
        other => {
            return Err(format!(
                "bad size unit {other:?} in {s:?}: use B, KB, MB, GB, KiB, MiB or GiB"
            ))
        }
    };
    Ok((n * mult).round() as u64)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowSpec {
    pub src: u32,
    pub dst: u32,
    pub size: Size,
    /// Start time, seconds.
    #[serde(default)]
    pub start: f64,
    #[serde(default = "d_transport")]
    pub transport: String,
}

fn d_transport() -> String {
    "hop".to_string()
}

/// A flow's end in a flow set: a node id, or "random".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Endpoint {
    #[default]
    Random,
    Node(u32),
}

impl<'de> Deserialize<'de> for Endpoint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match toml::Value::deserialize(d)? {
            toml::Value::Integer(i) => u32::try_from(i)
                .map(Endpoint::Node)
                .map_err(|_| D::Error::custom(format!("{i} is not a node id"))),
            toml::Value::String(s) if s == "random" => Ok(Endpoint::Random),
            other => Err(D::Error::custom(format!(
                "src/dst must be a node id or \"random\", not {other}"
            ))),
        }
    }
}

/// A flow set's size: one size, or `[min, max]` drawn uniformly per flow.
#[derive(Debug, Clone)]
pub enum SizeRange {
    Fixed(Size),
    Range(Size, Size),
}

impl<'de> Deserialize<'de> for SizeRange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match toml::Value::deserialize(d)? {
            toml::Value::Array(a) if a.len() == 2 => {
                let mut it = a.into_iter().map(Size::try_from);
                match (it.next(), it.next()) {
                    (Some(Ok(lo)), Some(Ok(hi))) => Ok(SizeRange::Range(lo, hi)),
                    (Some(Err(e)), _) | (_, Some(Err(e))) => Err(D::Error::custom(e)),
                    _ => unreachable!("two elements"),
                }
            }
            toml::Value::Array(_) => Err(D::Error::custom(
                "size as a range is [min, max], e.g. [\"100KB\", \"10MB\"]",
            )),
            v => Size::try_from(v)
                .map(SizeRange::Fixed)
                .map_err(D::Error::custom),
        }
    }
}

impl SizeRange {
    /// (min, max) bytes.
    pub fn bounds(&self) -> Result<(u64, u64), String> {
        match self {
            SizeRange::Fixed(s) => s.bytes().map(|b| (b, b)),
            SizeRange::Range(lo, hi) => {
                let (lo, hi) = (lo.bytes()?, hi.bytes()?);
                if lo > hi {
                    return Err(format!("size range [{lo}, {hi}]: min above max"));
                }
                Ok((lo, hi))
            }
        }
    }
}

/// `count` flows drawn at random, expanded into ordinary flows when the simulation is built
/// (after the topology and its routes, which the draw needs).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowSetSpec {
    /// Flows in the set; with `each_source`, flows per source.
    pub count: u32,
    /// Every node the set allows as a source (one with a destination at `min_hops` or more)
    /// opens `count` flows, to destinations drawn among its own.
    #[serde(default)]
    pub each_source: bool,
    #[serde(default)]
    pub src: Endpoint,
    #[serde(default)]
    pub dst: Endpoint,
    /// The route from src to dst has at least this many hops.
    #[serde(default = "d_min_hops")]
    pub min_hops: u32,
    pub size: SizeRange,
    /// Every flow starts here, unless `rate_per_s` or `start_window` is set.
    #[serde(default)]
    pub start: f64,
    /// Poisson arrivals from `start` on: exponential gaps of mean 1 / rate_per_s.
    #[serde(default)]
    pub rate_per_s: Option<f64>,
    /// Starts drawn uniformly in [from, to).
    #[serde(default)]
    pub start_window: Option<[f64; 2]>,
    #[serde(default = "d_transport")]
    pub transport: String,
}

fn d_min_hops() -> u32 {
    1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Link `a`-`b` stops carrying frames in both directions.
    LinkDown,
    LinkUp,
    /// Every link of `node` goes down; the node keeps its memory.
    NodeDown,
    NodeUp,
    /// `node` loses all state and stops sending and receiving.
    NodeCrash,
    /// `node` comes back as a fresh node (same id and transports).
    NodeRestart,
    /// Change the loss rate of link `a`-`b` (`loss`, or `loss_ab`/`loss_ba`).
    SetLoss,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSpec {
    /// Seconds.
    pub at: f64,
    pub kind: EventKind,
    #[serde(default)]
    pub node: Option<u32>,
    #[serde(default)]
    pub a: Option<u32>,
    #[serde(default)]
    pub b: Option<u32>,
    #[serde(default)]
    pub loss: Option<f64>,
    #[serde(default)]
    pub loss_ab: Option<f64>,
    #[serde(default)]
    pub loss_ba: Option<f64>,
    /// Repeat the event every `every` seconds...
    #[serde(default)]
    pub every: Option<f64>,
    /// ...this many times in total (default: until the end of the run).
    #[serde(default)]
    pub count: Option<u32>,
}
