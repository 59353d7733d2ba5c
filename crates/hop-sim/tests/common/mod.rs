//! A small test-only transport ("probe") to exercise the medium without the Hop transport.
//!
//! The source cuts the application stream into fixed-size chunks and sends them hop by hop
//! along the routing table; relays forward what they receive (no reliability of their own);
//! the destination delivers chunks in order and drops anything out of order. A FIN carries
//! the total size. Whether chunks go as Class::Control (link ACK + retries) or Class::Data is
//! configurable, so the medium's link-layer behaviour is visible end to end.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::Bytes;
use hop_proto::{
    AppError, Class, Ctx, Event, FlowKey, Instant, NodeId, Outgoing, Received, Transport,
    TransportId, TransportStats,
};
use hop_sim::{Overrides, Registry};

const CHUNK: usize = 1000;
const T_DATA: u8 = 1;
const T_FIN: u8 = 2;

pub struct Probe {
    class: Class,
    /// Outgoing messages waiting for the runtime to poll them.
    out: VecDeque<(NodeId, Vec<u8>)>,
    /// Local flows: dst, bytes not yet cut into chunks, next offset, finished?
    local: HashMap<FlowKey, (NodeId, Vec<u8>, u64, bool)>,
    /// Destination side: next expected offset.
    expect: HashMap<FlowKey, u64>,
    events: VecDeque<Event>,
    stats: TransportStats,
}

impl Probe {
    pub fn new(control: bool) -> Self {
        Probe {
            class: if control { Class::Control } else { Class::Data },
            out: VecDeque::new(),
            local: HashMap::new(),
            expect: HashMap::new(),
            events: VecDeque::new(),
            stats: TransportStats::default(),
        }
    }

    fn msg(t: u8, flow: FlowKey, dst: NodeId, off: u64, data: &[u8]) -> Vec<u8> {
        let mut v = vec![t];
        v.extend_from_slice(&flow.src.to_be_bytes());
        v.extend_from_slice(&flow.id.to_be_bytes());
        v.extend_from_slice(&dst.to_be_bytes());
        v.extend_from_slice(&off.to_be_bytes());
        v.extend_from_slice(data);
        v
    }
}

/// Registry with the probe under "probe" (`control = true` sends chunks as Class::Control).
pub fn registry() -> Registry {
    let mut r = Registry::empty();
    r.register("probe", TransportId::Hop, |o, _| {
        let mut ov = Overrides::new(o);
        let mut control = false;
        ov.bool("control", &mut control)?;
        ov.finish()?;
        Ok(Box::new(Probe::new(control)))
    });
    r
}

impl Transport for Probe {
    fn id(&self) -> TransportId {
        TransportId::Hop
    }

    fn open(&mut self, _ctx: &mut Ctx<'_>, key: FlowKey, dst: NodeId) -> Result<(), AppError> {
        self.local.insert(key, (dst, Vec::new(), 0, false));
        Ok(())
    }

    fn send(&mut self, _ctx: &mut Ctx<'_>, flow: FlowKey, data: Bytes) -> Result<usize, AppError> {
        let f = self
            .local
            .get_mut(&flow)
            .ok_or(AppError::UnknownFlow(flow))?;
        // Accept at most a few chunks at a time: the application is paced by Writable.
        let room = (4 * CHUNK).saturating_sub(f.1.len());
        let n = room.min(data.len());
        f.1.extend_from_slice(&data[..n]);
        Ok(n)
    }

    fn finish(&mut self, _ctx: &mut Ctx<'_>, flow: FlowKey) -> Result<(), AppError> {
        let f = self
            .local
            .get_mut(&flow)
            .ok_or(AppError::UnknownFlow(flow))?;
        f.3 = true;
        Ok(())
    }

    fn abort(&mut self, _ctx: &mut Ctx<'_>, flow: FlowKey) -> Result<(), AppError> {
        self.local.remove(&flow);
        Ok(())
    }

