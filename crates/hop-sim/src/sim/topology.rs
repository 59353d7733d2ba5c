//! The links between nodes, their changes during a run (scenario events), and the route
//! tables built over them.

use std::collections::HashMap;

use hop_proto::StaticRoutes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{ns_from_secs, ns_from_us, Ev, Simulation};
use crate::error::ScenarioError;
use crate::routes::{shortest_paths, EdgeView};
use crate::scenario::{EventKind, EventSpec, Generator, NodesSpec, RouteMetric, TopologySpec};

/// Mixed into the run's seed for the random placement, so that it draws from a stream of its
/// own (the medium's draws do not move when a placement is added, and vice versa).
const LAYOUT_SEED_MIX: u64 = 0x6c61_796f_7574;

#[derive(Debug, Clone)]
pub(super) struct Edge {
    pub(super) from: u32,
    pub(super) to: u32,
    pub(super) loss: f64,
    pub(super) rate_mbps: f64,
    pub(super) delay_ns: u64,
    pub(super) up: bool,
}

/// A pair within carrier sense range but beyond decode range: `to` senses `from`'s
/// transmissions (and they interfere with its receptions) but cannot decode them.
#[derive(Debug, Clone)]
pub(super) struct SenseEdge {
    pub(super) to: u32,
    pub(super) delay_ns: u64,
    pub(super) up: bool,
}

fn dist(a: (f64, f64), b: (f64, f64)) -> f64 {
    ((a.0 - b.0).powi(2) + (a.1 - b.1).powi(2)).sqrt()
}

/// Whether the nodes at `pos` form one component when nodes at most `range` apart are linked.
fn connected(pos: &[(f64, f64)], range: f64) -> bool {
    let mut seen = vec![false; pos.len()];
    let mut stack = vec![0usize];
    let mut count = 0;
    if let Some(s) = seen.first_mut() {
        *s = true;
    }
    while let Some(v) = stack.pop() {
        count += 1;
        for (u, p) in pos.iter().enumerate() {
            if !seen[u] && dist(pos[v], *p) <= range {
                seen[u] = true;
                stack.push(u);
            }
        }
    }
    count == pos.len()
}

/// Node positions: given, or drawn uniformly in the area (seeded) until the radio links
/// connect every node, at most `placement_tries` times. None without a radio model.
pub(super) fn place(
    t: &TopologySpec,
    n: u32,
    seed: u64,
) -> Result<Option<Vec<(f64, f64)>>, ScenarioError> {
    if !t.has_radio() {
        return Ok(None);
    }
    if let Some(NodesSpec::Placed(v)) = &t.nodes {
        let mut pos = vec![(0.0, 0.0); v.len()];
        for p in v {
            pos[p.id as usize] = (p.x, p.y);
        }
        return Ok(Some(pos));
    }
    let (w, h) = (t.width_m.unwrap_or(0.0), t.height_m.unwrap_or(0.0));
    let range = t.range_m.unwrap_or(0.0);
    let mut rng = SmallRng::seed_from_u64(t.layout_seed.unwrap_or(seed) ^ LAYOUT_SEED_MIX);
    for _ in 0..t.placement_tries {
        let pos: Vec<(f64, f64)> = (0..n)
            .map(|_| (rng.gen::<f64>() * w, rng.gen::<f64>() * h))
            .collect();
        if connected(&pos, range) {
            return Ok(Some(pos));
        }
    }
    Err(ScenarioError::Invalid(format!(
        "topology: no connected placement of {n} nodes in {w} x {h} m with range_m = {range} \
         after {} tries; enlarge range_m or shrink the area",
        t.placement_tries
    )))
}

