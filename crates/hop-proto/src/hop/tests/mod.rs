//! Tests of the Hop transport driven directly, one node at a time, grouped by the paper's
//! sections (§3.1-§3.6) and then by this implementation's extensions. Multi-node behaviour
//! is tested on the simulator (crates/hop-sim/tests).

mod admission;
mod backpressure;
mod block_transfer;
mod bsyn_timer;
mod config;
mod control_copies;
mod custody;
mod diag;
mod flows;
mod link_window;
mod loss;
mod micro;
mod robustness;
mod rounds_behind;
mod shared_turns;
mod vtx_cache;
mod withholding;

use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use rand::SeedableRng;

use super::*;
use crate::StaticRoutes;

/// Drives one transport directly, as node `local` with the given routes.
struct Harness {
    t: HopTransport,
    local: NodeId,
    routes: StaticRoutes,
    rng: rand::rngs::SmallRng,
    now: Instant,
}

impl Harness {
    fn new(local: NodeId, routes: &[(NodeId, NodeId)], t: HopTransport) -> Self {
        Harness {
            t,
            local,
            routes: routes.iter().copied().collect(),
            rng: rand::rngs::SmallRng::seed_from_u64(7),
            now: Instant::ZERO,
        }
    }

    fn with<R>(&mut self, f: impl FnOnce(&mut HopTransport, &mut Ctx<'_>) -> R) -> R {
        let mut ctx = Ctx {
            now: self.now,
            local: self.local,
            routing: &self.routes,
            rng: &mut self.rng,
        };
        f(&mut self.t, &mut ctx)
    }

    fn recv(&mut self, from: NodeId, msg: &HopMessage<'_>) {
        let mut body = Vec::new();
        msg.emit(&mut body).unwrap();
        let local = self.local;
        self.with(|t, ctx| {
            t.handle(
                ctx,
                Received {
                    link_src: from,
                    link_dst: local,
                    overheard: false,
                    body: &body,
                    shared: None,
                },
            )
        })
        .unwrap();
    }

    /// `msg` sent by `from` to another node, overheard here.
    fn overhear(&mut self, from: NodeId, to: NodeId, msg: &HopMessage<'_>) {
        let mut body = Vec::new();
        msg.emit(&mut body).unwrap();
        self.with(|t, ctx| {
            t.handle(
                ctx,
                Received {
                    link_src: from,
                    link_dst: to,
                    overheard: true,
                    body: &body,
                    shared: None,
                },
            )
        })
        .unwrap();
    }

    fn drain(&mut self) -> Vec<Outgoing> {
        let mut v = Vec::new();
        while let Some(o) = self.with(|t, ctx| t.poll_transmit(ctx)) {
            v.push(o);
        }
        v
    }
}

const FLOW: FlowKey = FlowKey { src: 1, id: 9 };

fn hdr(block: u32, flags: u8) -> HopHeader {
    HopHeader {
        priority: 0,
        flags,
        ttl: 0,
        src: FLOW.src,
        flow_id: FLOW.id,
        dst: 3,
        block_num: block,
    }
}

fn small_cfg() -> HopConfig {
    HopConfig {
        packet_payload_bytes: 100,
        micro_block_threshold: 0,
        // A flow's first block is a block like the others here; the opening block has tests
        // of its own (flows.rs).
        opening_block_packets: 0,
        back_quiet: Duration::ZERO,
        ..HopConfig::default()
    }
}

/// Deliver a whole 250-byte block (3 packets of 100) to a relay, as node 1 would.
fn feed_block(h: &mut Harness, block: u32, data: &[u8]) {
    feed_block_flags(h, block, 0, data);
}

/// [`feed_block`] with header flags (e.g. FIN on a flow's last block).
fn feed_block_flags(h: &mut Harness, block: u32, flags: u8, data: &[u8]) {
    let geom = BlockGeom {
        block_len: data.len() as u32,
        packet_size: 100,
    };
    h.recv(
        1,
        &HopMessage {
            header: hdr(block, flags),
            body: HopBody::Bsyn {
                ctl: ControlSeq::default(),
                offset: 0,
                geom,
                packet_num: 0,
                expect: 0,
                payload: &[],
            },
        },
    );
    for p in 0..geom.packets() {
        let r = geom.packet_range(p).unwrap();
        h.recv(
            1,
            &HopMessage {
                header: hdr(block, flags),
                body: HopBody::Data {
                    offset: 0,
                    geom,
                    packet_num: p as u16,
                    payload: &data[r],
                },
            },
        );
    }
}

/// A BACK with `header` holding the whole 250-byte block (3 packets of 100).
fn whole_back(header: HopHeader) -> HopMessage<'static> {
    HopMessage {
        header,
        body: HopBody::Back {
            ctl: ControlSeq::default(),
            duplicates: 0,
            block_hint_kib: 0,
            block_len: 250,
            packets: 3,
            bitmap: &[0x07],
        },
    }
}

