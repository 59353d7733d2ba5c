//! The discrete-event engine: virtual time, the medium (shared 802.11-like or point-to-point),
//! per-node interface queues, the real [`hop_proto::Node`]s and the applications.

mod apps;
mod arrivals;
mod mac;
mod node;
mod report;
mod topology;

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap};

use rustc_hash::FxHashMap as HashMap;

use bytes::Bytes;
use hop_proto::{FlowKey, Instant, TransportId};
use rand::rngs::SmallRng;
use rand::SeedableRng;

use crate::error::ScenarioError;
use crate::result::{MediumCounters, SimResult};
use crate::scenario::{MediumKind, Scenario, DEFAULT_DURATION_S};
use crate::transports::Registry;

pub use apps::pattern;
use apps::AppFlow;
use mac::{Frame, ACK_BYTES};
use node::SimNode;
use topology::{Edge, SenseEdge};

/// Microseconds (a scenario's medium timings and link delays) as virtual-time nanoseconds.
fn ns_from_us(x: f64) -> u64 {
    (x * 1000.0).round() as u64
}
/// Seconds (a scenario's times and durations) as virtual-time nanoseconds.
fn ns_from_secs(x: f64) -> u64 {
    (x * 1e9).round() as u64
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ev {
    Stop,
    Scenario {
        idx: usize,
        rep: u32,
    },
    FlowStart(usize),
    Timer {
        n: usize,
    },
    ContendDone {
        n: usize,
        gen: u64,
    },
    BurstNext {
        n: usize,
        gen: u64,
    },
    AckTimeout {
        n: usize,
        gen: u64,
    },
    SendAck {
        n: usize,
        to: usize,
        seq: u64,
    },
    TxEnd {
        n: usize,
        frame: u64,
    },
    RxStart {
        n: usize,
        frame: u64,
    },
    RxEnd {
        n: usize,
        frame: u64,
    },
    /// A frame's start (or end) at every node in `Frame::receivers`, in that order: one event
    /// instead of one per receiver where all receivers hear it after the same delay.
    RxStartAll {
        frame: u64,
    },
    RxEndAll {
        frame: u64,
    },
    /// A node's NAV runs out (medium `nav`).
    NavEnd {
        n: usize,
    },
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
    /// Per node, the nodes that sense its transmissions without decoding them.
    sense_out: Vec<Vec<SenseEdge>>,
    /// Node positions (radio model), metres.
    positions: Option<Vec<(f64, f64)>>,
    frames: HashMap<u64, Frame>,
    /// Receivers of the frame being emitted (reused buffer).
    emit_scratch: Vec<(u32, u64)>,
    next_frame: u64,
    rng: SmallRng,
    flows: Vec<AppFlow>,
    flow_by_key: HashMap<FlowKey, usize>,
    flows_done: usize,
    tables: Vec<std::collections::HashMap<u32, u32>>,
    /// The route tables at the start of the run (flow sets' draws and flows' hop counts).
    start_tables: Vec<std::collections::HashMap<u32, u32>>,
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
    /// DIFS after a frame the node could not decode (medium `eifs`): SIFS + ACK + DIFS.
    eifs: u64,
    max_delay: u64,
}

/// What every node knows of its link: whether the medium retries control frames.
pub(crate) fn link_of(sc: &Scenario) -> crate::transports::Link {
    crate::transports::Link {
        control_retries: sc.medium.retry_limit > 0,
    }
}

/// The transports every node hosts: each name a flow uses, checked against the registry
/// (with its overrides) and for wire ids used twice.
fn hosted_transports(sc: &Scenario, registry: &Registry) -> Result<Vec<String>, ScenarioError> {
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
            .build(name, o, &link_of(sc))
            .map_err(|reason| ScenarioError::Transport {
                name: name.clone(),
                reason,
            })?;
    }

    Ok(hosted)
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
        let m = &sc.medium;
        let shared = m.kind == MediumKind::Shared;
        let end = ns_from_secs(sc.duration.unwrap_or(DEFAULT_DURATION_S));
        let mut sim = Simulation {
            seed,
            now: 0,
            end,
            seq: 0,
            queue: BinaryHeap::new(),
            nodes: Vec::new(),
            edges: Vec::new(),
            out: vec![Vec::new(); n as usize],
            edge_ix: HashMap::default(),
            sense_out: vec![Vec::new(); n as usize],
            positions: None,
            frames: HashMap::default(),
            emit_scratch: Vec::new(),
            next_frame: 0,
            rng: SmallRng::seed_from_u64(seed ^ 0x6d65_6469_756d),
            flows: Vec::new(),
            flow_by_key: HashMap::default(),
            flows_done: 0,
            tables: Vec::new(),
            start_tables: Vec::new(),
            hosted: Vec::new(),
            medium: MediumCounters::default(),
            stopped: false,
            stop_reason: "duration",
            shared,
            preamble: ns_from_us(m.preamble_us),
            difs: if shared { ns_from_us(m.difs_us) } else { 0 },
            sifs: ns_from_us(m.sifs_us),
            slot: if shared { ns_from_us(m.slot_us) } else { 0 },
            txop: ns_from_us(m.txop_us),
            ack_air: ns_from_us(m.preamble_us) + ns_from_us(ACK_BYTES * 8.0 / m.ack_rate_mbps),
            eifs: if shared && m.eifs {
                ns_from_us(m.sifs_us)
                    + ns_from_us(m.preamble_us)
                    + ns_from_us(ACK_BYTES * 8.0 / m.ack_rate_mbps)
                    + ns_from_us(m.difs_us)
            } else if shared {
                ns_from_us(m.difs_us)
            } else {
                0
            },
            max_delay: 0,
            registry,
            sc,
        };
        sim.build_topology(n)?;
        sim.tables = sim.compute_tables(false, None);
        sim.start_tables = sim.tables.clone();
        sim.expand_flow_sets()?;
        sim.hosted = hosted_transports(&sim.sc, &sim.registry)?;
        for id in 0..n as usize {
            let node = sim.fresh_node(id, 0)?;
            sim.nodes.push(SimNode::new(node));
        }
        // Applications.
        for (i, f) in sim.sc.flows.clone().iter().enumerate() {
            let size = f
                .size
                .bytes()
                .map_err(|e| ScenarioError::Invalid(format!("flows[{i}]: {e}")))?;
            let tid = sim.registry.id_of(&f.transport).unwrap_or(TransportId::Hop);
            sim.flows.push(AppFlow {
                src: f.src as usize,
                dst: f.dst as usize,
                transport: f.transport.clone(),
                tid,
                start: ns_from_secs(f.start),
                size,
                pattern_seed: seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                pending: Bytes::new(),
                key: None,
                offered: 0,
                finish_called: false,
                delivered: 0,
                duplicate_bytes: 0,
                identical: true,
                last_delivery_at: None,
                first_delivery_at: None,
                longest_gap: 0,
                completed_at: None,
                dst_finished_at: None,
                send_complete_at: None,
                failed: None,
                done: false,
            });
            sim.push(ns_from_secs(f.start), Ev::FlowStart(i));
        }
        for (idx, e) in sim.sc.events.iter().enumerate() {
            let t = ns_from_secs(e.at);
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
            Ev::Timer { n } => self.timer_fired(n),
            Ev::ContendDone { n, gen } => self.contend_done(n, gen),
            Ev::BurstNext { n, gen } => self.burst_next(n, gen),
            Ev::AckTimeout { n, gen } => self.ack_timeout(n, gen),
            Ev::SendAck { n, to, seq } => self.send_ack(n, to, seq),
            Ev::TxEnd { n, frame } => self.tx_end(n, frame),
            Ev::RxStart { n, frame } => self.rx_start(n, frame),
            Ev::RxEnd { n, frame } => self.rx_end(n, frame),
            Ev::RxStartAll { frame } => self.rx_start_all(frame),
            Ev::RxEndAll { frame } => self.rx_end_all(frame),
            Ev::NavEnd { n } => self.resume(n),
        }
    }
}
