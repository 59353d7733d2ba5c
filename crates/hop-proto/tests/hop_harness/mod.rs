//! A small discrete-event network for testing the Hop transport: nodes joined by lossy links
//! with a bit rate and propagation delay, a per-node interface queue that pulls datagrams with
//! `poll_transmit` when it has room (control ahead of data), link-layer retries for control
//! datagrams, optional overhearing by the sender's other neighbours, hidden-terminal collisions
//! at a receiver, node crashes and link outages. Virtual time, seeded randomness.

#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use hop_proto::hop::{HopConfig, HopTransport};
use hop_proto::{Class, Event, FlowKey, Instant, Node, NodeId, StaticRoutes, TransportStats};
use hop_wire::TransportId;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Link-layer attempts for control datagrams (802.11 default retry limit 7, plus the first).
pub const CONTROL_ATTEMPTS: u32 = 8;
/// Per-frame overhead in airtime (preamble, MAC header, contention), roughly 802.11b.
pub const FRAME_OVERHEAD: Duration = Duration::from_micros(400);

#[derive(Debug, Clone, Copy)]
pub struct LinkSpec {
    /// Probability a frame is lost (each attempt).
    pub loss: f64,
    /// Bytes per second.
    pub rate: f64,
    pub delay: Duration,
    pub up: bool,
}

impl Default for LinkSpec {
    fn default() -> Self {
        LinkSpec {
            loss: 0.0,
            rate: 11e6 / 8.0,
            delay: Duration::from_micros(50),
            up: true,
        }
    }
}

enum Ev {
    /// A frame of `from` finished its airtime.
    TxDone {
        from: NodeId,
    },
    /// A frame arrives at `to`.
    Arrive {
        to: NodeId,
        from: NodeId,
        payload: Vec<u8>,
    },
    Timer {
        node: NodeId,
    },
}

struct Frame {
    next_hop: NodeId,
    class: Class,
    payload: Vec<u8>,
}

pub struct App {
    pub flow: FlowKey,
    pub src: NodeId,
    pub dst: NodeId,
    pub data: Bytes,
    pub offered: usize,
    pub finished_sending: bool,
    pub received: Vec<u8>,
    pub start: Instant,
    pub complete_at: Option<Instant>,
    pub delivered_at: Option<Instant>,
    /// The destination gave the flow up unfinished (`Event::FlowAbandoned`).
    pub abandoned_at: Option<Instant>,
    pub failed: bool,
    /// The source's `Acknowledged` reports, in order.
    pub acked: Vec<u64>,
}

pub struct Net {
    pub now: Instant,
    pub nodes: BTreeMap<NodeId, Node>,
    pub cfgs: BTreeMap<NodeId, HopConfig>,
    pub links: HashMap<(NodeId, NodeId), LinkSpec>,
    /// Neighbours that overhear each transmission (shared medium).
    pub overhear: bool,
    /// Frames arriving at the same receiver from different senders with overlapping airtime
    /// are lost (hidden terminals).
    pub collisions: bool,
    pub queue_cap: usize,
    /// Largest random wait before each attempt of a frame (802.11's backoff; zero: none, every
    /// frame starts at once). Without it two hidden senders can stay in lockstep and collide
    /// on every frame forever, which a real MAC's random backoff prevents.
    pub backoff: Duration,
    routes: BTreeMap<NodeId, Vec<(NodeId, NodeId)>>,
    ctrl_q: HashMap<NodeId, VecDeque<Frame>>,
    data_q: HashMap<NodeId, VecDeque<Frame>>,
    busy: BTreeSet<NodeId>,
    /// Receiver -> (busy until, sender) of the frame it is receiving.
    rx_busy: HashMap<NodeId, (Instant, NodeId, bool)>,
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    evs: HashMap<u64, Ev>,
    seq: u64,
    timers: HashMap<NodeId, Instant>,
    rng: SmallRng,
    pub apps: Vec<App>,
    pub crashed: BTreeSet<NodeId>,
    pub data_collisions: u64,
    pub frames_sent: u64,
    seed: u64,
}

pub fn pattern(seed: u64, len: usize) -> Bytes {
    let mut r = SmallRng::seed_from_u64(seed);
    let mut v = vec![0u8; len];
    r.fill(&mut v[..]);
    Bytes::from(v)
}

impl Net {
    pub fn new(seed: u64) -> Self {
        Net {
            now: Instant::ZERO,
            nodes: BTreeMap::new(),
            cfgs: BTreeMap::new(),
            links: HashMap::new(),
            overhear: false,
            collisions: false,
            queue_cap: 8,
            backoff: Duration::ZERO,
            routes: BTreeMap::new(),
            ctrl_q: HashMap::new(),
            data_q: HashMap::new(),
            busy: BTreeSet::new(),
            rx_busy: HashMap::new(),
            heap: BinaryHeap::new(),
            evs: HashMap::new(),
            seq: 0,
            timers: HashMap::new(),
            rng: SmallRng::seed_from_u64(seed),
            apps: Vec::new(),
            crashed: BTreeSet::new(),
            data_collisions: 0,
            frames_sent: 0,
            seed,
        }
    }