impl Simulation {
    pub(super) fn build_topology(&mut self, n: u32) -> Result<(), ScenarioError> {
        let t = self.sc.topology.clone();
        self.positions = place(&t, n, self.seed)?;
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        // Radio links carry their own loss (from their length); other generated links
        // take `topology.loss`.
        let mut radio: Vec<(u32, u32, f64)> = Vec::new();
        let mut sensed: Vec<(u32, u32)> = Vec::new();
        if let Some(pos) = &self.positions {
            let range = t.range_m.unwrap_or(0.0);
            let cs = t.carrier_sense_range_m.unwrap_or(range);
            for a in 0..n {
                for b in a + 1..n {
                    let d = dist(pos[a as usize], pos[b as usize]);
                    if d <= range {
                        radio.push((a, b, t.loss_at(d)));
                    } else if d <= cs {
                        sensed.push((a, b));
                    }
                }
            }
        }
        match t.generator {
            Generator::None | Generator::Random => {}
            Generator::Chain => pairs.extend((1..n).map(|i| (i - 1, i))),
            Generator::Star => pairs.extend((1..n).map(|i| (0, i))),
            Generator::Grid => {
                let (r, c) = (t.rows.unwrap_or(1), t.cols.unwrap_or(1));
                for y in 0..r {
                    for x in 0..c {
                        let id = y * c + x;
                        if x + 1 < c {
                            pairs.push((id, id + 1));
                        }
                        if y + 1 < r {
                            pairs.push((id, id + c));
                        }
                    }
                }
            }
        }
        let d = |a: u32, b: u32, loss: f64, rate: f64, delay: f64, up: bool| Edge {
            from: a,
            to: b,
            loss,
            rate_mbps: rate,
            delay_ns: ns_from_us(delay),
            up,
        };
        let add = |sim: &mut Self, e: Edge| {
            let key = (e.from, e.to);
            if let Some(&i) = sim.edge_ix.get(&key) {
                sim.edges[i] = e;
            } else {
                let i = sim.edges.len();
                sim.out[e.from as usize].push(i);
                sim.edge_ix.insert(key, i);
                sim.edges.push(e);
            }
        };
        for (a, b) in pairs {
            add(self, d(a, b, t.loss, t.rate_mbps, t.delay_us, true));
            add(self, d(b, a, t.loss, t.rate_mbps, t.delay_us, true));
        }
        for (a, b, loss) in radio {
            add(self, d(a, b, loss, t.rate_mbps, t.delay_us, true));
            add(self, d(b, a, loss, t.rate_mbps, t.delay_us, true));
        }
        for l in &t.links {
            let loss = l.loss.unwrap_or(t.loss);
            let rate = l.rate_mbps.unwrap_or(t.rate_mbps);
            let delay = l.delay_us.unwrap_or(t.delay_us);
            add(
                self,
                d(
                    l.a,
                    l.b,
                    l.loss_ab.unwrap_or(loss),
                    l.rate_ab_mbps.unwrap_or(rate),
                    delay,
                    !l.down,
                ),
            );
            add(
                self,
                d(
                    l.b,
                    l.a,
                    l.loss_ba.unwrap_or(loss),
                    l.rate_ba_mbps.unwrap_or(rate),
                    delay,
                    !l.down,
                ),
            );
        }
        // An explicit link between a sensing pair makes it a link like any other.
        for (a, b) in sensed {
            if self.edge_ix.contains_key(&(a, b)) || self.edge_ix.contains_key(&(b, a)) {
                continue;
            }
            for (from, to) in [(a, b), (b, a)] {
                self.sense_out[from as usize].push(SenseEdge {
                    to,
                    delay_ns: ns_from_us(t.delay_us),
                    up: true,
                });
            }
        }
        self.max_delay = self.edges.iter().map(|e| e.delay_ns).max().unwrap_or(0);
        Ok(())
    }

    /// Whether `to` senses `from`'s transmissions without decoding them.
    pub(super) fn senses(&self, from: usize, to: usize) -> bool {
        self.sense_out[from]
            .iter()
            .any(|s| s.up && s.to as usize == to)
    }

    /// Route tables: shortest paths (over up links only if `only_up`), then explicit routes.
    /// Destinations missing from the new computation keep their entry from `prev`.
    pub(super) fn compute_tables(
        &self,
        only_up: bool,
        prev: Option<&Vec<HashMap<u32, u32>>>,
    ) -> Vec<HashMap<u32, u32>> {
        let n = self.out.len() as u32;
        let views: Vec<EdgeView> = self
            .edges
            .iter()
            .filter(|e| !only_up || e.up)
            .map(|e| EdgeView {
                from: e.from,
                to: e.to,
                loss_fwd: e.loss,
                loss_rev: self
                    .edge_ix
                    .get(&(e.to, e.from))
                    .map(|&i| self.edges[i].loss)
                    .unwrap_or(1.0),
            })
            .collect();
        let mut tables = shortest_paths(n, &views, self.sc.routing.metric);
        if let Some(prev) = prev {
            for (t, p) in tables.iter_mut().zip(prev) {
                for (&dst, &via) in p {
                    t.entry(dst).or_insert(via);
                }
            }
        }
        for p in &self.sc.routing.paths {
            let path = &p.path;
            let (first, last) = (path[0], path[path.len() - 1]);
            for w in path.windows(2) {
                tables[w[0] as usize].insert(last, w[1]);
                tables[w[1] as usize].insert(first, w[0]);
            }
        }
        for r in &self.sc.routing.routes {
            tables[r.node as usize].insert(r.dst, r.via);
        }
        tables
    }

