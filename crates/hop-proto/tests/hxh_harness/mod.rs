//! A small deterministic network for the packet-transport tests (HxH, ATP): nodes exchange
//! `Transmit`s over links with a rate, a propagation delay and seeded random loss, under a
//! virtual clock. Each node has one transmitter and is polled only when it is free (the pull
//! model of the runtime). Optionally all nodes share one channel (one transmission at a
//! time), a crude stand-in for a single-radio wireless neighbourhood.

#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use hop_proto::{
    Class, Event, FlowKey, Instant, Node, NodeId, StaticRoutes, Transport, TransportId,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[derive(Clone, Copy, Debug)]
pub struct LinkCfg {
    pub rate_bps: u64,
    pub delay: Duration,
    /// Probability that one transmission attempt is lost.
    pub loss: f64,
}

impl Default for LinkCfg {
    fn default() -> Self {
        LinkCfg {
            rate_bps: 11_000_000,
            delay: Duration::from_micros(100),
            loss: 0.0,
        }
    }
}

/// Link-layer attempts for `Class::Control` (Data gets one).
pub const CONTROL_ATTEMPTS: u32 = 4;

#[derive(Default, Debug, Clone)]
pub struct FlowRecord {
    pub src: NodeId,
    pub dst: NodeId,
    pub payload: Bytes,
    pub accepted: usize,
    pub finished_called: bool,
    pub start: Instant,
    pub received: Vec<u8>,
    /// (time, cumulative bytes) at each delivery.
    pub progress: Vec<(Instant, u64)>,
    pub opened: u32,
    pub flow_finished: Option<(Instant, u64)>,
    /// The destination gave the flow up unfinished (`Event::FlowAbandoned`).
    pub flow_abandoned: Option<Instant>,
    pub send_complete: Option<(Instant, u64)>,
    pub send_failed: bool,
    pub out_of_order: bool,
}

/// A frame in the air: (arrival, tie-break, receiver, datagram).
type Arrival = Reverse<(Instant, u64, NodeId, Vec<u8>)>;
/// Decides whether to drop a frame sent at `.0` from `.1` to `.2`.
pub type DropFilter = Box<dyn FnMut(Instant, NodeId, NodeId, &[u8]) -> bool>;

pub struct Net {
    pub now: Instant,
    pub nodes: BTreeMap<NodeId, Node>,
    pub links: HashMap<(NodeId, NodeId), LinkCfg>,
    pub default_link: LinkCfg,
    pub shared_medium: bool,
    rng: SmallRng,
    arrivals: BinaryHeap<Arrival>,
    seq: u64,
    busy_until: BTreeMap<NodeId, Instant>,
    channel_free: Instant,
    rr: usize,
    pub flows: BTreeMap<FlowKey, FlowRecord>,
    pending_starts: Vec<(Instant, NodeId, NodeId, Bytes)>,
    transport: TransportId,
    pub sent_by_class: BTreeMap<&'static str, u64>,
    pub lost: u64,
    /// Frames for which this returns true are lost.
    pub drop_filter: Option<DropFilter>,
}

impl Net {
    /// A network whose nodes are given with their static routes (dst -> next hop).
    pub fn new(
        seed: u64,
        transport: TransportId,
        make: &dyn Fn() -> Box<dyn Transport>,
        routes: &[(NodeId, Vec<(NodeId, NodeId)>)],
    ) -> Self {
        let mut nodes = BTreeMap::new();
        for (id, table) in routes {
            let r: StaticRoutes = table.iter().copied().collect();
            let mut n = Node::new(*id, Box::new(r), seed);
            n.add_transport(make());
            nodes.insert(*id, n);
        }
        Net {
            now: Instant::ZERO,
            nodes,
            links: HashMap::new(),
            default_link: LinkCfg::default(),
            shared_medium: false,
            rng: SmallRng::seed_from_u64(seed),
            arrivals: BinaryHeap::new(),
            seq: 0,
            busy_until: BTreeMap::new(),
            channel_free: Instant::ZERO,
            rr: 0,
            flows: BTreeMap::new(),
            pending_starts: Vec::new(),
            transport,
            sent_by_class: BTreeMap::new(),
            lost: 0,
            drop_filter: None,
        }
    }

    /// A chain 0 - 1 - ... - n-1 with routes along it.
    pub fn chain(
        seed: u64,
        n: u32,
        transport: TransportId,
        make: &dyn Fn() -> Box<dyn Transport>,
    ) -> Self {
        let routes: Vec<(NodeId, Vec<(NodeId, NodeId)>)> = (0..n)
            .map(|i| {
                let table = (0..n)
                    .filter(|&d| d != i)
                    .map(|d| (d, if d > i { i + 1 } else { i - 1 }))
                    .collect();
                (i, table)
            })
            .collect();
        Net::new(seed, transport, make, &routes)
    }

    pub fn link(&self, a: NodeId, b: NodeId) -> LinkCfg {
        self.links
            .get(&(a, b))
            .copied()
            .unwrap_or(self.default_link)
    }

