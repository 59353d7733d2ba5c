//! The links between nodes, their changes during a run (scenario events), and the route
//! tables built over them.

use std::collections::HashMap;

use hop_proto::StaticRoutes;

use super::{ns_from_secs, ns_from_us, Ev, Simulation};
use crate::error::ScenarioError;
use crate::routes::{shortest_paths, EdgeView};
use crate::scenario::{EventKind, EventSpec, Generator, RouteMetric};

#[derive(Debug, Clone)]
pub(super) struct Edge {
    pub(super) from: u32,
    pub(super) to: u32,
    pub(super) loss: f64,
    pub(super) rate_mbps: f64,
    pub(super) delay_ns: u64,
    pub(super) up: bool,
}

impl Simulation {
    pub(super) fn build_topology(&mut self, n: u32) -> Result<(), ScenarioError> {
        let t = self.sc.topology.clone();
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        match t.generator {
            Generator::None => {}
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
        self.max_delay = self.edges.iter().map(|e| e.delay_ns).max().unwrap_or(0);
        Ok(())
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
            if e.count.map_or(true, |c| rep + 1 < c) {
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
