//! The discrete-event engine: virtual time, the medium (shared 802.11-like or point-to-point),
//! per-node interface queues, the real [`hop_proto::Node`]s and the applications.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::rc::Rc;

use bytes::Bytes;
use hop_proto::{Class, Event, FlowKey, Instant, Node, NodeStats, StaticRoutes, TransportId};
use hop_wire::BROADCAST_NODE;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

use crate::error::ScenarioError;
use crate::result::{FlowResult, MacCounters, MediumCounters, NodeResult, SimResult};
use crate::routes::{shortest_paths, EdgeView};
use crate::scenario::{
    EventKind, EventSpec, Generator, MediumKind, RouteMetric, Scenario, DEFAULT_DURATION_S,
};
use crate::transports::Registry;

/// Bytes offered to `Node::send` per call.
const APP_CHUNK: usize = 64 * 1024;
/// 802.11 ACK frame: 14 bytes.
const ACK_BYTES: f64 = 14.0;
/// Minimum re-arm delay when a transport reports a deadline it did not clear.
const STALE_TIMER_NS: u64 = 1_000_000;

fn us(x: f64) -> u64 {
    (x * 1000.0).round() as u64
}
fn secs(x: f64) -> u64 {
    (x * 1e9).round() as u64
}

#[derive(Debug, Clone)]
struct Edge {
    from: u32,
    to: u32,
    loss: f64,
    rate_mbps: f64,
    delay_ns: u64,
    up: bool,
}

#[derive(Debug, Clone)]
struct Pending {
    next_hop: u32,
    class: Class,
    payload: Rc<Vec<u8>>,
    retries: u32,
    cw: u32,
    seq: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MacState {
    Idle,
    Contend,
    Tx,
    WaitAck,
    /// Between two frames of a txop burst.
    Burst,
}

#[derive(Debug)]
struct Frame {
    sender: usize,
    /// Link destination (may be BROADCAST_NODE).
    dst: u32,
    /// None for an ACK.
    payload: Option<Rc<Vec<u8>>>,
    seq: u64,
    need_ack: bool,
    /// Outstanding events that refer to this frame.
    refs: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ev {
    Stop,
    Scenario { idx: usize, rep: u32 },
    FlowStart(usize),
    Timer { n: usize },
    ContendDone { n: usize, gen: u64 },
    BurstNext { n: usize, gen: u64 },
    AckTimeout { n: usize, gen: u64 },
    SendAck { n: usize, to: usize, seq: u64 },
    TxEnd { n: usize, frame: u64 },
    RxStart { n: usize, frame: u64 },
    RxEnd { n: usize, frame: u64 },
}

#[derive(Debug, PartialEq, Eq)]
struct Sched {
    t: u64,
    seq: u64,
    ev: Ev,
}
impl PartialOrd for Sched {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Sched {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.t, self.seq).cmp(&(o.t, o.seq))
    }
}

struct SimNode {
    node: Option<Node>,
    incarnation: u64,
    crashes: u64,
    timer_at: Option<u64>,
    ctrl_q: VecDeque<Pending>,
    data_q: VecDeque<Pending>,
    cur: Option<Pending>,
    state: MacState,
    gen: u64,
    backoff_left: u64,
    countdown_start: Option<u64>,
    burst_start: u64,
    busy: u32,
    transmitting: bool,
    rx: Vec<(u64, bool)>,
    last_seq: HashMap<usize, u64>,
    tx_seq: u64,
    mac: MacCounters,
    /// Stats of earlier incarnations (before crashes).
    past: Vec<NodeStats>,
}

impl SimNode {
    fn queued(&self) -> usize {
        self.ctrl_q.len() + self.data_q.len() + usize::from(self.cur.is_some())
    }
}

struct AppFlow {
    src: usize,
    dst: usize,
    transport: String,
    tid: TransportId,
    start: u64,
    data: Bytes,
    key: Option<FlowKey>,
    offered: u64,
    finish_called: bool,
    delivered: u64,
    duplicate_bytes: u64,
    identical: bool,
    last_delivery_at: Option<u64>,
    completed_at: Option<u64>,
    dst_finished_at: Option<u64>,
    send_complete_at: Option<u64>,
    failed: Option<String>,
    done: bool,
}

/// A runnable simulation built from a [`Scenario`].
pub struct Simulation {
    sc: Scenario,
    registry: Registry,
    seed: u64,
    now: u64,
    end: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<Sched>>,
    nodes: Vec<SimNode>,
    edges: Vec<Edge>,
    out: Vec<Vec<usize>>,
    edge_ix: HashMap<(u32, u32), usize>,
    frames: HashMap<u64, Frame>,
    next_frame: u64,
    rng: SmallRng,
    flows: Vec<AppFlow>,
    flow_by_key: HashMap<FlowKey, usize>,
    flows_done: usize,
    tables: Vec<HashMap<u32, u32>>,
    /// Transports each node hosts, by scenario name.
    hosted: Vec<String>,
    medium: MediumCounters,
    stopped: bool,
    stop_reason: &'static str,
    shared: bool,
    // Medium timing, ns.
    preamble: u64,
    difs: u64,
    sifs: u64,
    slot: u64,
    txop: u64,
    ack_air: u64,
    max_delay: u64,
}

impl Simulation {
    /// Build a simulation; checks transports and overrides against `registry`.
    pub fn new(sc: Scenario, registry: Registry) -> Result<Self, ScenarioError> {
        Self::with_seed(sc, registry, None)
    }

