//! Routing as the core sees it: a next hop for a destination.
//!
//! A next hop may be named even while the destination is unreachable (disruption-tolerant
//! routing, Hop paper §3.4): blocks then wait in the node's cache until the neighbour answers.

use std::collections::HashMap;

use hop_wire::NodeId;

pub trait Routing: Send {
    /// The neighbour to forward traffic for `dst` to, if any.
    fn next_hop(&self, dst: NodeId) -> Option<NodeId>;
}

/// A fixed table of destination -> next hop.
#[derive(Debug, Clone, Default)]
pub struct StaticRoutes {
    table: HashMap<NodeId, NodeId>,
}

impl StaticRoutes {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, dst: NodeId, next_hop: NodeId) {
        self.table.insert(dst, next_hop);
    }

    pub fn remove(&mut self, dst: NodeId) {
        self.table.remove(&dst);
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

impl FromIterator<(NodeId, NodeId)> for StaticRoutes {
    fn from_iter<I: IntoIterator<Item = (NodeId, NodeId)>>(iter: I) -> Self {
        StaticRoutes {
            table: iter.into_iter().collect(),
        }
    }
}

impl Routing for StaticRoutes {
    fn next_hop(&self, dst: NodeId) -> Option<NodeId> {
        self.table.get(&dst).copied()
    }
}