    /// A chain 1 - 2 - ... - n with the same spec on every link and shortest-path routes.
    pub fn chain(n: u32, spec: LinkSpec, cfg: HopConfig, seed: u64) -> Self {
        let mut net = Net::new(seed);
        for i in 1..n {
            net.link(i, i + 1, spec);
        }
        for i in 1..=n {
            let mut routes = Vec::new();
            for d in 1..=n {
                if d > i {
                    routes.push((d, i + 1));
                } else if d < i {
                    routes.push((d, i - 1));
                }
            }
            net.add_node(i, routes, cfg.clone());
        }
        net
    }

    pub fn link(&mut self, a: NodeId, b: NodeId, spec: LinkSpec) {
        self.links.insert((a, b), spec);
        self.links.insert((b, a), spec);
    }

    pub fn add_node(&mut self, id: NodeId, routes: Vec<(NodeId, NodeId)>, cfg: HopConfig) {
        self.routes.insert(id, routes);
        self.cfgs.insert(id, cfg);
        self.build_node(id);
    }

    fn build_node(&mut self, id: NodeId) {
        let routes: StaticRoutes = self.routes[&id].iter().copied().collect();
        let mut node = Node::new(
            id,
            Box::new(routes),
            self.seed ^ u64::from(id) ^ self.now.as_nanos(),
        );
        node.add_transport(Box::new(HopTransport::new(self.cfgs[&id].clone())));
        self.nodes.insert(id, node);
        self.ctrl_q.insert(id, VecDeque::new());
        self.data_q.insert(id, VecDeque::new());
        self.busy.remove(&id);
        self.timers.remove(&id);
    }

    /// The node loses all state: a fresh node with a fresh transport replaces it.
    pub fn crash(&mut self, id: NodeId) {
        self.crashed.insert(id);
        self.build_node(id);
    }

    pub fn restart(&mut self, id: NodeId) {
        self.crashed.remove(&id);
        self.build_node(id);
    }

    pub fn set_link_up(&mut self, a: NodeId, b: NodeId, up: bool) {
        for k in [(a, b), (b, a)] {
            if let Some(l) = self.links.get_mut(&k) {
                l.up = up;
            }
        }
    }

    pub fn stats(&self, id: NodeId) -> TransportStats {
        self.nodes[&id]
            .stats()
            .transports
            .into_iter()
            .find(|(t, _)| *t == TransportId::Hop)
            .map(|(_, s)| s)
            .unwrap_or_default()
    }

    /// Start a transfer of `len` pattern bytes from `src` to `dst`; returns the app index.
    pub fn transfer(&mut self, src: NodeId, dst: NodeId, len: usize) -> usize {
        let now = self.now;
        let flow = self
            .nodes
            .get_mut(&src)
            .unwrap()
            .open(now, TransportId::Hop, dst)
            .unwrap();
        let data = pattern(u64::from(flow.id) ^ self.seed, len);
        self.apps.push(App {
            flow,
            src,
            dst,
            data,
            offered: 0,
            finished_sending: false,
            received: Vec::new(),
            start: now,
            complete_at: None,
            delivered_at: None,
            abandoned_at: None,
            failed: false,
            acked: Vec::new(),
        });
        let i = self.apps.len() - 1;
        self.feed(i);
        i
    }

    fn feed(&mut self, i: usize) {
        let now = self.now;
        let app = &mut self.apps[i];
        if app.finished_sending || self.crashed.contains(&app.src) {
            return;
        }
        let node = self.nodes.get_mut(&app.src).unwrap();
        while app.offered < app.data.len() {
            let end = (app.offered + 64 * 1024).min(app.data.len());
            let want = end - app.offered;
            let n = node
                .send(now, app.flow, app.data.slice(app.offered..end))
                .unwrap_or(0);
            app.offered += n;
            if n < want {
                break;
            }
        }
        if app.offered == app.data.len() {
            node.finish(now, app.flow).unwrap();
            app.finished_sending = true;
        }
    }

    fn push(&mut self, at: Instant, ev: Ev) {
        self.seq += 1;
        self.evs.insert(self.seq, ev);
        self.heap.push(Reverse((at, self.seq)));
    }

    fn airtime(&self, from: NodeId, to: NodeId, len: usize) -> Duration {
        let rate = self
            .links
            .get(&(from, to))
            .map(|l| l.rate)
            .unwrap_or(11e6 / 8.0);
        FRAME_OVERHEAD + Duration::from_secs_f64(len as f64 / rate)
    }