    /// Like [`Simulation::new`] with the scenario's seed replaced by `seed`.
    pub fn with_seed(
        sc: Scenario,
        registry: Registry,
        seed: Option<u64>,
    ) -> Result<Self, ScenarioError> {
        sc.validate()?;
        let seed = seed.unwrap_or(sc.seed);
        let n = sc.node_count()?;
        // Transports: every name used by a flow, each instantiable with its overrides.
        let mut hosted: Vec<String> = Vec::new();
        for f in &sc.flows {
            if !hosted.contains(&f.transport) {
                hosted.push(f.transport.clone());
            }
        }
        for name in sc.transports.keys() {
            if registry.id_of(name).is_none() {
                return Err(ScenarioError::Transport {
                    name: name.clone(),
                    reason: format!(
                        "[transports.{name}] names an unknown transport; known: {}",
                        registry.names().join(", ")
                    ),
                });
            }
        }
        let empty = toml::Table::new();
        let mut ids: BTreeMap<TransportId, String> = BTreeMap::new();
        for name in &hosted {
            let id = registry
                .id_of(name)
                .ok_or_else(|| ScenarioError::Transport {
                    name: name.clone(),
                    reason: format!("unknown transport; known: {}", registry.names().join(", ")),
                })?;
            if let Some(other) = ids.insert(id, name.clone()) {
                return Err(ScenarioError::Transport {
                    name: name.clone(),
                    reason: format!(
                        "shares its wire id with {other:?}; a scenario can use only one of them"
                    ),
                });
            }
            let o = sc.transports.get(name).unwrap_or(&empty);
            registry
                .build(name, o)
                .map_err(|reason| ScenarioError::Transport {
                    name: name.clone(),
                    reason,
                })?;
        }

        let m = &sc.medium;
        let shared = m.kind == MediumKind::Shared;
        let end = secs(sc.duration.unwrap_or(DEFAULT_DURATION_S));
        let mut sim = Simulation {
            seed,
            now: 0,
            end,
            seq: 0,
            queue: BinaryHeap::new(),
            nodes: Vec::new(),
            edges: Vec::new(),
            out: vec![Vec::new(); n as usize],
            edge_ix: HashMap::new(),
            frames: HashMap::new(),
            next_frame: 0,
            rng: SmallRng::seed_from_u64(seed ^ 0x6d65_6469_756d),
            flows: Vec::new(),
            flow_by_key: HashMap::new(),
            flows_done: 0,
            tables: Vec::new(),
            hosted,
            medium: MediumCounters::default(),
            stopped: false,
            stop_reason: "duration",
            shared,
            preamble: us(m.preamble_us),
            difs: if shared { us(m.difs_us) } else { 0 },
            sifs: us(m.sifs_us),
            slot: if shared { us(m.slot_us) } else { 0 },
            txop: us(m.txop_us),
            ack_air: us(m.preamble_us) + us(ACK_BYTES * 8.0 / m.ack_rate_mbps),
            max_delay: 0,
            registry,
            sc,
        };
        sim.build_topology(n)?;
        sim.tables = sim.compute_tables(false, None);
        for id in 0..n as usize {
            let node = sim.fresh_node(id, 0)?;
            sim.nodes.push(SimNode {
                node: Some(node),
                incarnation: 0,
                crashes: 0,
                timer_at: None,
                ctrl_q: VecDeque::new(),
                data_q: VecDeque::new(),
                cur: None,
                state: MacState::Idle,
                gen: 0,
                backoff_left: 0,
                countdown_start: None,
                burst_start: 0,
                busy: 0,
                transmitting: false,
                rx: Vec::new(),
                last_seq: HashMap::new(),
                tx_seq: 0,
                mac: MacCounters::default(),
                past: Vec::new(),
            });
        }
        // Applications.
        for (i, f) in sim.sc.flows.clone().iter().enumerate() {
            let size = f
                .size
                .bytes()
                .map_err(|e| ScenarioError::Invalid(format!("flows[{i}]: {e}")))?;
            let mut buf = vec![0u8; size as usize];
            let mut prng =
                SmallRng::seed_from_u64(seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            prng.fill_bytes(&mut buf);
            let tid = sim.registry.id_of(&f.transport).unwrap_or(TransportId::Hop);
            sim.flows.push(AppFlow {
                src: f.src as usize,
                dst: f.dst as usize,
                transport: f.transport.clone(),
                tid,
                start: secs(f.start),
                data: Bytes::from(buf),
                key: None,
                offered: 0,
                finish_called: false,
                delivered: 0,
                duplicate_bytes: 0,
                identical: true,
                last_delivery_at: None,
                completed_at: None,
                dst_finished_at: None,
                send_complete_at: None,
                failed: None,
                done: false,
            });
            sim.push(secs(f.start), Ev::FlowStart(i));
        }
        for (idx, e) in sim.sc.events.iter().enumerate() {
            let t = secs(e.at);
            sim.seq += 1;
            let s = sim.seq;
            sim.queue.push(Reverse(Sched {
                t,
                seq: s,
                ev: Ev::Scenario { idx, rep: 0 },
            }));
        }
        sim.push(end, Ev::Stop);
        Ok(sim)
    }

    fn build_topology(&mut self, n: u32) -> Result<(), ScenarioError> {
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
            delay_ns: us(delay),
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
    fn compute_tables(
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

    fn routes_for(&self, id: usize) -> Box<StaticRoutes> {
        Box::new(
            self.tables[id]
                .iter()
                .map(|(&d, &v)| (d, v))
                .collect::<StaticRoutes>(),
        )
    }

    fn fresh_node(&self, id: usize, incarnation: u64) -> Result<Node, ScenarioError> {
        let node_seed = self.seed ^ incarnation.wrapping_mul(0xA076_1D64_78BD_642F);
        let mut node = Node::new(id as u32, self.routes_for(id), node_seed);
        let empty = toml::Table::new();
        for name in &self.hosted {
            let o = self.sc.transports.get(name).unwrap_or(&empty);
            let t = self
                .registry
                .build(name, o)
                .map_err(|reason| ScenarioError::Transport {
                    name: name.clone(),
                    reason,
                })?;
            node.add_transport(t);
        }
        Ok(node)
    }

    fn push(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Sched {
            t,
            seq: self.seq,
            ev,
        }));
    }

    fn inst(&self) -> Instant {
        Instant::from_nanos(self.now)
    }

    /// Run to completion (every flow done, or the time limit) and report.
    pub fn run(mut self) -> SimResult {
        let wall = std::time::Instant::now();
        while let Some(Reverse(s)) = self.queue.pop() {
            if s.t > self.end {
                self.now = self.end;
                break;
            }
            self.now = s.t;
            self.dispatch(s.ev);
            if self.stopped {
                break;
            }
        }
        if !self.stopped && self.queue.is_empty() {
            self.stop_reason = "idle";
        }
        let wall_s = wall.elapsed().as_secs_f64();
        self.report(wall_s)
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Stop => {
                self.stopped = true;
                self.stop_reason = "duration";
            }
            Ev::Scenario { idx, rep } => self.scenario_event(idx, rep),
            Ev::FlowStart(i) => self.flow_start(i),
            Ev::Timer { n } => {
                if self.nodes[n].timer_at != Some(self.now) {
                    return;
                }
                self.nodes[n].timer_at = None;
                let now = self.inst();
                if let Some(node) = self.nodes[n].node.as_mut() {
                    node.handle_timeout(now);
                }
                self.kick(n);
                if self.nodes[n].timer_at == Some(self.now) {
                    // The transport still reports the deadline it was just called for: re-arm
                    // a little later instead of spinning at this instant.
                    self.medium.stale_timeouts += 1;
                    self.nodes[n].timer_at = None;
                    self.arm_timer(n, self.now + STALE_TIMER_NS);
                }
            }
            Ev::ContendDone { n, gen } => {
                let sn = &self.nodes[n];
                if sn.gen == gen && sn.state == MacState::Contend && sn.node.is_some() {
                    self.nodes[n].countdown_start = None;
                    self.nodes[n].burst_start = self.now;
                    self.transmit(n);
                }
            }
            Ev::BurstNext { n, gen } => {
                let sn = &mut self.nodes[n];
                if sn.gen == gen && sn.state == MacState::Burst && sn.node.is_some() {
                    if sn.transmitting {
                        // An ACK went out in the gap: the burst is over, contend again.
                        sn.state = MacState::Idle;
                        self.kick(n);
                    } else if let Some(p) = sn.data_q.pop_front() {
                        sn.cur = Some(p);
                        self.transmit(n);
                    } else {
                        sn.state = MacState::Idle;
                        self.kick(n);
                    }
                }
            }
            Ev::AckTimeout { n, gen } => self.ack_timeout(n, gen),
            Ev::SendAck { n, to, seq } => self.send_ack(n, to, seq),
            Ev::TxEnd { n, frame } => self.tx_end(n, frame),
            Ev::RxStart { n, frame } => self.rx_start(n, frame),
            Ev::RxEnd { n, frame } => self.rx_end(n, frame),
        }
    }