/// BACKs to `to` (flags, packets).
fn backs_to(out: &[Outgoing], to: NodeId) -> Vec<(u8, u16)> {
    out.iter()
        .filter(|o| o.next_hop == to)
        .filter_map(|o| match HopMessage::parse(o.message()).ok()? {
            HopMessage {
                header,
                body: HopBody::Back { packets, .. },
            } => Some((header.flags, packets)),
            _ => None,
        })
        .collect()
}

#[derive(Default)]
struct Log {
    persisted: Vec<(FlowKey, u32, usize)>,
    released: Vec<(FlowKey, u32)>,
    full: bool,
    /// Answer `Persist::Later` (the write completes when the test says so).
    later: bool,
}

struct Recording(Arc<Mutex<Log>>);

impl CustodyStore for Recording {
    fn persist(&mut self, b: &StoredBlock) -> Result<Persist, StoreFull> {
        let mut l = self.0.lock().unwrap();
        if l.full {
            return Err(StoreFull);
        }
        l.persisted.push((b.flow, b.block_num, b.data.len()));
        Ok(if l.later {
            Persist::Later
        } else {
            Persist::Done
        })
    }
    fn release(&mut self, flow: FlowKey, block_num: u32) {
        self.0.lock().unwrap().released.push((flow, block_num));
    }
}

fn relay_bsyn(block_len: u32) -> HopMessage<'static> {
    bsyn_msg(hdr(0, 0), block_len)
}

/// A plain BSYN (no micro payload) for a block of `block_len` bytes in 100-byte packets.
fn bsyn_msg(header: HopHeader, block_len: u32) -> HopMessage<'static> {
    HopMessage {
        header,
        body: HopBody::Bsyn {
            ctl: ControlSeq::default(),
            offset: 0,
            geom: BlockGeom {
                block_len,
                packet_size: 100,
            },
            packet_num: 0,
            expect: 0,
            payload: &[],
        },
    }
}

/// The headers of the BSYNs in `out`.
fn bsyn_headers(out: &[Outgoing]) -> impl Iterator<Item = HopHeader> + '_ {
    out.iter()
        .filter_map(|o| match HopMessage::parse(o.message()).ok()? {
            HopMessage {
                header,
                body: HopBody::Bsyn { .. },
            } => Some(header),
            _ => None,
        })
}

fn bsyn_blocks(out: &[Outgoing]) -> Vec<u32> {
    bsyn_headers(out).map(|h| h.block_num).collect()
}

/// A BSYN from `src`'s flow `flow` (block 0, 250 bytes in 100-byte packets) to node 2.
fn bsyn_from(src: NodeId, flow: u32) -> HopMessage<'static> {
    let mut m = bsyn_with_expect(0, 250, 0);
    m.header.src = src;
    m.header.flow_id = flow;
    m.header.dst = 2;
    m
}

/// The three data packets of `bsyn_from`'s block.
fn complete_block_from(h: &mut Harness, src: NodeId, flow: u32) {
    let data = [1u8; 100];
    for p in 0..3u16 {
        let len = if p == 2 { 50 } else { 100 };
        let mut m = data_packet(0, 250, p, &data[..len]);
        m.header.src = src;
        m.header.flow_id = flow;
        m.header.dst = 2;
        h.recv(src, &m);
    }
}

fn bsyn_with_expect(block: u32, len: u32, expect: u16) -> HopMessage<'static> {
    HopMessage {
        header: hdr(block, 0),
        body: HopBody::Bsyn {
            ctl: ControlSeq::default(),
            offset: 0,
            geom: BlockGeom {
                block_len: len,
                packet_size: 100,
            },
            packet_num: 0,
            expect,
            payload: &[],
        },
    }
}

fn data_packet(block: u32, len: u32, p: u16, payload: &[u8]) -> HopMessage<'_> {
    HopMessage {
        header: hdr(block, 0),
        body: HopBody::Data {
            offset: 0,
            geom: BlockGeom {
                block_len: len,
                packet_size: 100,
            },
            packet_num: p,
            payload,
        },
    }
}

/// A source (node 1, next hop 2) with one 1000-byte block of ten packets, after the first
/// BACK; returns the harness and the datagrams of the first round.
fn source_round(cfg: HopConfig) -> (Harness, Vec<Outgoing>) {
    source_round_with(cfg, |_| {})
}