    /// Schedule a flow of `payload` from `src` to `dst` starting at `at`.
    pub fn start_flow(&mut self, at: Instant, src: NodeId, dst: NodeId, payload: Bytes) {
        self.pending_starts.push((at, src, dst, payload));
    }

    fn start_due(&mut self) {
        let now = self.now;
        let mut i = 0;
        while i < self.pending_starts.len() {
            if self.pending_starts[i].0 <= now {
                let (_, src, dst, payload) = self.pending_starts.remove(i);
                let node = self.nodes.get_mut(&src).expect("source node");
                let key = node.open(now, self.transport, dst).expect("open");
                self.flows.insert(
                    key,
                    FlowRecord {
                        src,
                        dst,
                        payload,
                        start: now,
                        ..Default::default()
                    },
                );
            } else {
                i += 1;
            }
        }
    }

    fn feed_apps(&mut self) {
        let now = self.now;
        for (key, rec) in self.flows.iter_mut() {
            if rec.finished_called || rec.send_failed || rec.send_complete.is_some() {
                continue;
            }
            let node = self.nodes.get_mut(&rec.src).expect("node");
            // An error means the transport already dropped the flow (its SendFailed event is
            // drained below).
            if rec.accepted < rec.payload.len() {
                match node.send(now, *key, rec.payload.slice(rec.accepted..)) {
                    Ok(n) => rec.accepted += n,
                    Err(_) => continue,
                }
            }
            if rec.accepted == rec.payload.len() && node.finish(now, *key).is_ok() {
                rec.finished_called = true;
            }
        }
    }

    fn drain_events(&mut self) {
        let now = self.now;
        for node in self.nodes.values_mut() {
            while let Some(ev) = node.poll_event() {
                match ev.event {
                    Event::FlowOpened { flow } => {
                        if let Some(r) = self.flows.get_mut(&flow) {
                            r.opened += 1;
                        }
                    }
                    Event::Delivered { flow, offset, data } => {
                        if let Some(r) = self.flows.get_mut(&flow) {
                            if offset != r.received.len() as u64 {
                                r.out_of_order = true;
                            }
                            r.received.extend_from_slice(&data);
                            r.progress.push((now, r.received.len() as u64));
                        }
                    }
                    Event::FlowFinished { flow, bytes } => {
                        if let Some(r) = self.flows.get_mut(&flow) {
                            assert!(r.flow_finished.is_none(), "FlowFinished twice");
                            r.flow_finished = Some((now, bytes));
                        }
                    }
                    Event::FlowAbandoned { flow } => {
                        if let Some(r) = self.flows.get_mut(&flow) {
                            assert!(r.flow_finished.is_none(), "a finished flow abandoned");
                            r.flow_abandoned = Some(now);
                        }
                    }
                    Event::SendComplete { flow, bytes } => {
                        if let Some(r) = self.flows.get_mut(&flow) {
                            r.send_complete = Some((now, bytes));
                        }
                    }
                    Event::SendFailed { flow, .. } => {
                        if let Some(r) = self.flows.get_mut(&flow) {
                            r.send_failed = true;
                        }
                    }
                    Event::Writable { .. }
                    | Event::Acknowledged { .. }
                    | Event::NeighbourSilent { .. }
                    | Event::NeighbourReturned { .. }
                    | Event::DestinationFull { .. } => {}
                }
            }
        }
    }

    fn transmit_one(&mut self, id: NodeId) -> bool {
        let now = self.now;
        let node = self.nodes.get_mut(&id).expect("node");
        let Some(tx) = node.poll_transmit(now) else {
            return false;
        };
        let link = self.link(id, tx.next_hop);
        let bits = (tx.payload.len() as u64 + 28) * 8;
        let airtime = Duration::from_nanos(bits * 1_000_000_000 / link.rate_bps.max(1));
        let attempts = match tx.class {
            Class::Control | Class::Acked => CONTROL_ATTEMPTS,
            Class::Data => 1,
        };
        *self
            .sent_by_class
            .entry(match tx.class {
                Class::Control => "control",
                Class::Data => "data",
                Class::Acked => "acked",
            })
            .or_insert(0) += 1;
        let mut used = Duration::ZERO;
        let mut delivered = false;
        for _ in 0..attempts {
            used += airtime;
            if self.rng.gen::<f64>() >= link.loss {
                delivered = true;
                break;
            }
        }
        if delivered {
            if let Some(f) = self.drop_filter.as_mut() {
                if f(now, id, tx.next_hop, &tx.payload) {
                    delivered = false;
                }
            }
        }
        let done = now + used;
        self.busy_until.insert(id, done);
        if self.shared_medium {
            self.channel_free = done;
        }
        if delivered && self.nodes.contains_key(&tx.next_hop) {
            self.seq += 1;
            self.arrivals.push(Reverse((
                done + link.delay,
                self.seq,
                tx.next_hop,
                tx.payload,
            )));
        } else {
            self.lost += 1;
        }
        true
    }

