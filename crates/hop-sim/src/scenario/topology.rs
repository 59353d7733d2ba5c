//! The `[topology]` and `[routing]` tables: nodes, positions and the radio model, links,
//! routes.

use serde::Deserialize;

use super::*;

fn default_rate() -> f64 {
    DEFAULT_RATE_MBPS
}

/// Radio model: links shorter than this fraction of `range_m` lose nothing beyond
/// `topology.loss`; from there the loss rises linearly to `loss_at_range` at the range.
pub const DEFAULT_LOSS_FREE_FRACTION: f64 = 0.5;
/// Radio model: the loss of a link exactly `range_m` long.
pub const DEFAULT_LOSS_AT_RANGE: f64 = 0.5;
/// Random placements drawn before giving up on a connected one.
pub const DEFAULT_PLACEMENT_TRIES: u32 = 1000;
/// Node positions make the link set quadratic in the node count: a bound that keeps building
/// it (and redrawing it) well under a second.
pub const MAX_PLACED_NODES: u32 = 5000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Generator {
    /// No generated links: only `[[topology.links]]`.
    None,
    /// 0 - 1 - 2 - ... - (nodes-1).
    Chain,
    /// `rows` x `cols` grid, 4-neighbourhood, node id = row * cols + col.
    Grid,
    /// Node 0 is the hub, every other node a leaf.
    Star,
    /// `nodes` placed uniformly at random in `width_m` x `height_m` (redrawn until the
    /// radio links connect them); links from the radio model.
    Random,
}

/// `topology.nodes`: a count, or one `[[topology.nodes]]` table (`id`, `x`, `y`) per node.
#[derive(Debug, Clone)]
pub enum NodesSpec {
    Count(u32),
    Placed(Vec<NodePos>),
}

/// A node's position in metres.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodePos {
    pub id: u32,
    pub x: f64,
    pub y: f64,
}

impl<'de> Deserialize<'de> for NodesSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match toml::Value::deserialize(d)? {
            toml::Value::Integer(i) => u32::try_from(i)
                .map(NodesSpec::Count)
                .map_err(|_| D::Error::custom(format!("nodes = {i}: not a node count"))),
            v @ toml::Value::Array(_) => v
                .try_into::<Vec<NodePos>>()
                .map(NodesSpec::Placed)
                .map_err(|e| D::Error::custom(format!("[[topology.nodes]]: {e}"))),
            other => Err(D::Error::custom(format!(
                "nodes must be a node count or [[topology.nodes]] tables with id, x, y; not {other}"
            ))),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologySpec {
    /// Number of nodes (ids are 0..nodes; for a grid, defaults to rows * cols), or their
    /// positions.
    #[serde(default)]
    pub nodes: Option<NodesSpec>,
    #[serde(default = "d_gen")]
    pub generator: Generator,
    #[serde(default)]
    pub rows: Option<u32>,
    #[serde(default)]
    pub cols: Option<u32>,
    /// Defaults for generated links (and for explicit links that omit them).
    #[serde(default)]
    pub loss: f64,
    #[serde(default = "default_rate")]
    pub rate_mbps: f64,
    #[serde(default = "d_delay")]
    pub delay_us: f64,
    #[serde(default)]
    pub links: Vec<LinkSpec>,
    /// Random placement: the area, metres.
    #[serde(default)]
    pub width_m: Option<f64>,
    #[serde(default)]
    pub height_m: Option<f64>,
    /// Radio model: nodes at most this far apart share a link (they decode each other).
    #[serde(default)]
    pub range_m: Option<f64>,
    /// Radio model: nodes farther apart than `range_m` but at most this far sense each
    /// other's transmissions (defer, and collide at a receiver) without decoding them.
    /// Default: `range_m` (carrier sense range = decode range).
    #[serde(default)]
    pub carrier_sense_range_m: Option<f64>,
    #[serde(default = "d_loss_free")]
    pub loss_free_fraction: f64,
    #[serde(default = "d_loss_at_range")]
    pub loss_at_range: f64,
    /// Seed of the random placement; default: the run's seed.
    #[serde(default)]
    pub layout_seed: Option<u64>,
    #[serde(default = "d_tries")]
    pub placement_tries: u32,
}

fn d_loss_free() -> f64 {
    DEFAULT_LOSS_FREE_FRACTION
}
fn d_loss_at_range() -> f64 {
    DEFAULT_LOSS_AT_RANGE
}
fn d_tries() -> u32 {
    DEFAULT_PLACEMENT_TRIES
}

impl TopologySpec {
    /// Whether links come from node positions and the radio model.
    pub fn has_radio(&self) -> bool {
        self.generator == Generator::Random || matches!(self.nodes, Some(NodesSpec::Placed(_)))
    }

    /// The loss of a link `d` metres long under the radio model: `loss` up to
    /// `loss_free_fraction * range_m`, then rising linearly to `loss_at_range` at the range.
    pub fn loss_at(&self, d: f64) -> f64 {
        let range = self.range_m.unwrap_or(0.0);
        let free = self.loss_free_fraction * range;
        if d <= free || range <= free {
            return self.loss;
        }
        let f = ((d - free) / (range - free)).clamp(0.0, 1.0);
        self.loss + (self.loss_at_range - self.loss).max(0.0) * f
    }
}

fn d_gen() -> Generator {
    Generator::None
}
/// A few hundred metres of radio propagation: 1 µs.
fn d_delay() -> f64 {
    1.0
}

/// An undirected link; per-direction values override the symmetric ones.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    pub a: u32,
    pub b: u32,
    #[serde(default)]
    pub loss: Option<f64>,
    #[serde(default)]
    pub loss_ab: Option<f64>,
    #[serde(default)]
    pub loss_ba: Option<f64>,
    #[serde(default)]
    pub rate_mbps: Option<f64>,
    #[serde(default)]
    pub rate_ab_mbps: Option<f64>,
    #[serde(default)]
    pub rate_ba_mbps: Option<f64>,
    #[serde(default)]
    pub delay_us: Option<f64>,
    /// The link starts down.
    #[serde(default)]
    pub down: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RouteMetric {
    /// Fewest hops.
    #[default]
    Hops,
    /// Expected transmission count 1/((1-p_fwd)(1-p_rev)).
    Etx,
    /// Only `[[routing.routes]]` / `[[routing.paths]]`.
    Static,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RoutingSpec {
    #[serde(default)]
    pub metric: RouteMetric,
    /// Recompute shortest paths over the links that are up after every topology event.
    /// Destinations that become unreachable keep their previous next hop (§3.4).
    #[serde(default)]
    pub recompute: bool,
    /// Explicit entries; they override computed ones.
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    /// A path installs forward routes to its last node and reverse routes to its first.
    #[serde(default)]
    pub paths: Vec<PathSpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    pub node: u32,
    pub dst: u32,
    pub via: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathSpec {
    pub path: Vec<u32>,
}