/// `source_round` with `prepare` applied to the transport before the flow opens.
fn source_round_with(
    cfg: HopConfig,
    prepare: impl FnOnce(&mut HopTransport),
) -> (Harness, Vec<Outgoing>) {
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    prepare(&mut h.t);
    let key = FlowKey { src: 1, id: 4 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; 1000])))
        .unwrap();
    h.drain();
    h.recv(2, &source_back(&[0, 0]));
    let out = h.drain();
    (h, out)
}

fn source_back(bitmap: &[u8]) -> HopMessage<'_> {
    HopMessage {
        header: HopHeader {
            src: 1,
            flow_id: 4,
            ..hdr(0, 0)
        },
        body: HopBody::Back {
            ctl: ControlSeq::default(),
            duplicates: 0,
            block_hint_kib: 0,
            block_len: 1000,
            packets: 10,
            bitmap,
        },
    }
}

/// What `pick` takes from each message in `out` that it matches.
fn bodies<T>(out: &[Outgoing], pick: impl Fn(HopBody<'_>) -> Option<T>) -> Vec<T> {
    out.iter()
        .filter_map(|o| pick(HopMessage::parse(o.message()).ok()?.body))
        .collect()
}

fn data_nums(out: &[Outgoing]) -> Vec<u16> {
    bodies(out, |b| match b {
        HopBody::Data { packet_num, .. } => Some(packet_num),
        _ => None,
    })
}

/// Whether deliveries are refused, and the (block, offset, length) of each one accepted.
type DeliveryLog = (bool, Vec<(u32, u64, usize)>);

/// A store whose deliveries can be refused (a destination short of disk room).
struct Deliveries(Arc<Mutex<DeliveryLog>>);

impl CustodyStore for Deliveries {
    fn persist(&mut self, _b: &StoredBlock) -> Result<Persist, StoreFull> {
        Ok(Persist::Done)
    }
    fn release(&mut self, _flow: FlowKey, _block_num: u32) {}
    fn deliver(&mut self, d: &Delivery) -> Result<Persist, StoreFull> {
        let mut l = self.0.lock().unwrap();
        if l.0 {
            return Err(StoreFull);
        }
        l.1.push((d.block_num, d.offset, d.data.len()));
        Ok(Persist::Done)
    }
}

/// Node 1 with flows 4 (to node 3, via 2) and 5 (to node 5, via 4), 10 packets each, an
/// 8-packet link window and txops of 2 packets; both BSYNs sent.
fn two_flow_source_with(cfg: HopConfig) -> Harness {
    two_flow_source_window(cfg, 8)
}

/// The same with a link window of `w` packets.
fn two_flow_source_window(cfg: HopConfig, w: usize) -> Harness {
    let cfg = HopConfig {
        link_window_packets: w,
        link_window_max_packets: w,
        txop_bytes: 200,
        ..cfg
    };
    let mut h = Harness::new(1, &[(3, 2), (2, 2), (5, 4), (4, 4)], HopTransport::new(cfg));
    for (id, dst) in [(4, 3), (5, 5)] {
        let key = FlowKey { src: 1, id };
        h.with(|t, ctx| t.open(ctx, key, dst)).unwrap();
        h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; 1000])))
            .unwrap();
    }
    h.drain();
    h
}

/// The acknowledgements among the end-to-end BACKs in `out` (not a full destination's wait
/// notices).
fn e2e_cums(out: &[Outgoing]) -> Vec<u32> {
    out.iter()
        .filter_map(|o| match HopMessage::parse(o.message()).ok()? {
            HopMessage {
                header,
                body: HopBody::E2eBack { cum_blocks },
            } if header.flags & FLAG_WAIT == 0 => Some(cum_blocks),
            _ => None,
        })
        .collect()
}

/// The full destination's wait notices in `out`: (next hop, block).
fn full_notices(out: &[Outgoing]) -> Vec<(NodeId, u32)> {
    out.iter()
        .filter_map(|o| match HopMessage::parse(o.message()).ok()? {
            HopMessage {
                header,
                body: HopBody::E2eBack { .. },
            } if header.flags & FLAG_WAIT != 0 => Some((o.next_hop, header.block_num)),
            _ => None,
        })
        .collect()
}

/// Every packet of `FLOW`'s last (and only) 250-byte block, each flagged FIN, from node 1,
/// and no BSYN for it.
fn last_block_by_data(h: &mut Harness) {
    let geom = BlockGeom {
        block_len: 250,
        packet_size: 100,
    };
    let data = [7u8; 250];
    for p in 0..geom.packets() {
        h.recv(
            1,
            &HopMessage {
                header: hdr(0, FLAG_FIN),
                body: HopBody::Data {
                    offset: 0,
                    geom,
                    packet_num: p as u16,
                    payload: &data[geom.packet_range(p).unwrap()],
                },
            },
        );
    }
}
