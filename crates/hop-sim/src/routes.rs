//! Route computation over the simulated topology.
//!
//! Shortest paths by hop count or by ETX = 1/((1-p_fwd)(1-p_rev)) (De Couto et al., used by the
//! Hop testbed's OLSR, Hop paper §5.2). Tables keep naming a next hop while a link is down
//! (disruption-tolerant routing, Hop paper §3.4).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::scenario::RouteMetric;

/// A directed edge as routing sees it.
#[derive(Debug, Clone, Copy)]
pub struct EdgeView {
    pub from: u32,
    pub to: u32,
    pub loss_fwd: f64,
    pub loss_rev: f64,
}

#[derive(PartialEq)]
struct Item(f64, u32);
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    fn cmp(&self, o: &Self) -> Ordering {
        // Min-heap on cost, ties broken by the lower node id for determinism.
        o.0.total_cmp(&self.0).then_with(|| o.1.cmp(&self.1))
    }
}

/// Cost of using a directed edge under `metric`; `None` if unusable.
fn cost(metric: RouteMetric, e: &EdgeView) -> Option<f64> {
    match metric {
        RouteMetric::Hops | RouteMetric::Static => Some(1.0),
        RouteMetric::Etx => {
            let d = (1.0 - e.loss_fwd) * (1.0 - e.loss_rev);
            if d <= 1e-9 {
                None
            } else {
                Some(1.0 / d)
            }
        }
    }
}

/// Next hop tables: `tables[node][dst] = next hop`, for every reachable pair.
pub fn shortest_paths(n: u32, edges: &[EdgeView], metric: RouteMetric) -> Vec<HashMap<u32, u32>> {
    let mut tables = vec![HashMap::new(); n as usize];
    if metric == RouteMetric::Static {
        return tables;
    }
    // Reverse adjacency: run Dijkstra from every destination towards the sources.
    let mut rev: Vec<Vec<(u32, f64)>> = vec![Vec::new(); n as usize];
    for e in edges {
        if let Some(c) = cost(metric, e) {
            rev[e.to as usize].push((e.from, c));
        }
    }
    for list in &mut rev {
        list.sort_by_key(|x| x.0);
    }
    for dst in 0..n {
        let mut dist = vec![f64::INFINITY; n as usize];
        let mut next: Vec<Option<u32>> = vec![None; n as usize];
        dist[dst as usize] = 0.0;
        let mut heap = BinaryHeap::new();
        heap.push(Item(0.0, dst));
        while let Some(Item(d, v)) = heap.pop() {
            if d > dist[v as usize] {
                continue;
            }
            for &(u, c) in &rev[v as usize] {
                let nd = d + c;
                if nd < dist[u as usize] - 1e-12 {
                    dist[u as usize] = nd;
                    next[u as usize] = Some(v);
                    heap.push(Item(nd, u));
                }
            }
        }
        for u in 0..n {
            if u != dst {
                if let Some(h) = next[u as usize] {
                    tables[u as usize].insert(dst, h);
                }
            }
        }
    }
    tables
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(a: u32, b: u32, p: f64) -> [EdgeView; 2] {
        [
            EdgeView {
                from: a,
                to: b,
                loss_fwd: p,
                loss_rev: p,
            },
            EdgeView {
                from: b,
                to: a,
                loss_fwd: p,
                loss_rev: p,
            },
        ]
    }

    #[test]
    fn etx_prefers_two_good_hops_over_one_bad() {
        // 0-2 direct at 60% loss (ETX 6.25) vs 0-1-2 clean (ETX 2).
        let mut e = Vec::new();
        e.extend(both(0, 2, 0.6));
        e.extend(both(0, 1, 0.0));
        e.extend(both(1, 2, 0.0));
        let t = shortest_paths(3, &e, RouteMetric::Etx);
        assert_eq!(t[0][&2], 1);
        let h = shortest_paths(3, &e, RouteMetric::Hops);
        assert_eq!(h[0][&2], 2);
    }
}