    /// Hops of the route from `src` to `dst` in the route tables the run starts with; None
    /// without a route (or on a loop).
    pub(super) fn route_hops(&self, src: u32, dst: u32) -> Option<u32> {
        let mut hops = 0u32;
        self.walk_route(src, dst, |_| hops += 1).then_some(hops)
    }

    /// The nodes of the route from `src` to `dst` in the tables the run starts with, both ends
    /// included; None without a route (or with a loop).
    pub(super) fn route_path(&self, src: u32, dst: u32) -> Option<Vec<u32>> {
        let mut path = vec![src];
        self.walk_route(src, dst, |n| path.push(n)).then_some(path)
    }

    /// Visit each node after `src` on its route to `dst` in the tables the run starts with;
    /// false without a route (or with a loop). Allocates nothing: flow sets ask it of every
    /// pair of nodes.
    fn walk_route(&self, src: u32, dst: u32, mut each: impl FnMut(u32)) -> bool {
        let (mut at, mut hops) = (src, 0usize);
        while at != dst {
            let Some(&next) = self.start_tables.get(at as usize).and_then(|t| t.get(&dst)) else {
                return false;
            };
            at = next;
            hops += 1;
            if hops > self.start_tables.len() {
                return false;
            }
            each(at);
        }
        true
    }

    pub(super) fn nodes_len(&self) -> usize {
        self.out.len()
    }

    pub(super) fn routes_for(&self, id: usize) -> Box<StaticRoutes> {
        Box::new(
            self.tables[id]
                .iter()
                .map(|(&d, &v)| (d, v))
                .collect::<StaticRoutes>(),
        )
    }

