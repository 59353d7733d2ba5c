//! A map of flows that forgets the oldest beyond a bound.

use std::collections::{HashMap, VecDeque};

use crate::FlowKey;

/// Flows remembered after their state is gone, oldest forgotten first.
#[derive(Debug)]
pub(crate) struct BoundedMap<V> {
    order: VecDeque<FlowKey>,
    map: HashMap<FlowKey, V>,
}

impl<V> Default for BoundedMap<V> {
    fn default() -> Self {
        BoundedMap {
            order: VecDeque::new(),
            map: HashMap::new(),
        }
    }
}

impl<V> BoundedMap<V> {
    pub(crate) fn get(&self, k: &FlowKey) -> Option<&V> {
        self.map.get(k)
    }

    pub(crate) fn insert(&mut self, k: FlowKey, v: V, cap: usize) {
        if self.map.insert(k, v).is_none() {
            self.order.push_back(k);
        }
        while self.order.len() > cap {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }
}