    // ---------------------------------------------------------------- scenario events

    fn scenario_event(&mut self, idx: usize, rep: u32) {
        let e: EventSpec = self.sc.events[idx].clone();
        if let Some(every) = e.every {
            if e.count.map_or(true, |c| rep + 1 < c) {
                let t = self.now + secs(every);
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

    fn crash(&mut self, n: usize) {
        let sn = &mut self.nodes[n];
        let Some(node) = sn.node.take() else { return };
        sn.past.push(node.stats());
        sn.crashes += 1;
        sn.timer_at = None;
        self.medium.crash_drops +=
            (sn.ctrl_q.len() + sn.data_q.len() + usize::from(sn.cur.is_some())) as u64;
        sn.ctrl_q.clear();
        sn.data_q.clear();
        sn.cur = None;
        sn.state = MacState::Idle;
        sn.gen += 1;
        sn.countdown_start = None;
        sn.rx.clear();
        sn.busy = 0;
        sn.last_seq.clear();
        // The applications on the node die with it.
        for i in 0..self.flows.len() {
            let f = &mut self.flows[i];
            if f.src == n && !f.done && f.send_complete_at.is_none() && self.now >= f.start {
                f.failed = Some("source node crashed".into());
                self.mark_done(i);
            }
        }
    }

    fn restart(&mut self, n: usize) {
        if self.nodes[n].node.is_some() {
            return;
        }
        let inc = self.nodes[n].incarnation + 1;
        match self.fresh_node(n, inc) {
            Ok(node) => {
                let sn = &mut self.nodes[n];
                sn.node = Some(node);
                sn.incarnation = inc;
                self.kick(n);
            }
            Err(_) => {
                // Unreachable: the same constructors succeeded when the simulation was built.
            }
        }
    }

    // ---------------------------------------------------------------- applications

    fn flow_start(&mut self, i: usize) {
        let (src, dst, tid) = (self.flows[i].src, self.flows[i].dst, self.flows[i].tid);
        let now = self.inst();
        let Some(node) = self.nodes[src].node.as_mut() else {
            self.flows[i].failed = Some("source node down at flow start".into());
            self.mark_done(i);
            return;
        };
        match node.open(now, tid, dst as u32) {
            Ok(key) => {
                self.flows[i].key = Some(key);
                self.flow_by_key.insert(key, i);
                self.feed(i);
            }
            Err(e) => {
                self.flows[i].failed = Some(format!("open failed: {e}"));
                self.mark_done(i);
            }
        }
        self.kick(src);
    }

    /// Offer the flow's remaining bytes until the transport stops accepting.
    fn feed(&mut self, i: usize) {
        let now = self.inst();
        let f = &mut self.flows[i];
        let Some(key) = f.key else { return };
        let Some(node) = self.nodes[f.src].node.as_mut() else {
            return;
        };
        let size = f.data.len() as u64;
        while f.offered < size {
            let end = (f.offered as usize + APP_CHUNK).min(size as usize);
            match node.send(now, key, f.data.slice(f.offered as usize..end)) {
                Ok(0) => break,
                Ok(k) => f.offered += k as u64,
                Err(e) => {
                    f.failed = Some(format!("send failed: {e}"));
                    self.mark_done(i);
                    return;
                }
            }
        }
        if f.offered == size && !f.finish_called {
            f.finish_called = true;
            if let Err(e) = node.finish(now, key) {
                f.failed = Some(format!("finish failed: {e}"));
                self.mark_done(i);
            }
        }
    }

    fn mark_done(&mut self, i: usize) {
        if !self.flows[i].done {
            self.flows[i].done = true;
            self.flows_done += 1;
            if self.flows_done == self.flows.len() && !self.sc.run_to_end {
                self.stopped = true;
                self.stop_reason = "flows_done";
            }
        }
    }

    fn check_done(&mut self, i: usize) {
        let f = &self.flows[i];
        let delivered = f.delivered == f.data.len() as u64;
        if !f.done && delivered && (f.send_complete_at.is_some() || f.failed.is_some()) {
            self.mark_done(i);
        }
    }

    fn app_event(&mut self, n: usize, ev: Event) {
        let now = self.now;
        match ev {
            Event::FlowOpened { .. } => {}
            Event::Delivered { flow, offset, data } => {
                let Some(&i) = self.flow_by_key.get(&flow) else {
                    return;
                };
                let f = &mut self.flows[i];
                if f.dst != n {
                    f.identical = false;
                    return;
                }
                let size = f.data.len() as u64;
                let len = data.len() as u64;
                if offset > f.delivered || offset + len > size {
                    // A gap or bytes beyond the end: not an in-order, identical stream.
                    f.identical = false;
                    return;
                }
                let pat = &f.data[offset as usize..(offset + len) as usize];
                if pat != &data[..] {
                    f.identical = false;
                }
                let new_end = offset + len;
                if new_end > f.delivered {
                    f.duplicate_bytes += f.delivered - offset;
                    f.delivered = new_end;
                    f.last_delivery_at = Some(now);
                    if f.delivered == size {
                        f.completed_at = Some(now);
                    }
                } else {
                    f.duplicate_bytes += len;
                }
                self.check_done(i);
            }
            Event::FlowFinished { flow, .. } => {
                if let Some(&i) = self.flow_by_key.get(&flow) {
                    let f = &mut self.flows[i];
                    f.dst_finished_at.get_or_insert(now);
                    if f.data.is_empty() {
                        f.completed_at.get_or_insert(now);
                        f.last_delivery_at.get_or_insert(now);
                    }
                    self.check_done(i);
                }
            }
            Event::SendComplete { flow, .. } => {
                if let Some(&i) = self.flow_by_key.get(&flow) {
                    self.flows[i].send_complete_at.get_or_insert(now);
                    self.check_done(i);
                }
            }
            Event::SendFailed { flow, reason } => {
                if let Some(&i) = self.flow_by_key.get(&flow) {
                    self.flows[i].failed = Some(format!("{reason:?}"));
                    self.mark_done(i);
                }
            }
            Event::Writable { flow } => {
                if let Some(&i) = self.flow_by_key.get(&flow) {
                    if self.flows[i].src == n {
                        self.feed(i);
                    }
                }
            }
        }
    }

    // ---------------------------------------------------------------- node <-> MAC glue

    /// Drain events, refill the interface queue, start the MAC, re-arm the timer.
    fn kick(&mut self, n: usize) {
        if self.nodes[n].node.is_none() {
            return;
        }
        let cap = self.sc.medium.queue_frames;
        let data_broadcast = self.sc.medium.data_broadcast;
        loop {
            let mut progressed = false;
            while let Some(ev) = self.nodes[n].node.as_mut().and_then(|x| x.poll_event()) {
                progressed = true;
                self.app_event(n, ev.event);
            }
            let now = self.inst();
            while self.nodes[n].queued() < cap {
                let sn = &mut self.nodes[n];
                let Some(node) = sn.node.as_mut() else { break };
                let Some(t) = node.poll_transmit(now) else {
                    break;
                };
                progressed = true;
                sn.tx_seq += 1;
                let next_hop = if t.class == Class::Data && data_broadcast {
                    BROADCAST_NODE
                } else {
                    t.next_hop
                };
                let p = Pending {
                    next_hop,
                    class: t.class,
                    payload: Rc::new(t.payload),
                    retries: 0,
                    cw: 0,
                    seq: sn.tx_seq,
                };
                match t.class {
                    Class::Control => sn.ctrl_q.push_back(p),
                    Class::Data => sn.data_q.push_back(p),
                }
            }
            if !progressed {
                break;
            }
        }
        if self.nodes[n].state == MacState::Idle && self.nodes[n].cur.is_none() {
            self.start_next(n);
        }
        self.arm_timer(n, self.now);
    }

    fn arm_timer(&mut self, n: usize, min_t: u64) {
        let Some(node) = self.nodes[n].node.as_ref() else {
            return;
        };
        match node.poll_timeout() {
            Some(t) => {
                let t = t.as_nanos().max(min_t);
                if self.nodes[n].timer_at != Some(t) {
                    self.nodes[n].timer_at = Some(t);
                    self.push(t, Ev::Timer { n });
                }
            }
            None => self.nodes[n].timer_at = None,
        }
    }

    // ---------------------------------------------------------------- MAC

    fn medium_idle(&self, n: usize) -> bool {
        let sn = &self.nodes[n];
        if self.shared {
            sn.busy == 0 && !sn.transmitting
        } else {
            !sn.transmitting
        }
    }

    fn start_next(&mut self, n: usize) {
        let sn = &mut self.nodes[n];
        let Some(mut p) = sn.ctrl_q.pop_front().or_else(|| sn.data_q.pop_front()) else {
            return;
        };
        p.cw = match p.class {
            Class::Control => self.sc.medium.control_cw_min,
            Class::Data => self.sc.medium.cw_min,
        };
        sn.cur = Some(p);
        self.contend(n);
    }

    /// Draw a backoff for the current frame and start counting down when the medium is idle.
    fn contend(&mut self, n: usize) {
        let cw = self.nodes[n].cur.as_ref().map(|p| p.cw).unwrap_or(0);
        let slots = if self.shared {
            self.rng.gen_range(0..=cw)
        } else {
            0
        };
        let sn = &mut self.nodes[n];
        sn.state = MacState::Contend;
        sn.backoff_left = u64::from(slots) * self.slot;
        sn.countdown_start = None;
        sn.gen += 1;
        self.resume(n);
    }

    fn resume(&mut self, n: usize) {
        if self.nodes[n].state != MacState::Contend
            || self.nodes[n].countdown_start.is_some()
            || !self.medium_idle(n)
        {
            return;
        }
        let start = self.now + self.difs;
        let sn = &mut self.nodes[n];
        sn.countdown_start = Some(start);
        sn.gen += 1;
        let (gen, t) = (sn.gen, start + sn.backoff_left);
        self.push(t, Ev::ContendDone { n, gen });
    }

    fn freeze(&mut self, n: usize) {
        let slot = self.slot.max(1);
        let now = self.now;
        let sn = &mut self.nodes[n];
        if sn.state != MacState::Contend {
            return;
        }
        if let Some(start) = sn.countdown_start.take() {
            let elapsed = now.saturating_sub(start) / slot * slot;
            sn.backoff_left = sn.backoff_left.saturating_sub(elapsed);
            sn.gen += 1;
        }
    }

    fn airtime(&self, n: usize, dst: u32, len: usize) -> u64 {
        let rate = self
            .edge_ix
            .get(&(n as u32, dst))
            .map(|&i| self.edges[i].rate_mbps)
            .unwrap_or(self.sc.topology.rate_mbps);
        let bits = (len as f64 + f64::from(self.sc.medium.header_bytes)) * 8.0;
        self.preamble + us(bits / rate)
    }

    fn new_frame(&mut self, f: Frame) -> u64 {
        self.next_frame += 1;
        self.frames.insert(self.next_frame, f);
        self.next_frame
    }

    /// Put a frame on the air from `n` to every neighbour that can hear it.
    fn emit(&mut self, n: usize, frame: u64, dst: u32, air: u64) {
        let mut refs = 1;
        let outs = self.out[n].clone();
        for ei in outs {
            let e = &self.edges[ei];
            if !e.up || (!self.shared && dst != BROADCAST_NODE && e.to != dst) {
                continue;
            }
            let (to, delay) = (e.to as usize, e.delay_ns);
            if self.nodes[to].node.is_none() {
                continue;
            }
            self.push(self.now + delay, Ev::RxStart { n: to, frame });
            self.push(self.now + air + delay, Ev::RxEnd { n: to, frame });
            refs += 1;
        }
        if let Some(f) = self.frames.get_mut(&frame) {
            f.refs = refs;
        }
        self.push(self.now + air, Ev::TxEnd { n, frame });
        if self.shared {
            // Half duplex: whatever this node was receiving is lost.
            for r in &mut self.nodes[n].rx {
                r.1 = true;
            }
        }
    }

    fn transmit(&mut self, n: usize) {
        let Some(p) = self.nodes[n].cur.clone() else {
            self.nodes[n].state = MacState::Idle;
            return;
        };
        let air = self.airtime(n, p.next_hop, p.payload.len());
        let need_ack = p.class == Class::Control && p.next_hop != BROADCAST_NODE;
        let frame = self.new_frame(Frame {
            sender: n,
            dst: p.next_hop,
            payload: Some(p.payload.clone()),
            seq: p.seq,
            need_ack,
            refs: 0,
        });
        let sn = &mut self.nodes[n];
        sn.state = MacState::Tx;
        sn.transmitting = true;
        sn.mac.frames_sent += 1;
        match p.class {
            Class::Control => sn.mac.control_frames += 1,
            Class::Data => sn.mac.data_frames += 1,
        }
        sn.mac.airtime_ns += air;
        self.medium.frames_sent += 1;
        self.medium.airtime_ns += air;
        self.emit(n, frame, p.next_hop, air);
    }

    fn release(&mut self, frame: u64) {
        if let Some(f) = self.frames.get_mut(&frame) {
            f.refs = f.refs.saturating_sub(1);
            if f.refs == 0 {
                self.frames.remove(&frame);
            }
        }
    }

    fn tx_end(&mut self, n: usize, frame: u64) {
        let (is_ack, need_ack) = match self.frames.get(&frame) {
            Some(f) => (f.payload.is_none(), f.need_ack),
            None => (true, false),
        };
        self.release(frame);
        if is_ack && !self.shared {
            // A point-to-point ACK travels on the reverse link and never occupied the
            // node's transmitter.
            return;
        }
        self.nodes[n].transmitting = false;
        if self.nodes[n].node.is_none() {
            return;
        }
        if is_ack {
            self.resume(n);
            return;
        }
        if need_ack {
            let sn = &mut self.nodes[n];
            sn.state = MacState::WaitAck;
            sn.gen += 1;
            let gen = sn.gen;
            let t = self.now + self.sifs + self.ack_air + 2 * self.max_delay + self.slot.max(1000);
            self.push(t, Ev::AckTimeout { n, gen });
            return;
        }
        // Data: no link-layer acknowledgement.
        let was_data = self.nodes[n].cur.as_ref().map(|p| p.class) == Some(Class::Data);
        self.nodes[n].cur = None;
        self.nodes[n].state = MacState::Idle;
        if was_data && self.txop > 0 {
            // Refill, then continue the burst if the next data frame fits in the txop.
            self.nodes[n].state = MacState::Burst;
            self.kick(n);
            let sn = &self.nodes[n];
            let fits = sn.ctrl_q.is_empty()
                && sn.data_q.front().is_some_and(|p| {
                    let air = self.airtime(n, p.next_hop, p.payload.len());
                    self.now + self.sifs + air <= sn.burst_start + self.txop
                });
            if fits {
                let sn = &mut self.nodes[n];
                sn.gen += 1;
                let gen = sn.gen;
                self.push(self.now + self.sifs, Ev::BurstNext { n, gen });
                return;
            }
            self.nodes[n].state = MacState::Idle;
        }
        self.kick(n);
    }

    fn ack_timeout(&mut self, n: usize, gen: u64) {
        let limit = self.sc.medium.retry_limit;
        let cw_max = self.sc.medium.cw_max;
        let sn = &mut self.nodes[n];
        if sn.gen != gen || sn.state != MacState::WaitAck {
            return;
        }
        let Some(p) = sn.cur.as_mut() else {
            sn.state = MacState::Idle;
            return;
        };
        p.retries += 1;
        if p.retries > limit {
            sn.mac.link_drops += 1;
            self.medium.link_drops += 1;
            sn.cur = None;
            sn.state = MacState::Idle;
            self.kick(n);
            return;
        }
        p.cw = ((p.cw + 1) * 2 - 1).min(cw_max);
        sn.mac.link_retries += 1;
        self.medium.link_retries += 1;
        self.contend(n);
    }

    fn send_ack(&mut self, n: usize, to: usize, seq: u64) {
        if self.nodes[n].node.is_none() || (self.shared && self.nodes[n].transmitting) {
            return;
        }
        let frame = self.new_frame(Frame {
            sender: n,
            dst: to as u32,
            payload: None,
            seq,
            need_ack: false,
            refs: 0,
        });
        self.medium.acks_sent += 1;
        self.nodes[n].mac.acks_sent += 1;
        if self.shared {
            self.freeze(n);
            self.nodes[n].transmitting = true;
        }
        let air = self.ack_air;
        self.medium.airtime_ns += air;
        self.emit(n, frame, to as u32, air);
    }

    fn rx_start(&mut self, n: usize, frame: u64) {
        let Some(f) = self.frames.get(&frame) else {
            return;
        };
        let sender = f.sender;
        let up = self
            .edge_ix
            .get(&(sender as u32, n as u32))
            .is_some_and(|&i| self.edges[i].up);
        if self.nodes[n].node.is_none() || !up {
            return;
        }
        let shared = self.shared;
        let sn = &mut self.nodes[n];
        if shared {
            let corrupted = sn.transmitting || !sn.rx.is_empty();
            for r in &mut sn.rx {
                r.1 = true;
            }
            sn.rx.push((frame, corrupted));
            sn.busy += 1;
            if sn.busy == 1 {
                self.freeze(n);
            }
        } else {
            sn.rx.push((frame, false));
        }
    }

    fn rx_end(&mut self, n: usize, frame: u64) {
        let pos = self.nodes[n].rx.iter().position(|r| r.0 == frame);
        let Some(pos) = pos else {
            self.release(frame);
            return;
        };
        let (_, corrupted) = self.nodes[n].rx.swap_remove(pos);
        if self.shared {
            let sn = &mut self.nodes[n];
            sn.busy = sn.busy.saturating_sub(1);
            if sn.busy == 0 {
                self.resume(n);
            }
        }
        let Some(f) = self.frames.get(&frame) else {
            return;
        };
        let (sender, dst, seq, need_ack) = (f.sender, f.dst, f.seq, f.need_ack);
        let payload = f.payload.clone();
        self.release(frame);
        let intended = dst == n as u32 || dst == BROADCAST_NODE;
        let edge = self.edge_ix.get(&(sender as u32, n as u32)).copied();
        let Some(ei) = edge else { return };
        if !self.edges[ei].up || self.nodes[n].node.is_none() {
            return;
        }
        if corrupted {
            self.nodes[n].mac.rx_collisions += 1;
            if intended {
                self.medium.collisions += 1;
            }
            return;
        }
        let loss = self.edges[ei].loss;
        if loss > 0.0 && self.rng.gen::<f64>() < loss {
            if intended {
                self.medium.random_losses += 1;
            }
            return;
        }
        let Some(payload) = payload else {
            // An ACK.
            let sn = &mut self.nodes[n];
            if dst == n as u32
                && sn.state == MacState::WaitAck
                && sn.cur.as_ref().is_some_and(|p| p.seq == seq)
            {
                sn.cur = None;
                sn.state = MacState::Idle;
                sn.gen += 1;
                self.kick(n);
            }
            return;
        };
        if need_ack && dst == n as u32 {
            let t = self.now + self.sifs;
            self.push(t, Ev::SendAck { n, to: sender, seq });
            let last = self.nodes[n].last_seq.insert(sender, seq);
            if last == Some(seq) {
                // A retry of a frame we already passed up (our ACK was lost).
                self.nodes[n].mac.duplicates_filtered += 1;
                return;
            }
        }
        let now = self.inst();
        if let Some(node) = self.nodes[n].node.as_mut() {
            let _ = node.handle_datagram(now, &payload);
        }
        self.kick(n);
    }

    // ---------------------------------------------------------------- report

    fn report(&self, wall_s: f64) -> SimResult {
        let virtual_s = self.now as f64 / 1e9;
        let flows: Vec<FlowResult> = self
            .flows
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let size = f.data.len() as u64;
                let complete = f.delivered == size && f.identical && f.completed_at.is_some();
                let goodput = match f.last_delivery_at {
                    Some(t) if t > f.start && f.delivered > 0 => {
                        f.delivered as f64 * 8.0 / ((t - f.start) as f64 / 1e9)
                    }
                    _ => 0.0,
                };
                FlowResult {
                    index: i,
                    src: f.src as u32,
                    dst: f.dst as u32,
                    transport: f.transport.clone(),
                    flow_id: f.key.map(|k| k.to_string()),
                    size,
                    start: f.start as f64 / 1e9,
                    bytes_sent: f.offered,
                    bytes_delivered: f.delivered,
                    duplicate_bytes: f.duplicate_bytes,
                    identical: f.identical && f.delivered == size,
                    completed: complete,
                    completion_time: if complete {
                        f.completed_at.map(|t| (t - f.start) as f64 / 1e9)
                    } else {
                        None
                    },
                    send_complete_time: f.send_complete_at.map(|t| (t - f.start) as f64 / 1e9),
                    goodput_bps: goodput,
                    failed: f.failed.clone(),
                }
            })
            .collect();
        let nodes = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, sn)| {
                let mut all: Vec<NodeStats> = sn.past.clone();
                if let Some(n) = &sn.node {
                    all.push(n.stats());
                }
                NodeResult::from_stats(
                    i as u32,
                    sn.crashes,
                    sn.node.is_some(),
                    &all,
                    sn.mac.clone(),
                )
            })
            .collect();
        let goodputs: Vec<f64> = flows.iter().map(|f| f.goodput_bps).collect();
        SimResult {
            schema_version: crate::result::SCHEMA_VERSION,
            scenario: self.sc.name.clone(),
            seed: self.seed,
            medium_kind: if self.shared { "shared" } else { "p2p" }.into(),
            stop_reason: self.stop_reason.into(),
            virtual_seconds: virtual_s,
            wall_seconds: wall_s,
            all_flows_completed: flows.iter().all(|f| f.completed),
            jain_fairness: crate::result::jain(&goodputs),
            flows,
            nodes,
            medium: self.medium.clone(),
        }
    }
}