    pub(super) fn scenario_event(&mut self, idx: usize, rep: u32) {
        let e: EventSpec = self.sc.events[idx].clone();
        if let Some(every) = e.every {
            if e.count.is_none_or(|c| rep + 1 < c) {
                let t = self.now.saturating_add(ns_from_secs(every));
                self.push(t, Ev::Scenario { idx, rep: rep + 1 });
            }
        }
        let mut topo_changed = false;
        match e.kind {
            EventKind::LinkDown | EventKind::LinkUp => {
                let up = e.kind == EventKind::LinkUp;
                let (a, b) = (e.a.unwrap_or(0), e.b.unwrap_or(0));
                for k in [(a, b), (b, a)] {
                    if let Some(&i) = self.edge_ix.get(&k) {
                        self.edges[i].up = up;
                        topo_changed = true;
                    }
                }
            }
            EventKind::NodeDown | EventKind::NodeUp => {
                let up = e.kind == EventKind::NodeUp;
                let x = e.node.unwrap_or(0);
                for edge in &mut self.edges {
                    if edge.from == x || edge.to == x {
                        edge.up = up;
                        topo_changed = true;
                    }
                }
                // A node whose links are down is out of the others' hearing altogether.
                for (from, list) in self.sense_out.iter_mut().enumerate() {
                    for s in list {
                        if from == x as usize || s.to == x {
                            s.up = up;
                        }
                    }
                }
            }
            EventKind::SetLoss => {
                let (a, b) = (e.a.unwrap_or(0), e.b.unwrap_or(0));
                if let Some(l) = e.loss_ab.or(e.loss) {
                    if let Some(&i) = self.edge_ix.get(&(a, b)) {
                        self.edges[i].loss = l;
                    }
                }
                if let Some(l) = e.loss_ba.or(e.loss) {
                    if let Some(&i) = self.edge_ix.get(&(b, a)) {
                        self.edges[i].loss = l;
                    }
                }
                topo_changed = self.sc.routing.metric == RouteMetric::Etx;
            }
            EventKind::NodeCrash => self.crash(e.node.unwrap_or(0) as usize),
            EventKind::NodeRestart => self.restart(e.node.unwrap_or(0) as usize),
        }
        if topo_changed && self.sc.routing.recompute {
            self.tables = self.compute_tables(true, Some(&self.tables.clone()));
            for i in 0..self.nodes.len() {
                let r = self.routes_for(i);
                if let Some(node) = self.nodes[i].node.as_mut() {
                    node.set_routing(r);
                }
                self.kick(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::dist;
    use crate::{Registry, Scenario, ScenarioError, Simulation};

    fn build(text: &str) -> Result<Simulation, ScenarioError> {
        Simulation::new(Scenario::from_toml(text)?, Registry::builtin())
    }

    const RANDOM: &str = "[topology]\nnodes = 25\ngenerator = \"random\"\nwidth_m = 600.0\n\
                          height_m = 600.0\nrange_m = 200.0\ncarrier_sense_range_m = 350.0\n";

    #[test]
    fn loss_is_flat_then_rises_linearly_to_the_range() {
        let t = Scenario::from_toml(&format!("{RANDOM}loss = 0.1\nloss_at_range = 0.5\n"))
            .unwrap()
            .topology;
        assert_eq!(t.loss_at(0.0), 0.1);
        assert_eq!(t.loss_at(100.0), 0.1);
        assert!((t.loss_at(150.0) - 0.3).abs() < 1e-12);
        assert!((t.loss_at(200.0) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn random_placement_is_seeded_connected_and_links_follow_the_ranges() {
        let a = build(RANDOM).unwrap();
        let pos = a.positions.clone().unwrap();
        assert_eq!(pos.len(), 25);
        assert!(pos
            .iter()
            .all(|p| (0.0..=600.0).contains(&p.0) && (0.0..=600.0).contains(&p.1)));
        assert_eq!(build(RANDOM).unwrap().positions, a.positions);
        let other = build(&format!("seed = 2\n{RANDOM}")).unwrap();
        assert_ne!(other.positions, a.positions);
        let fixed = build(&format!("seed = 2\n{RANDOM}layout_seed = 1\n")).unwrap();
        assert_eq!(fixed.positions, a.positions, "layout_seed pins the layout");
        // Every pair of nodes has a route, links are at most range_m long, sensing pairs
        // lie between the two ranges, and some pair is hidden: two nodes with a common
        // neighbour that do not sense each other.
        for s in 0..25 {
            for d in 0..25 {
                assert!(s == d || a.route_hops(s, d).is_some(), "{s} -> {d}");
            }
        }
        for e in &a.edges {
            let d = dist(pos[e.from as usize], pos[e.to as usize]);
            assert!(d <= 200.0);
            assert!((a.sc.topology.loss_at(d) - e.loss).abs() < 1e-12);
        }
        let mut sensing = 0;
        for (from, list) in a.sense_out.iter().enumerate() {
            for s in list {
                let d = dist(pos[from], pos[s.to as usize]);
                assert!(d > 200.0 && d <= 350.0, "{d}");
                sensing += 1;
            }
        }
        assert!(sensing > 0);
        let linked = |x: usize, y: usize| a.edge_ix.contains_key(&(x as u32, y as u32));
        let hidden = (0..25).any(|b| {
            (0..25).any(|x| {
                (0..25).any(|y| {
                    x != y && linked(b, x) && linked(b, y) && !linked(x, y) && !a.senses(x, y)
                })
            })
        });
        assert!(
            hidden,
            "no hidden pair in a 25-node mesh with sensing at 1.75 x range"
        );
    }

    #[test]
    fn a_placement_that_cannot_connect_is_an_error() {
        let text = RANDOM
            .replace("range_m = 200.0", "range_m = 1.0")
            .replace("carrier_sense_range_m = 350.0", "placement_tries = 5");
        let e = build(&text).err().expect("unconnected").to_string();
        assert!(
            e.contains("no connected placement") && e.contains("5 tries"),
            "{e}"
        );
    }

    #[test]
    fn explicit_positions_give_links_by_distance() {
        let text = "[topology]\nrange_m = 100.0\ncarrier_sense_range_m = 150.0\n\
                    [[topology.nodes]]\nid = 1\nx = 90.0\ny = 0.0\n\
                    [[topology.nodes]]\nid = 0\nx = 0.0\ny = 0.0\n\
                    [[topology.nodes]]\nid = 2\nx = 210.0\ny = 0.0\n";
        let s = build(text).unwrap();
        assert_eq!(s.positions.as_ref().unwrap()[1], (90.0, 0.0));
        assert!(s.edge_ix.contains_key(&(0, 1)) && !s.edge_ix.contains_key(&(1, 2)));
        assert!(s.senses(1, 2) && s.senses(2, 1) && !s.senses(0, 2));
        for (bad, want) in [
            (text.replace("id = 2", "id = 1"), "given twice"),
            (text.replace("id = 2", "id = 7"), "ids must be 0..3"),
            (text.replace("range_m = 100.0\n", ""), "range_m is required"),
            (
                text.replace(
                    "carrier_sense_range_m = 150.0",
                    "carrier_sense_range_m = 50.0",
                ),
                "must be >= range_m",
            ),
            (
                "[topology]\nnodes = 3\ngenerator = \"chain\"\nrange_m = 5.0\n".to_string(),
                "needs node positions",
            ),
        ] {
            let e = build(&bad).err().expect("invalid").to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