    fn neighbours(&self, id: NodeId) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = self
            .links
            .keys()
            .filter(|(a, _)| *a == id)
            .map(|(_, b)| *b)
            .collect();
        v.sort_unstable();
        v
    }

    /// Pull datagrams from every node into its queue, start idle transmitters, drain events.
    fn service(&mut self) {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for id in ids {
            if self.crashed.contains(&id) {
                continue;
            }
            loop {
                let qlen = self.ctrl_q[&id].len() + self.data_q[&id].len();
                if qlen >= self.queue_cap {
                    break;
                }
                let now = self.now;
                let Some(t) = self.nodes.get_mut(&id).unwrap().poll_transmit(now) else {
                    break;
                };
                let f = Frame {
                    next_hop: t.next_hop,
                    class: t.class,
                    payload: t.payload,
                };
                match t.class {
                    Class::Control => self.ctrl_q.get_mut(&id).unwrap().push_back(f),
                    Class::Data | Class::Acked => self.data_q.get_mut(&id).unwrap().push_back(f),
                }
            }
            if !self.busy.contains(&id) {
                self.start_tx(id);
            }
            while let Some(ev) = self.nodes.get_mut(&id).unwrap().poll_event() {
                self.on_app_event(id, ev.event);
            }
            let t = self.nodes[&id].poll_timeout();
            if let Some(t) = t {
                if self.timers.get(&id) != Some(&t) {
                    self.timers.insert(id, t);
                    self.push(t.max(self.now), Ev::Timer { node: id });
                }
            }
        }
    }

    fn start_tx(&mut self, id: NodeId) {
        let frame = match self.ctrl_q.get_mut(&id).unwrap().pop_front() {
            Some(f) => f,
            None => match self.data_q.get_mut(&id).unwrap().pop_front() {
                Some(f) => f,
                None => return,
            },
        };
        self.busy.insert(id);
        self.frames_sent += 1;
        let air = self.airtime(id, frame.next_hop, frame.payload.len());
        let mut end = self.now + air;
        let spec = self.links.get(&(id, frame.next_hop)).copied();
        // Intended receiver.
        if let Some(spec) = spec {
            let attempts = if frame.class != Class::Data {
                CONTROL_ATTEMPTS
            } else {
                1
            };
            let mut delivered = false;
            let mut t = self.now;
            for _ in 0..attempts {
                if !self.backoff.is_zero() {
                    t += Duration::from_nanos(
                        self.rng.gen_range(0..=self.backoff.as_nanos() as u64),
                    );
                }
                let t_end = t + air;
                let ok = spec.up
                    && !self.crashed.contains(&frame.next_hop)
                    && self.rng.gen::<f64>() >= spec.loss
                    && !self.collides(frame.next_hop, id, t, t_end, frame.class);
                end = t_end;
                t = t_end;
                if ok {
                    delivered = true;
                    break;
                }
            }
            if delivered {
                self.push(
                    end + spec.delay,
                    Ev::Arrive {
                        to: frame.next_hop,
                        from: id,
                        payload: frame.payload.clone(),
                    },
                );
            }
        }
        // Neighbours overhear it.
        if self.overhear {
            for nb in self.neighbours(id) {
                if nb == frame.next_hop || self.crashed.contains(&nb) {
                    continue;
                }
                let spec = self.links[&(id, nb)];
                if spec.up && self.rng.gen::<f64>() >= spec.loss {
                    self.push(
                        end + spec.delay,
                        Ev::Arrive {
                            to: nb,
                            from: id,
                            payload: frame.payload.clone(),
                        },
                    );
                }
            }
        }
        self.push(end, Ev::TxDone { from: id });
    }

    /// Hidden-terminal model: a receiver that is receiving another sender's frame in an
    /// overlapping interval loses both.
    fn collides(
        &mut self,
        rx: NodeId,
        tx: NodeId,
        start: Instant,
        end: Instant,
        class: Class,
    ) -> bool {
        if !self.collisions {
            return false;
        }
        let hit = match self.rx_busy.get(&rx) {
            Some(&(until, other, _)) => other != tx && until > start,
            None => false,
        };
        if hit && class == Class::Data {
            self.data_collisions += 1;
        }
        if !hit || self.rx_busy.get(&rx).is_some_and(|(u, _, _)| *u < end) {
            self.rx_busy.insert(rx, (end, tx, class == Class::Data));
        }
        hit
    }

    fn on_app_event(&mut self, node: NodeId, ev: Event) {
        let now = self.now;
        match ev {
            Event::Delivered { flow, offset, data } => {
                if let Some(a) = self
                    .apps
                    .iter_mut()
                    .find(|a| a.flow == flow && a.dst == node)
                {
                    assert_eq!(offset as usize, a.received.len(), "in-order delivery");
                    a.received.extend_from_slice(&data);
                }
            }
            Event::FlowFinished { flow, .. } => {
                if let Some(a) = self
                    .apps
                    .iter_mut()
                    .find(|a| a.flow == flow && a.dst == node)
                {
                    a.delivered_at = Some(now);
                }
            }
            Event::FlowAbandoned { flow } => {
                if let Some(a) = self
                    .apps
                    .iter_mut()
                    .find(|a| a.flow == flow && a.dst == node)
                {
                    assert!(a.delivered_at.is_none(), "a finished flow is not abandoned");
                    a.abandoned_at = Some(now);
                }
            }
            Event::SendComplete { flow, .. } => {
                if let Some(a) = self
                    .apps
                    .iter_mut()
                    .find(|a| a.flow == flow && a.src == node)
                {
                    a.complete_at = Some(now);
                }
            }
            Event::SendFailed { flow, .. } => {
                if let Some(a) = self
                    .apps
                    .iter_mut()
                    .find(|a| a.flow == flow && a.src == node)
                {
                    a.failed = true;
                }
            }
            Event::Acknowledged { flow, bytes } => {
                if let Some(a) = self
                    .apps
                    .iter_mut()
                    .find(|a| a.flow == flow && a.src == node)
                {
                    a.acked.push(bytes);
                }
            }
            Event::NeighbourSilent { .. }
            | Event::NeighbourReturned { .. }
            | Event::DestinationFull { .. } => {}
            Event::Writable { flow } => {
                if let Some(i) = self
                    .apps
                    .iter()
                    .position(|a| a.flow == flow && a.src == node)
                {
                    self.feed(i);
                }
            }
            Event::FlowOpened { .. } => {}
        }
    }

    /// Run until `until` (virtual) or until `stop` returns true.
    pub fn run_until(&mut self, until: Instant, mut stop: impl FnMut(&Net) -> bool) {
        self.service();
        while let Some(Reverse((t, seq))) = self.heap.peek().copied() {
            if t > until || stop(self) {
                break;
            }
            self.heap.pop();
            self.now = t;
            let Some(ev) = self.evs.remove(&seq) else {
                continue;
            };
            match ev {
                Ev::TxDone { from } => {
                    self.busy.remove(&from);
                }
                Ev::Arrive { to, payload, .. } => {
                    if !self.crashed.contains(&to) {
                        let now = self.now;
                        // Malformed datagrams never reach this harness; errors are bugs.
                        self.nodes
                            .get_mut(&to)
                            .unwrap()
                            .handle_datagram(now, &payload)
                            .unwrap();
                    }
                }
                Ev::Timer { node } => {
                    if self.timers.get(&node) == Some(&t) {
                        self.timers.remove(&node);
                        if !self.crashed.contains(&node) {
                            self.nodes.get_mut(&node).unwrap().handle_timeout(t);
                        }
                    }
                }
            }
            self.service();
        }
        if self.now < until && self.heap.is_empty() {
            self.now = until;
        }
    }

    /// Run until every transfer completed at its source (or `limit` passes).
    pub fn run_to_completion(&mut self, limit: Duration) {
        let until = self.now + limit;
        self.run_until(until, |n| {
            n.apps.iter().all(|a| a.complete_at.is_some() || a.failed)
        });
    }

    pub fn assert_all_identical(&self) {
        if let Err(e) = self.check_all_identical() {
            panic!("{e}");
        }
    }

    /// Every transfer finished at both ends with its bytes delivered once and in order.
    pub fn check_all_identical(&self) -> Result<(), String> {
        for a in &self.apps {
            if a.failed {
                return Err(format!("flow {} failed", a.flow));
            }
            if a.complete_at.is_none() {
                return Err(format!(
                    "flow {} incomplete: {} of {} bytes delivered by {:?}",
                    a.flow,
                    a.received.len(),
                    a.data.len(),
                    self.now
                ));
            }
            if a.received[..] != a.data[..] {
                return Err(format!("flow {} bytes differ", a.flow));
            }
            if a.delivered_at.is_none() {
                return Err(format!("flow {} not finished at destination", a.flow));
            }
        }
        Ok(())
    }
}

pub fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

impl Net {
    /// Print every node's counters (debugging aid for failing tests).
    pub fn dump(&self) {
        for id in self.nodes.keys() {
            let s = self.stats(*id);
            eprintln!(
                "node {id}: sent {:?} recv {:?} retx {} cache {} peak {} buf {} flows {} extra {:?}",
                s.sent_by_type, s.received_by_type, s.data_retransmissions, s.cache_bytes,
                s.cache_bytes_peak, s.buffered_blocks_peak, s.flows, s.extra
            );
        }
    }
}
