//! The hosted nodes: each a real `hop_proto::Node` with its interface queues and MAC state,
//! driven by the simulator (kick, timer), crashed and restarted by scenario events.

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;

use bytes::Bytes;
use hop_proto::{Class, Node, NodeStats};
use hop_wire::BROADCAST_NODE;

use super::mac::{MacState, Pending};
use super::{Ev, Simulation};
use crate::error::ScenarioError;
use crate::result::MacCounters;
use crate::scenario::QueueMode;

/// Minimum re-arm delay when a transport reports a deadline it did not clear.
const STALE_TIMER_NS: u64 = 1_000_000;

pub(super) struct SimNode {
    pub(super) node: Option<Node>,
    pub(super) incarnation: u64,
    pub(super) crashes: u64,
    pub(super) timer_at: Option<u64>,
    /// The earliest timer event of this node in the event queue (later ones may be there
    /// too): a deadline that moves later pushes no event, so the queue does not fill with
    /// stale ones.
    pub(super) timer_queued: Option<u64>,
    pub(super) ctrl_q: VecDeque<Pending>,
    pub(super) data_q: VecDeque<Pending>,
    pub(super) cur: Option<Pending>,
    pub(super) state: MacState,
    pub(super) gen: u64,
    pub(super) backoff_left: u64,
    pub(super) countdown_start: Option<u64>,
    pub(super) burst_start: u64,
    pub(super) busy: u32,
    /// Virtual carrier sense: the medium counts as busy until then (medium `nav`).
    pub(super) nav_until: u64,
    /// The last frame this node received could not be decoded: it defers EIFS instead of
    /// DIFS (medium `eifs`).
    pub(super) eifs: bool,
    pub(super) transmitting: bool,
    pub(super) rx: Vec<super::mac::Rx>,
    pub(super) last_seq: HashMap<usize, u64>,
    pub(super) tx_seq: u64,
    pub(super) mac: MacCounters,
    /// Stats of earlier incarnations (before crashes).
    pub(super) past: Vec<NodeStats>,
}

impl SimNode {
    /// A node just built, with empty queues and an idle MAC.
    pub(super) fn new(node: Node) -> Self {
        SimNode {
            node: Some(node),
            incarnation: 0,
            crashes: 0,
            timer_at: None,
            timer_queued: None,
            ctrl_q: VecDeque::new(),
            data_q: VecDeque::new(),
            cur: None,
            state: MacState::Idle,
            gen: 0,
            backoff_left: 0,
            countdown_start: None,
            burst_start: 0,
            busy: 0,
            nav_until: 0,
            eifs: false,
            transmitting: false,
            rx: Vec::new(),
            last_seq: HashMap::default(),
            tx_seq: 0,
            mac: MacCounters::default(),
            past: Vec::new(),
        }
    }

    pub(super) fn queued(&self) -> usize {
        self.ctrl_q.len() + self.data_q.len() + usize::from(self.cur.is_some())
    }
}

impl Simulation {
    pub(super) fn fresh_node(&self, id: usize, incarnation: u64) -> Result<Node, ScenarioError> {
        let node_seed = self.seed ^ incarnation.wrapping_mul(0xA076_1D64_78BD_642F);
        let mut node = Node::new(id as u32, self.routes_for(id), node_seed);
        // The medium hands a node a frame's bytes as sent or not at all (a corrupted frame is
        // dropped by the MAC, mac.rs), as hopd's sealed link does (a bad tag drops it): the
        // envelope checksum would be computed for every frame and compared at every node that
        // hears it, to no effect. Datagrams and results are the same either way.
        node.set_sealed_link(true);
        let empty = toml::Table::new();
        for name in &self.hosted {
            let o = self.sc.transports.get(name).unwrap_or(&empty);
            let t = self
                .registry
                .build(name, o, &super::link_of(&self.sc))
                .map_err(|reason| ScenarioError::Transport {
                    name: name.clone(),
                    reason,
                })?;
            node.add_transport(t);
        }
        Ok(node)
    }

    /// Drain events, refill the interface queue, start the MAC, re-arm the timer.
    pub(super) fn kick(&mut self, n: usize) {
        if self.nodes[n].node.is_none() {
            return;
        }
        let push = self.sc.medium.queue_mode == QueueMode::Push;
        // Pull: poll only while the interface queue has room. Push: take everything; the
        // class queues drop what does not fit.
        let cap = if push {
            usize::MAX
        } else {
            self.sc.medium.queue_frames
        };
        let class_cap = self.sc.medium.mac_queue_frames;
        let data_broadcast = self.sc.medium.data_broadcast;
        let t_now = self.now;
        loop {
            let mut progressed = false;
            while let Some(ev) = self.nodes[n].node.as_mut().and_then(|x| x.poll_event()) {
                progressed = true;
                self.app_event(n, ev.event);
            }
            let now = self.inst();
            let control_when_full = !push && self.sc.medium.control_when_full;
            loop {
                let sn = &mut self.nodes[n];
                let room = sn.queued() < cap;
                if !room && !control_when_full {
                    break;
                }
                let Some(node) = sn.node.as_mut() else { break };
                let polled = if room {
                    node.poll_transmit(now)
                } else {
                    node.poll_control(now)
                };
                let Some(t) = polled else {
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
                    payload: Bytes::from(t.payload),
                    retries: 0,
                    cw: 0,
                    seq: sn.tx_seq,
                    enqueued: t_now,
                };
                let q = match t.class {
                    Class::Control => &mut sn.ctrl_q,
                    Class::Data | Class::Acked => &mut sn.data_q,
                };
                if push && q.len() >= class_cap {
                    sn.mac.queue_drops += 1;
                    self.medium.queue_drops += 1;
                } else {
                    q.push_back(p);
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

    /// The node's timer event: hand the timeout to the node, then serve what it produced.
    pub(super) fn timer_fired(&mut self, n: usize) {
        if self.nodes[n].timer_queued == Some(self.now) {
            self.nodes[n].timer_queued = None;
        }
        if self.nodes[n].timer_at != Some(self.now) {
            // Stale: the deadline moved. A later one still needs its event.
            if let Some(t) = self.nodes[n].timer_at {
                self.queue_timer(n, t);
            }
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

    pub(super) fn arm_timer(&mut self, n: usize, min_t: u64) {
        let Some(node) = self.nodes[n].node.as_ref() else {
            return;
        };
        match node.poll_timeout() {
            Some(t) => {
                let t = t.as_nanos().max(min_t);
                self.nodes[n].timer_at = Some(t);
                self.queue_timer(n, t);
            }
            None => self.nodes[n].timer_at = None,
        }
    }

    /// Make sure an event fires at or before `t` for node `n`'s timer.
    fn queue_timer(&mut self, n: usize, t: u64) {
        if self.nodes[n].timer_queued.is_none_or(|q| q > t) {
            self.nodes[n].timer_queued = Some(t);
            self.push(t, Ev::Timer { n });
        }
    }

    pub(super) fn crash(&mut self, n: usize) {
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

    pub(super) fn restart(&mut self, n: usize) {
        if self.nodes[n].node.is_some() {
            return;
        }
        let inc = self.nodes[n].incarnation + 1;
        let node = self.fresh_node(n, inc).expect(
            "the node's transports, with the same names and overrides, were built when the \
             simulation was",
        );
        let sn = &mut self.nodes[n];
        sn.node = Some(node);
        sn.incarnation = inc;
        self.kick(n);
    }
}