    fn handle(&mut self, ctx: &mut Ctx<'_>, rx: Received<'_>) -> Result<(), hop_wire::Error> {
        let b = rx.body;
        if b.len() < 21 {
            return Err(hop_wire::Error::Truncated {
                needed: 21,
                have: b.len(),
            });
        }
        if rx.overheard {
            *self.stats.extra.entry("overheard").or_default() += 1;
            return Ok(());
        }
        let t = b[0];
        let flow = FlowKey {
            src: u32::from_be_bytes([b[1], b[2], b[3], b[4]]),
            id: u32::from_be_bytes([b[5], b[6], b[7], b[8]]),
        };
        let dst = u32::from_be_bytes([b[9], b[10], b[11], b[12]]);
        let mut o = [0u8; 8];
        o.copy_from_slice(&b[13..21]);
        let off = u64::from_be_bytes(o);
        let data = &b[21..];
        *self
            .stats
            .received_by_type
            .entry(if t == T_DATA { "data" } else { "fin" })
            .or_default() += 1;
        if dst != ctx.local {
            if let Some(h) = ctx.routing.next_hop(dst) {
                self.out.push_back((h, b.to_vec()));
            }
            return Ok(());
        }
        let exp = self.expect.entry(flow).or_insert_with(|| {
            self.events.push_back(Event::FlowOpened { flow });
            0
        });
        if t == T_DATA && off == *exp {
            *exp += data.len() as u64;
            self.events.push_back(Event::Delivered {
                flow,
                offset: off,
                data: Bytes::copy_from_slice(data),
            });
        } else if t == T_FIN && off == *exp {
            self.events
                .push_back(Event::FlowFinished { flow, bytes: off });
        }
        Ok(())
    }

    fn handle_timeout(&mut self, _ctx: &mut Ctx<'_>) {}

    fn poll_transmit(&mut self, ctx: &mut Ctx<'_>) -> Option<Outgoing> {
        if self.out.is_empty() {
            // Cut one chunk (or the FIN) from a local flow, lowest key first.
            let mut keys: Vec<FlowKey> = self.local.keys().copied().collect();
            keys.sort();
            for k in keys {
                let f = self.local.get_mut(&k)?;
                let Some(h) = ctx.routing.next_hop(f.0) else {
                    continue;
                };
                if !f.1.is_empty() {
                    let n = f.1.len().min(CHUNK);
                    let chunk: Vec<u8> = f.1.drain(..n).collect();
                    let m = Self::msg(T_DATA, k, f.0, f.2, &chunk);
                    f.2 += n as u64;
                    self.out.push_back((h, m));
                    self.events.push_back(Event::Writable { flow: k });
                    break;
                } else if f.3 {
                    let m = Self::msg(T_FIN, k, f.0, f.2, &[]);
                    self.out.push_back((h, m));
                    let bytes = f.2;
                    self.local.remove(&k);
                    self.events
                        .push_back(Event::SendComplete { flow: k, bytes });
                    break;
                }
            }
        }
        let (h, body) = self.out.pop_front()?;
        *self
            .stats
            .sent_by_type
            .entry(if body[0] == T_DATA { "data" } else { "fin" })
            .or_default() += 1;
        Some(Outgoing {
            next_hop: h,
            class: self.class,
            body,
            head: 0,
        })
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn stats(&self) -> TransportStats {
        let mut s = self.stats.clone();
        s.flows = self.local.len() as u64;
        s
    }
}

/// Run a scenario text with the probe registry.
pub fn run(text: &str) -> hop_sim::SimResult {
    let sc = hop_sim::Scenario::from_toml(text).expect("scenario parses");
    hop_sim::Simulation::new(sc, registry())
        .expect("scenario builds")
        .run()
}

/// The JSON of a result without its wall-clock field.
pub fn json_without_wall(r: &hop_sim::SimResult) -> String {
    let mut v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    v.as_object_mut().unwrap().remove("wall_seconds");
    v.to_string()
}

pub fn sum_by<F: Fn(&hop_sim::NodeResult) -> u64>(r: &hop_sim::SimResult, f: F) -> u64 {
    r.nodes.iter().map(f).sum()
}

pub fn by_type(r: &hop_sim::NodeResult, t: &str) -> u64 {
    r.sent_by_type.get(t).copied().unwrap_or(0)
}

pub type Counts = BTreeMap<String, u64>;