    fn poll_transmitters(&mut self) {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        if self.shared_medium {
            if self.channel_free > self.now {
                return;
            }
            for k in 0..ids.len() {
                let id = ids[(self.rr + k) % ids.len()];
                if self.transmit_one(id) {
                    self.rr = (self.rr + k + 1) % ids.len();
                    return;
                }
            }
            return;
        }
        for id in ids {
            if self.busy_until.get(&id).is_none_or(|&t| t <= self.now) {
                self.transmit_one(id);
            }
        }
    }

    fn next_event(&self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut at = |x: Instant| t = Some(t.map_or(x, |y: Instant| y.min(x)));
        if let Some(Reverse((a, ..))) = self.arrivals.peek() {
            at(*a);
        }
        for n in self.nodes.values() {
            if let Some(d) = n.poll_timeout() {
                at(d.max(self.now));
            }
        }
        for &b in self.busy_until.values() {
            if b > self.now {
                at(b);
            }
        }
        if self.shared_medium && self.channel_free > self.now {
            at(self.channel_free);
        }
        for (s, ..) in &self.pending_starts {
            at(*s);
        }
        t
    }

    /// Advance the simulation until `until` or until `stop` says so.
    pub fn run_until(&mut self, until: Instant, mut stop: impl FnMut(&Net) -> bool) {
        let mut idle_spins = 0u32;
        loop {
            self.start_due();
            while let Some(Reverse((t, ..))) = self.arrivals.peek() {
                if *t > self.now {
                    break;
                }
                let Reverse((_, _, to, bytes)) = self.arrivals.pop().expect("peeked");
                if let Some(n) = self.nodes.get_mut(&to) {
                    let _ = n.handle_datagram(self.now, &bytes);
                }
            }
            for n in self.nodes.values_mut() {
                if n.poll_timeout().is_some_and(|d| d <= self.now) {
                    n.handle_timeout(self.now);
                }
            }
            self.feed_apps();
            self.poll_transmitters();
            self.drain_events();
            if stop(self) {
                return;
            }
            match self.next_event() {
                Some(t) if t > self.now => {
                    idle_spins = 0;
                    if t > until {
                        self.now = until;
                        return;
                    }
                    self.now = t;
                }
                Some(_) => {
                    // A deadline at the current instant: process it again, but never spin.
                    idle_spins += 1;
                    assert!(
                        idle_spins < 10_000,
                        "transport keeps reporting a past deadline"
                    );
                }
                None => {
                    self.now = until;
                    return;
                }
            }
        }
    }

    pub fn all_done(&self) -> bool {
        !self.flows.is_empty()
            && self.pending_starts.is_empty()
            && self
                .flows
                .values()
                .all(|r| r.flow_finished.is_some() && r.send_complete.is_some())
    }

    /// Flows with state on any node.
    pub fn flows_with_state(&self) -> u64 {
        self.nodes
            .values()
            .flat_map(|n| n.stats().transports.into_iter().map(|(_, s)| s.flows))
            .sum()
    }

    pub fn extra(&self, node: NodeId, name: &str) -> u64 {
        self.nodes[&node]
            .stats()
            .transports
            .iter()
            .map(|(_, s)| s.extra.get(name).copied().unwrap_or(0))
            .sum()
    }

    /// Bytes delivered to `key` between `from` and `to`.
    pub fn delivered_between(&self, key: FlowKey, from: Instant, to: Instant) -> u64 {
        let r = &self.flows[&key];
        let at = |t: Instant| {
            r.progress
                .iter()
                .take_while(|(w, _)| *w <= t)
                .last()
                .map_or(0, |(_, b)| *b)
        };
        at(to) - at(from)
    }
}

pub fn secs(s: f64) -> Instant {
    Instant::from_nanos((s * 1e9) as u64)
}

pub fn pattern(len: usize, seed: u8) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
            .collect::<Vec<u8>>(),
    )
}

/// Jain's fairness index of `x`.
pub fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let q: f64 = x.iter().map(|v| v * v).sum();
    if q == 0.0 {
        0.0
    } else {
        s * s / (x.len() as f64 * q)
    }
}

/// Check every flow delivered exactly its bytes, in order, once, and both ends completed.
pub fn assert_all_delivered(net: &Net) {
    for (k, r) in &net.flows {
        assert!(!r.out_of_order, "flow {k}: out-of-order delivery");
        assert_eq!(r.opened, 1, "flow {k}: FlowOpened count");
        assert_eq!(r.received.len(), r.payload.len(), "flow {k}: byte count");
        assert!(r.received == r.payload[..], "flow {k}: bytes differ");
        let (_, fb) = r.flow_finished.expect("FlowFinished");
        let (_, sb) = r.send_complete.expect("SendComplete");
        assert_eq!(fb, r.payload.len() as u64);
        assert_eq!(sb, r.payload.len() as u64);
        assert!(!r.send_failed);
    }
}
