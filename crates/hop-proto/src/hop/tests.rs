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
        back_quiet: Duration::ZERO,
        ..HopConfig::default()
    }
}

/// Deliver a whole 250-byte block (3 packets of 100) to a relay, as node 1 would.
fn feed_block(h: &mut Harness, block: u32, data: &[u8]) {
    let geom = BlockGeom {
        block_len: data.len() as u32,
        packet_size: 100,
    };
    h.recv(
        1,
        &HopMessage {
            header: hdr(block, 0),
            body: HopBody::Bsyn {
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
                header: hdr(block, 0),
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

/// BACKs to `to` (flags, packets), wait notices left out.
fn backs_to(out: &[Outgoing], to: NodeId) -> Vec<(u8, u16)> {
    backs_and_waits_to(out, to)
        .into_iter()
        .filter(|(f, _)| f & FLAG_WAIT == 0)
        .collect()
}

/// Wait notices to `to` (BACKs with `FLAG_WAIT`).
fn waits_to(out: &[Outgoing], to: NodeId) -> usize {
    backs_and_waits_to(out, to)
        .iter()
        .filter(|(f, _)| f & FLAG_WAIT != 0)
        .count()
}

fn backs_and_waits_to(out: &[Outgoing], to: NodeId) -> Vec<(u8, u16)> {
    out.iter()
        .filter(|o| o.next_hop == to)
        .filter_map(|o| match HopMessage::parse(&o.body).ok()? {
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

#[test]
fn defaults_are_the_papers() {
    let c = HopConfig::default();
    assert_eq!(c.max_block_bytes, 1 << 20);
    assert_eq!(c.micro_block_threshold, 16 * 1024);
    assert_eq!(c.backpressure_limit, 1);
    assert_eq!(c.vtx_initial_timeout, Duration::from_secs(60));
    assert_eq!(c.vtx_ttl, 50);
    assert!(c.backpressure && c.ack_withholding && c.pipelining);
    // Withheld BSYNs are answered by silence, as in §3.5.
    assert!(!c.wait_notice && !c.txop_past_full_window);
    // A full data datagram with envelope, crc and auth trailer fits a 1472-byte UDP payload.
    let worst = hop_wire::envelope::HEADER_LEN
        + hop_wire::hop::HEADER_LEN
        + hop_wire::hop::BSYN_FIXED_LEN.max(hop_wire::hop::DATA_FIXED_LEN)
        + c.packet_payload_bytes
        + hop_wire::envelope::CRC_LEN
        + 24;
    assert!(worst <= 1472, "{worst}");
    assert_eq!(c.txop_packets(), 6);
}

#[test]
fn custody_is_persisted_before_the_completing_back_and_released_downstream() {
    let log = Arc::new(Mutex::new(Log::default()));
    let t = HopTransport::with_store(small_cfg(), Box::new(Recording(log.clone())));
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], t);
    let data: Vec<u8> = (0..250).map(|i| i as u8).collect();
    feed_block(&mut h, 0, &data);
    let out = h.drain();
    let backs = backs_to(&out, 1);
    assert_eq!(backs.last().unwrap().0 & FLAG_COMPLETE, FLAG_COMPLETE);
    assert_eq!(log.lock().unwrap().persisted, vec![(FLOW, 0, 250)]);
    assert!(log.lock().unwrap().released.is_empty());
    // The relay forwards: a BSYN to node 3.
    assert!(out
        .iter()
        .any(|o| o.next_hop == 3 && o.class == Class::Control));
    // Node 3 reports the whole block: custody is released.
    h.recv(3, &whole_block_back());
    assert_eq!(log.lock().unwrap().released, vec![(FLOW, 0)]);
}

/// Node 3's BACK holding the whole 250-byte block 0.
fn whole_block_back() -> HopMessage<'static> {
    HopMessage {
        header: hdr(0, FLAG_COMPLETE),
        body: HopBody::Back {
            duplicates: 0,
            block_len: 250,
            packets: 3,
            bitmap: &[0x07],
        },
    }
}

/// Relay 2 with a store that writes later, having received block 0 whole from node 1.
fn deferred_relay() -> (Harness, Arc<Mutex<Log>>) {
    let log = Arc::new(Mutex::new(Log {
        later: true,
        ..Log::default()
    }));
    let t = HopTransport::with_store(small_cfg(), Box::new(Recording(log.clone())));
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], t);
    feed_block(&mut h, 0, &[5u8; 250]);
    (h, log)
}

fn relay_bsyn(block_len: u32) -> HopMessage<'static> {
    bsyn_msg(hdr(0, 0), block_len)
}

/// A plain BSYN (no micro payload) for a block of `block_len` bytes in 100-byte packets.
fn bsyn_msg(header: HopHeader, block_len: u32) -> HopMessage<'static> {
    HopMessage {
        header,
        body: HopBody::Bsyn {
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

#[test]
fn completing_back_waits_for_a_deferred_write_while_the_block_moves_on() {
    let (mut h, log) = deferred_relay();
    let out = h.drain();
    // Written later: no completing BACK yet, but the block is forwarded already.
    assert!(backs_to(&out, 1)
        .iter()
        .all(|(f, _)| f & FLAG_COMPLETE == 0));
    assert!(out.iter().any(|o| o.next_hop == 3));
    assert_eq!(log.lock().unwrap().persisted, vec![(FLOW, 0, 250)]);
    // The upstream asks again meanwhile: still no completing BACK, and no second write.
    h.recv(1, &relay_bsyn(250));
    assert!(backs_to(&h.drain(), 1)
        .iter()
        .all(|(f, _)| f & FLAG_COMPLETE == 0));
    assert_eq!(log.lock().unwrap().persisted.len(), 1);
    // Durable: the completing BACK goes; the block is in custody until node 3 has it.
    h.with(|t, ctx| t.custody_persisted(ctx, FLOW, 0, true));
    assert_eq!(backs_to(&h.drain(), 1), vec![(FLAG_COMPLETE, 3)]);
    assert!(log.lock().unwrap().released.is_empty());
    h.recv(3, &whole_block_back());
    assert_eq!(log.lock().unwrap().released, vec![(FLOW, 0)]);
}

#[test]
fn failed_deferred_write_withholds_the_back_until_the_next_bsyn() {
    let (mut h, log) = deferred_relay();
    h.drain();
    h.with(|t, ctx| t.custody_persisted(ctx, FLOW, 0, false));
    assert!(backs_to(&h.drain(), 1)
        .iter()
        .all(|(f, _)| f & FLAG_COMPLETE == 0));
    assert_eq!(log.lock().unwrap().released, vec![(FLOW, 0)]);
    assert_eq!(h.t.stats().extra["custody_write_failed"], 1);
    // The upstream's next BSYN writes it again; this time it is done at once.
    log.lock().unwrap().later = false;
    h.recv(1, &relay_bsyn(250));
    assert_eq!(backs_to(&h.drain(), 1), vec![(FLAG_COMPLETE, 3)]);
    assert_eq!(log.lock().unwrap().persisted.len(), 2);
}

#[test]
fn a_write_finishing_after_the_block_moved_downstream_is_released() {
    let (mut h, log) = deferred_relay();
    h.drain();
    h.recv(3, &whole_block_back());
    assert!(log.lock().unwrap().released.is_empty());
    h.with(|t, ctx| t.custody_persisted(ctx, FLOW, 0, true));
    assert_eq!(backs_to(&h.drain(), 1), vec![(FLAG_COMPLETE, 3)]);
    assert_eq!(log.lock().unwrap().released, vec![(FLOW, 0)]);
}

#[test]
fn full_custody_store_withholds_the_back() {
    let log = Arc::new(Mutex::new(Log {
        full: true,
        ..Log::default()
    }));
    let t = HopTransport::with_store(small_cfg(), Box::new(Recording(log.clone())));
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], t);
    let data = [5u8; 250];
    feed_block(&mut h, 0, &data);
    let out = h.drain();
    assert!(backs_to(&out, 1)
        .iter()
        .all(|(f, _)| f & FLAG_COMPLETE == 0));
    assert_eq!(h.t.stats().extra["custody_store_full"], 1);
    // Room again: the upstream's next BSYN gets the completing BACK.
    log.lock().unwrap().full = false;
    h.recv(1, &relay_bsyn(250));
    let out = h.drain();
    assert_eq!(backs_to(&out, 1), vec![(FLAG_COMPLETE, 3)]);
    assert_eq!(log.lock().unwrap().persisted.len(), 1);
}

#[test]
fn restored_blocks_are_forwarded() {
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(small_cfg()));
    h.t.restore(
        Instant::ZERO,
        2,
        vec![StoredBlock {
            flow: FLOW,
            dst: 3,
            block_num: 4,
            offset: 1000,
            fin: true,
            data: Bytes::from(vec![1u8; 250]),
        }],
    );
    assert_eq!(h.t.stats().cache_bytes, 250);
    // The next timer pumps the flow: a BSYN for block 4 goes to node 3.
    h.now = h.t.poll_timeout().unwrap();
    h.with(|t, ctx| t.handle_timeout(ctx));
    let out = h.drain();
    let bsyn = out
        .iter()
        .find_map(|o| match HopMessage::parse(&o.body).ok()? {
            m @ HopMessage {
                body: HopBody::Bsyn { .. },
                ..
            } => Some((o.next_hop, m.header)),
            _ => None,
        })
        .unwrap();
    assert_eq!(bsyn.0, 3);
    assert_eq!(bsyn.1.block_num, 4);
    assert_eq!(bsyn.1.flags & FLAG_FIN, FLAG_FIN);
}

#[test]
fn flow_limit_refuses_new_flows() {
    let cfg = HopConfig {
        max_flows: 2,
        ..small_cfg()
    };
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(cfg));
    for id in 0..3u32 {
        let msg = HopMessage {
            header: HopHeader {
                flow_id: id,
                ..hdr(0, 0)
            },
            body: HopBody::Bsyn {
                offset: 0,
                geom: BlockGeom {
                    block_len: 250,
                    packet_size: 100,
                },
                packet_num: 0,
                expect: 0,
                payload: &[],
            },
        };
        h.recv(1, &msg);
    }
    assert_eq!(h.t.stats().flows, 2);
    assert_eq!(h.t.stats().extra["flows_refused"], 1);
    let r = h.with(|t, ctx| t.open(ctx, FlowKey { src: 2, id: 1 }, 9));
    assert_eq!(r, Err(AppError::TooManyFlows(2)));
}

#[test]
fn cache_is_bounded_and_never_drops_custody() {
    let cfg = HopConfig {
        cache_limit_bytes: 600,
        backpressure_limit: 10,
        ..small_cfg()
    };
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(cfg));
    // Three 250-byte blocks: the third does not fit beside two blocks in custody.
    for b in 0..3 {
        feed_block(&mut h, b, &[b as u8; 250]);
    }
    let out = h.drain();
    let complete = backs_to(&out, 1)
        .iter()
        .filter(|(f, _)| f & FLAG_COMPLETE != 0)
        .count();
    assert_eq!(complete, 2);
    assert!(h.t.stats().cache_bytes <= 600);
    assert!(h.t.stats().extra["backpressure_withheld"] >= 1);
}

proptest! {
    #[test]
    fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..200), overheard: bool) {
        let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(small_cfg()));
        let _ = h.with(|t, ctx| t.handle(ctx, Received { link_src: 1, link_dst: 2, overheard, body: &body }));
        h.drain();
    }

    #[test]
    fn valid_but_arbitrary_messages_never_panic(
        kind in 0u8..5, flags in 0u8..0x40, ttl: u8, block in 0u32..4, len in 0u32..400,
        pn in 0u16..5, src in 1u32..4, dst in 1u32..4, cum in 0u32..5,
    ) {
        let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(small_cfg()));
        let geom = BlockGeom { block_len: len, packet_size: 100 };
        let payload = geom.packet_range(u32::from(pn)).map(|r| vec![0u8; r.len()]);
        let header = HopHeader { flags, ttl, src, flow_id: 1, dst, block_num: block };
        let body = match (kind, &payload) {
            (0, Some(p)) => HopBody::Data { offset: 0, geom, packet_num: pn, payload: p },
            (1, Some(p)) if flags & FLAG_MICRO != 0 => HopBody::Bsyn { offset: 0, geom, packet_num: pn, expect: 0, payload: p },
            (1, _) => HopBody::Bsyn { offset: 0, geom, packet_num: 0, expect: (pn as u32).min(geom.packets()) as u16, payload: &[] },
            (2, _) => HopBody::Back { duplicates: 0, block_len: len, packets: 3, bitmap: &[0x05] },
            (3, _) => HopBody::E2eBack { cum_blocks: cum },
            _ => HopBody::Fin { total_bytes: 7 },
        };
        let msg = HopMessage { header: HopHeader { flags: if matches!(body, HopBody::Bsyn { .. }) && flags & FLAG_MICRO != 0 && payload.is_none() { flags & !FLAG_MICRO } else { flags }, ..header }, body };
        let mut bytes = Vec::new();
        if msg.emit(&mut bytes).is_ok() && HopMessage::parse(&bytes).is_ok() {
            for step in 0..3 {
                let _ = h.with(|t, ctx| t.handle(ctx, Received { link_src: 1 + step % 2 * 2, link_dst: 2, overheard: false, body: &bytes }));
                h.now += Duration::from_millis(300);
                h.with(|t, ctx| t.handle_timeout(ctx));
                h.drain();
            }
        }
    }
}

fn bsyn_blocks(out: &[Outgoing]) -> Vec<u32> {
    out.iter()
        .filter_map(|o| match HopMessage::parse(&o.body).ok()? {
            HopMessage {
                header,
                body: HopBody::Bsyn { .. },
            } => Some(header.block_num),
            _ => None,
        })
        .collect()
}

#[test]
fn source_keeps_blocks_until_end_to_end_back_within_its_cache() {
    let cfg = HopConfig {
        max_block_bytes: 250,
        cache_limit_bytes: 300,
        ..small_cfg()
    };
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    let key = FlowKey { src: 1, id: 9 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    let n = h
        .with(|t, ctx| t.send(ctx, key, Bytes::from(vec![7u8; 500])))
        .unwrap();
    assert_eq!(n, 500);
    assert_eq!(bsyn_blocks(&h.drain()), vec![0]);
    let back = |block| HopMessage {
        header: HopHeader {
            src: 1,
            dst: 3,
            ..hdr(block, FLAG_COMPLETE)
        },
        body: HopBody::Back {
            duplicates: 0,
            block_len: 250,
            packets: 3,
            bitmap: &[0x07],
        },
    };
    h.recv(2, &back(0));
    // Block 0 moved to node 2 but is not acknowledged end to end: the source keeps it, and
    // with the cache full it does not cut block 1 yet.
    assert!(bsyn_blocks(&h.drain()).is_empty());
    assert_eq!(h.t.stats().cache_bytes, 500);
    h.recv(
        2,
        &HopMessage {
            header: HopHeader {
                src: 1,
                dst: 3,
                ..hdr(0, 0)
            },
            body: HopBody::E2eBack { cum_blocks: 1 },
        },
    );
    assert_eq!(bsyn_blocks(&h.drain()), vec![1]);
    assert_eq!(h.t.stats().cache_bytes, 250);
}

#[test]
fn ack_withholding_prefers_small_blocks_and_skips_silent_senders() {
    // Node 2 is the destination of three flows from nodes 1, 3 and 4 (its neighbours).
    let mut h = Harness::new(2, &[(1, 1), (3, 3), (4, 4)], HopTransport::new(small_cfg()));
    let bsyn = |src: NodeId, len: u32| HopMessage {
        header: HopHeader {
            flags: 0,
            ttl: 0,
            src,
            flow_id: 1,
            dst: 2,
            block_num: 0,
        },
        body: HopBody::Bsyn {
            offset: 0,
            geom: BlockGeom {
                block_len: len,
                packet_size: 100,
            },
            packet_num: 0,
            expect: 0,
            payload: &[],
        },
    };
    h.recv(1, &bsyn(1, 250));
    h.recv(3, &bsyn(3, 900));
    h.recv(4, &bsyn(4, 300));
    let out = h.drain();
    assert_eq!(backs_to(&out, 1).len(), 1);
    assert!(backs_to(&out, 3).is_empty() && backs_to(&out, 4).is_empty());
    assert_eq!(h.t.stats().extra["acks_withheld"], 2);
    // Node 1 completes its block: the smaller waiting block (node 4's) is served next.
    let geom = BlockGeom {
        block_len: 250,
        packet_size: 100,
    };
    for p in 0..3u16 {
        let r = geom.packet_range(u32::from(p)).unwrap();
        let data = [1u8; 100];
        h.recv(
            1,
            &HopMessage {
                header: HopHeader {
                    src: 1,
                    flow_id: 1,
                    dst: 2,
                    ..hdr(0, 0)
                },
                body: HopBody::Data {
                    offset: 0,
                    geom,
                    packet_num: p,
                    payload: &data[..r.len()],
                },
            },
        );
    }
    let out = h.drain();
    let to1 = backs_to(&out, 1);
    assert_eq!(to1.len(), 1);
    assert_eq!(to1[0].0 & FLAG_COMPLETE, FLAG_COMPLETE);
    assert_eq!(backs_to(&out, 4), vec![(0, 3)]);
    assert!(backs_to(&out, 3).is_empty());
    // Node 4 goes silent: after the withholding timeout node 3 gets its turn.
    let t = h.now + DEFAULT_WITHHOLD_TIMEOUT + HOUSEKEEPING_INTERVAL * 2;
    while h.now < t {
        h.now = h.t.poll_timeout().unwrap().min(t);
        h.with(|t, ctx| t.handle_timeout(ctx));
        let out = h.drain();
        if !backs_to(&out, 3).is_empty() {
            assert!(h.now >= Instant::ZERO + DEFAULT_WITHHOLD_TIMEOUT);
            return;
        }
    }
    panic!("node 3 never got a BACK");
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

#[test]
fn ack_withholding_serves_one_block_at_a_time_in_order_of_asking() {
    let mut h = Harness::new(2, &[(1, 1), (3, 3), (4, 4)], HopTransport::new(small_cfg()));
    h.recv(1, &bsyn_from(1, 1));
    assert_eq!(backs_to(&h.drain(), 1).len(), 1);
    // A second block from the sender being served waits too (one block at a time, §3.5).
    h.recv(1, &bsyn_from(1, 2));
    h.now += Duration::from_millis(1);
    h.recv(3, &bsyn_from(3, 1));
    h.now += Duration::from_millis(1);
    h.recv(4, &bsyn_from(4, 1));
    // Node 3 asks again: a retry does not send it to the back of the queue.
    h.now += Duration::from_millis(5);
    h.recv(3, &bsyn_from(3, 1));
    assert!(h.drain().is_empty());
    assert_eq!(h.t.stats().extra["acks_withheld"], 4);
    // Node 1's block completes: node 1's other block asked first but node 1 was just
    // served, so node 3 (asked before node 4) is next.
    complete_block_from(&mut h, 1, 1);
    let out = h.drain();
    assert_eq!(backs_to(&out, 3), vec![(0, 3)]);
    assert!(backs_to(&out, 4).is_empty());
    assert_eq!(
        backs_to(&out, 1).len(),
        1,
        "only the completed block's BACK"
    );
    // Then node 1's second block (asked before node 4), then node 4.
    complete_block_from(&mut h, 3, 1);
    let out = h.drain();
    assert_eq!(backs_to(&out, 1), vec![(0, 3)]);
    assert!(backs_to(&out, 4).is_empty());
    complete_block_from(&mut h, 1, 2);
    assert_eq!(backs_to(&h.drain(), 4), vec![(0, 3)]);
}

/// A BSYN of `bsyn_from`'s block announcing `expect` packets held once the round arrives.
fn bsyn_expecting(src: NodeId, flow: u32, expect: u16) -> HopMessage<'static> {
    let mut m = bsyn_from(src, flow);
    if let HopBody::Bsyn { expect: e, .. } = &mut m.body {
        *e = expect;
    }
    m
}

#[test]
fn a_turn_that_sent_its_budget_ends_when_another_sender_waits() {
    // Two blocks' worth of packets per turn (the block has three).
    let cfg = HopConfig {
        withhold_turn_sends: 2,
        ..small_cfg()
    };
    let mut h = Harness::new(2, &[(1, 1), (3, 3)], HopTransport::new(cfg));
    h.recv(1, &bsyn_from(1, 1));
    assert_eq!(backs_to(&h.drain(), 1).len(), 1);
    // Node 1's link loses most frames: of each round of three packets one arrives (packet 0
    // in the first round, then nothing new).
    let mut m = data_packet(0, 250, 0, &[1u8; 100]);
    m.header.src = 1;
    m.header.flow_id = 1;
    m.header.dst = 2;
    h.recv(1, &m);
    // Round 1 ends: three sent. Alone, node 1 keeps the turn past its budget.
    h.recv(1, &bsyn_expecting(1, 1, 3));
    assert_eq!(backs_to(&h.drain(), 1).len(), 1);
    h.recv(1, &bsyn_expecting(1, 1, 3));
    assert_eq!(backs_to(&h.drain(), 1).len(), 1);
    h.recv(3, &bsyn_from(3, 1));
    assert!(h.drain().is_empty());
    // Round 3 (two more sent: 3 + 2 + 2 = 7 > 2 x 3): node 3 waits, so the turn ends and
    // node 3 is served.
    h.recv(1, &bsyn_expecting(1, 1, 3));
    let out = h.drain();
    assert_eq!(backs_to(&out, 3), vec![(0, 3)]);
    assert!(backs_to(&out, 1).is_empty());
    assert_eq!(h.t.stats().extra["turns_ended"], 1);
    let key1 = FlowKey { src: 1, id: 1 };
    assert_eq!(
        h.t.flows[&key1].blocks[&0].have.count(),
        1,
        "the partial block stays"
    );
    // Node 1's rounds are withheld while node 3's block is in progress...
    h.recv(1, &bsyn_expecting(1, 1, 3));
    assert!(backs_to(&h.drain(), 1).is_empty());
    // ...and when it completes, node 1's turn comes back, its packet still held.
    complete_block_from(&mut h, 3, 1);
    assert_eq!(backs_to(&h.drain(), 1), vec![(0, 3)]);
    assert_eq!(h.t.flows[&key1].blocks[&0].have.count(), 1);
}

#[test]
fn by_default_a_turn_lasts_until_the_block_completes() {
    let mut h = Harness::new(2, &[(1, 1), (3, 3)], HopTransport::new(small_cfg()));
    h.recv(1, &bsyn_from(1, 1));
    h.recv(3, &bsyn_from(3, 1));
    assert_eq!(backs_to(&h.drain(), 1).len(), 1);
    // Node 1 sends its three packets round after round and none arrives.
    for _ in 0..20 {
        h.now += Duration::from_millis(300);
        h.recv(1, &bsyn_expecting(1, 1, 3));
        h.recv(3, &bsyn_from(3, 1));
        let out = h.drain();
        assert_eq!(backs_to(&out, 1).len(), 1);
        assert!(backs_to(&out, 3).is_empty());
    }
}

#[test]
fn a_block_released_by_silence_waits_for_its_next_turn() {
    let mut h = Harness::new(2, &[(1, 1), (3, 3)], HopTransport::new(small_cfg()));
    h.recv(1, &bsyn_from(1, 1));
    h.recv(3, &bsyn_from(3, 1));
    let out = h.drain();
    assert_eq!(backs_to(&out, 1).len(), 1);
    assert!(backs_to(&out, 3).is_empty());
    // Node 1 goes silent: node 3 gets the turn.
    let t = h.now + DEFAULT_WITHHOLD_TIMEOUT + HOUSEKEEPING_INTERVAL * 2;
    let mut served = false;
    while h.now < t && !served {
        h.now = h.t.poll_timeout().unwrap().min(t);
        h.with(|t, ctx| t.handle_timeout(ctx));
        served = !backs_to(&h.drain(), 3).is_empty();
    }
    assert!(served, "node 3 never got a BACK");
    // Node 1 comes back to the block it had started: it waits until node 3's block is done.
    h.recv(1, &bsyn_from(1, 1));
    assert!(backs_to(&h.drain(), 1).is_empty());
    complete_block_from(&mut h, 3, 1);
    let out = h.drain();
    assert_eq!(backs_to(&out, 1), vec![(0, 3)]);
}

#[test]
fn virtual_retransmission_ttl_decrements_and_expires() {
    for (ttl, forwarded) in [(5u8, Some(4u8)), (1, None)] {
        let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(small_cfg()));
        let data = [9u8; 250];
        feed_block(&mut h, 0, &data);
        h.drain();
        // Node 3 took the block: node 2 keeps it only as cache.
        h.recv(
            3,
            &HopMessage {
                header: hdr(0, FLAG_COMPLETE),
                body: HopBody::Back {
                    duplicates: 0,
                    block_len: 250,
                    packets: 3,
                    bitmap: &[0x07],
                },
            },
        );
        h.drain();
        let vtx = HopMessage {
            header: HopHeader {
                ttl,
                ..hdr(0, FLAG_VTX)
            },
            body: HopBody::Bsyn {
                offset: 0,
                geom: BlockGeom {
                    block_len: 250,
                    packet_size: 100,
                },
                packet_num: 0,
                expect: 0,
                payload: &[],
            },
        };
        h.recv(1, &vtx);
        let out = h.drain();
        assert_eq!(backs_to(&out, 1), vec![(FLAG_COMPLETE, 3)]);
        let fwd: Vec<u8> = out
            .iter()
            .filter(|o| o.next_hop == 3)
            .filter_map(|o| match HopMessage::parse(&o.body).ok()? {
                HopMessage {
                    header,
                    body: HopBody::Bsyn { .. },
                } if header.flags & FLAG_VTX != 0 => Some(header.ttl),
                _ => None,
            })
            .collect();
        assert_eq!(fwd, forwarded.into_iter().collect::<Vec<_>>(), "ttl {ttl}");
        assert_eq!(h.t.stats().extra["cache_hits"], 1);
    }
}

fn bsyn_with_expect(block: u32, len: u32, expect: u16) -> HopMessage<'static> {
    HopMessage {
        header: hdr(block, 0),
        body: HopBody::Bsyn {
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

#[test]
fn back_waits_only_for_announced_packets() {
    // Blocks 0 and 1 of one sender are in progress together, which ack withholding (one
    // block at a time) would not allow.
    let cfg = HopConfig {
        back_quiet: Duration::from_millis(10),
        ack_withholding: false,
        ..small_cfg()
    };
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(cfg));
    let pkt = [7u8; 100];
    // Nothing in flight: answered at once.
    h.recv(1, &bsyn_with_expect(0, 500, 0));
    assert_eq!(backs_to(&h.drain(), 1).len(), 1);
    // The sender handed packets 0 and 1 to its link; the BSYN overtook them.
    h.recv(1, &bsyn_with_expect(0, 500, 2));
    assert!(backs_to(&h.drain(), 1).is_empty());
    h.recv(1, &data_packet(0, 500, 0, &pkt));
    assert!(backs_to(&h.drain(), 1).is_empty());
    // The second announced packet arrives: the BACK goes at once, without waiting for quiet.
    h.recv(1, &data_packet(0, 500, 1, &pkt));
    let out = h.drain();
    let backs: Vec<Vec<u8>> = out
        .iter()
        .filter(|o| o.next_hop == 1)
        .filter_map(|o| match HopMessage::parse(&o.body).ok()?.body {
            HopBody::Back { bitmap, .. } => Some(bitmap.to_vec()),
            _ => None,
        })
        .collect();
    assert_eq!(backs, vec![vec![0x03u8]]);
    // A lost packet: three announced, two more arrive, then the data pauses for back_quiet.
    h.recv(1, &bsyn_with_expect(0, 500, 5));
    h.recv(1, &data_packet(0, 500, 2, &pkt));
    h.recv(1, &data_packet(0, 500, 4, &pkt));
    assert!(backs_to(&h.drain(), 1).is_empty());
    h.now += Duration::from_millis(11);
    h.with(|t, ctx| t.handle_timeout(ctx));
    assert_eq!(backs_to(&h.drain(), 1), vec![(0, 5)]);
    // Data of this round that paused long before the BSYN arrived is lost: answered at once.
    h.recv(1, &bsyn_with_expect(1, 500, 0));
    assert_eq!(backs_to(&h.drain(), 1).len(), 1);
    h.now += Duration::from_millis(1);
    h.recv(1, &data_packet(1, 500, 0, &pkt));
    h.recv(1, &data_packet(1, 500, 1, &pkt));
    h.now += Duration::from_millis(20);
    h.recv(1, &bsyn_with_expect(1, 500, 3));
    assert_eq!(backs_to(&h.drain(), 1), vec![(0, 5)]);
}

#[test]
fn final_bsyn_announces_the_packets_sent() {
    // Node 1 is the source; node 2 its next hop.
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(small_cfg()));
    let key = FlowKey { src: 1, id: 4 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; 1000])))
        .unwrap();
    let expects = |out: &[Outgoing]| -> Vec<u16> {
        out.iter()
            .filter_map(|o| match HopMessage::parse(&o.body).ok()?.body {
                HopBody::Bsyn { expect, .. } => Some(expect),
                _ => None,
            })
            .collect()
    };
    assert_eq!(expects(&h.drain()), vec![0]);
    let back = |bitmap: &'static [u8]| HopMessage {
        header: HopHeader {
            src: 1,
            flow_id: 4,
            ..hdr(0, 0)
        },
        body: HopBody::Back {
            duplicates: 0,
            block_len: 1000,
            packets: 10,
            bitmap,
        },
    };
    // Nothing held downstream: all ten packets go, then a BSYN announcing ten.
    h.recv(2, &back(&[0, 0]));
    let out = h.drain();
    assert_eq!(out.iter().filter(|o| o.class == Class::Data).count(), 10);
    assert_eq!(expects(&out), vec![10]);
    // Eight held, the last two missing: they were handed to the link after the newest
    // packet that arrived, so they are probably still queued here. Nothing is sent again and
    // the BSYN still announces ten.
    h.recv(2, &back(&[0xff, 0]));
    let out = h.drain();
    assert_eq!(out.iter().filter(|o| o.class == Class::Data).count(), 0);
    assert_eq!(expects(&out), vec![10]);
    // The next BACK shows nothing new long after: the two are lost and go again.
    h.now += Duration::from_secs(1);
    h.recv(2, &back(&[0xff, 0]));
    let out = h.drain();
    assert_eq!(out.iter().filter(|o| o.class == Class::Data).count(), 2);
    assert_eq!(expects(&out), vec![10]);
}

/// A source (node 1, next hop 2) with one 1000-byte block of ten packets, after the first
/// BACK; returns the harness and the datagrams of the first round.
fn source_round(cfg: HopConfig) -> (Harness, Vec<Outgoing>) {
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
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
            duplicates: 0,
            block_len: 1000,
            packets: 10,
            bitmap,
        },
    }
}

/// What `pick` takes from each message in `out` that it matches.
fn bodies<T>(out: &[Outgoing], pick: impl Fn(HopBody<'_>) -> Option<T>) -> Vec<T> {
    out.iter()
        .filter_map(|o| pick(HopMessage::parse(&o.body).ok()?.body))
        .collect()
}

fn data_nums(out: &[Outgoing]) -> Vec<u16> {
    bodies(out, |b| match b {
        HopBody::Data { packet_num, .. } => Some(packet_num),
        _ => None,
    })
}

#[test]
fn packets_sent_before_one_that_arrived_are_lost_at_once() {
    let (mut h, out) = source_round(small_cfg());
    assert_eq!(data_nums(&out).len(), 10);
    // Packets 0 and 4 missing, 9 held: the link's data queue is FIFO, so both are lost.
    h.recv(2, &source_back(&[0xee, 0x03]));
    assert_eq!(data_nums(&h.drain()), vec![0, 4]);
    assert_eq!(h.t.stats().data_retransmissions, 2);
}

#[test]
fn a_copy_of_a_packet_known_lost_is_evidence_when_it_arrives() {
    let (mut h, _) = source_round(small_cfg());
    // 0 and 4 lost (9 arrived after them) and sent again, 0 first: their earlier copies
    // have left the FIFO queue, so these copies are the only ones in flight.
    h.recv(2, &source_back(&[0xee, 0x03]));
    assert_eq!(data_nums(&h.drain()), vec![0, 4]);
    // 4's new copy arrived and 0's, handed to the link before it, did not: 0 is lost again.
    h.recv(2, &source_back(&[0xfe, 0x03]));
    assert_eq!(data_nums(&h.drain()), vec![0]);
    assert_eq!(h.t.stats().data_retransmissions, 3);
}

#[test]
fn paper_mode_resends_everything_a_back_reports_missing() {
    let cfg = HopConfig {
        queue_aware: false,
        link_window_packets: 0,
        ..small_cfg()
    };
    let (mut h, out) = source_round(cfg);
    assert_eq!(data_nums(&out).len(), 10);
    h.recv(2, &source_back(&[0xff, 0]));
    assert_eq!(data_nums(&h.drain()), vec![8, 9]);
}

#[test]
fn link_window_bounds_packets_not_known_to_have_left() {
    let cfg = HopConfig {
        link_window_packets: 4,
        ..small_cfg()
    };
    let (mut h, out) = source_round(cfg);
    // Four packets fill the window; the BSYN announces them and its BACK opens the window.
    assert_eq!(data_nums(&out), vec![0, 1, 2, 3]);
    assert_eq!(bsyn_blocks(&out), vec![0]);
    assert!(h.drain().is_empty());
    h.recv(2, &source_back(&[0x0f, 0]));
    let out = h.drain();
    assert_eq!(data_nums(&out), vec![4, 5, 6, 7]);
    assert_eq!(bsyn_blocks(&out), vec![0]);
    // Two of them arrived (6 and 7 did not yet): two more packets may go.
    h.recv(2, &source_back(&[0x3f, 0]));
    assert_eq!(data_nums(&h.drain()), vec![8, 9]);
}

/// The link window seen after each BACK while a source moves one 600-packet block over a
/// link that carries `capacity` packets per second: each BSYN is answered `base` plus the
/// time the link takes for the packets sent before it, and the BACK reports them all held.
fn windows_over_rounds(base: Duration, capacity: f64) -> Vec<usize> {
    let cfg = HopConfig {
        link_window_packets: 4,
        link_window_max_packets: 64,
        link_queue_target: Duration::from_millis(50),
        ..small_cfg()
    };
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    let key = FlowKey { src: 1, id: 4 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; 60_000])))
        .unwrap();
    let mut held = vec![0u8; 75];
    let mut windows = Vec::new();
    for _ in 0..2_000 {
        let sent = data_nums(&h.drain());
        for p in &sent {
            held[usize::from(p / 8)] |= 1 << (p % 8);
        }
        if held.iter().all(|b| *b == 0xff) {
            break;
        }
        h.now = h.now + base + Duration::from_secs_f64(sent.len() as f64 / capacity);
        h.recv(
            2,
            &HopMessage {
                header: HopHeader {
                    src: 1,
                    flow_id: 4,
                    ..hdr(0, 0)
                },
                body: HopBody::Back {
                    duplicates: 0,
                    block_len: 60_000,
                    packets: 600,
                    bitmap: &held,
                },
            },
        );
        windows.push(h.t.link_window());
    }
    assert!(held.iter().all(|b| *b == 0xff), "the block was not moved");
    windows
}

#[test]
fn link_window_grows_to_the_queue_target_on_a_fast_link_only() {
    let ms = Duration::from_millis;
    // 100 000 packets/s, 1 ms per round: 4 packets per round to start with; the window grows
    // to its ceiling (5 000 packets in 50 ms).
    let fast = windows_over_rounds(ms(1), 100_000.0);
    assert_eq!(fast.iter().max(), Some(&64));
    assert!(fast.iter().all(|w| (4..=64).contains(w)));
    // 400 packets/s: the window settles near the 20 packets the link carries in 50 ms.
    let medium = windows_over_rounds(ms(1), 400.0);
    let settled = &medium[medium.len() / 2..];
    assert!(settled.iter().all(|w| (17..=21).contains(w)), "{medium:?}");
    // 60 packets/s (3 in 50 ms): the window stays at its floor.
    let slow = windows_over_rounds(ms(1), 60.0);
    assert!(slow.iter().all(|w| *w == 4), "{slow:?}");
    // A fixed window when the ceiling is not above the floor.
    let (h, _) = source_round(HopConfig {
        link_window_packets: 4,
        link_window_max_packets: 4,
        ..small_cfg()
    });
    assert_eq!(h.t.link_window(), 4);
}

#[test]
fn bsyn_floor_falls_only_on_links_that_drain_fast() {
    let cfg = HopConfig::default();
    let ms = Duration::from_millis;
    // No delivery measured yet: the configured floor.
    assert_eq!(bsyn_floor(&cfg, None), ms(50));
    // 802.11b: a 32-packet window takes ~60-70 ms to drain; the floor stays.
    assert_eq!(bsyn_floor(&cfg, Some(ms(65))), ms(50));
    // 10 ms of queue: twice that plus the BACK deferral.
    assert_eq!(bsyn_floor(&cfg, Some(ms(10))), ms(30));
    // A wire delivering in a millisecond: the lowest floor, two BACK deferrals.
    assert_eq!(bsyn_floor(&cfg, Some(ms(1))), ms(20));
    // Repeats wait multiples of the floor in use.
    let e = RttEstimate::update(None, ms(2));
    assert_eq!(bsyn_wait(&cfg, Some(&e), Some(ms(1)), 0, false), ms(20));
    assert_eq!(bsyn_wait(&cfg, Some(&e), Some(ms(1)), 2, false), ms(40));
    assert_eq!(bsyn_wait(&cfg, Some(&e), None, 2, false), ms(100));
}

#[test]
fn a_micro_block_without_samples_waits_the_floor_not_the_bsyn_timeout() {
    let cfg = HopConfig::default();
    let ms = Duration::from_millis;
    // A block's first BSYN to a next hop without samples: its data may still drain.
    assert_eq!(bsyn_wait(&cfg, None, None, 0, false), cfg.bsyn_timeout);
    // A micro-block's packets are on its BSYNs: the BACK comes after one control round.
    assert_eq!(bsyn_wait(&cfg, None, None, 0, true), ms(50));
    assert_eq!(bsyn_wait(&cfg, None, Some(ms(1)), 0, true), ms(20));
    // Samples, where there are any, rule both.
    let e = RttEstimate::update(None, ms(30));
    assert_eq!(
        bsyn_wait(&cfg, Some(&e), None, 0, true),
        bsyn_wait(&cfg, Some(&e), None, 0, false)
    );
    // Without the adaptive timer both back off from bsyn_timeout as before.
    let fixed = HopConfig {
        adaptive_bsyn_timeout: false,
        ..HopConfig::default()
    };
    assert_eq!(bsyn_wait(&fixed, None, None, 0, true), fixed.bsyn_timeout);
}

#[test]
fn early_bsyn_asks_at_half_a_window_and_keeps_sending() {
    let cfg = HopConfig {
        link_window_packets: 4,
        early_bsyn: true,
        ..small_cfg()
    };
    let (mut h, out) = source_round(cfg);
    // The BSYN goes after two packets (announcing them); the other two follow it.
    assert_eq!(data_nums(&out), vec![0, 1, 2, 3]);
    assert_eq!(bsyn_expects(&out), vec![2]);
    // Its BACK: 0 and 1 arrived. Two packets went since that BSYN, so the next one asks at
    // once (for all four), and the two freed places of the window are used while it travels.
    h.recv(2, &source_back(&[0x03, 0]));
    let out = h.drain();
    assert_eq!(bsyn_expects(&out), vec![4]);
    assert_eq!(data_nums(&out), vec![4, 5]);
    // Without early BSYNs the first BSYN waits for the full window.
    let (_, out) = source_round(HopConfig {
        link_window_packets: 4,
        ..small_cfg()
    });
    assert_eq!(bsyn_expects(&out), vec![4]);
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
    fn deliver(&mut self, d: &Delivery<'_>) -> Result<(), StoreFull> {
        let mut l = self.0.lock().unwrap();
        if l.0 {
            return Err(StoreFull);
        }
        l.1.push((d.block_num, d.offset, d.data.len()));
        Ok(())
    }
}

fn e2e_cums(out: &[Outgoing]) -> Vec<u32> {
    out.iter()
        .filter_map(|o| match HopMessage::parse(&o.body).ok()? {
            HopMessage {
                body: HopBody::E2eBack { cum_blocks },
                ..
            } => Some(cum_blocks),
            _ => None,
        })
        .collect()
}

fn delivered(t: &mut HopTransport) -> Vec<(u64, usize)> {
    let mut v = Vec::new();
    while let Some(e) = t.poll_event() {
        if let Event::Delivered { offset, data, .. } = e {
            v.push((offset, data.len()));
        }
    }
    v
}

#[test]
fn refused_delivery_withholds_the_end_to_end_back_until_the_store_has_room() {
    let log = Arc::new(Mutex::new((true, Vec::new())));
    let t = HopTransport::with_store(small_cfg(), Box::new(Deliveries(log.clone())));
    // Node 3 is the destination of FLOW.
    let mut h = Harness::new(3, &[(1, 1)], t);
    feed_block(&mut h, 0, &[9u8; 250]);
    let out = h.drain();
    assert!(
        e2e_cums(&out).is_empty(),
        "end-to-end BACK before the bytes were stored"
    );
    assert!(delivered(&mut h.t).is_empty());
    assert_eq!(h.t.stats().extra["delivery_withheld"], 1);
    // Room again: the next timer delivers and acknowledges.
    log.lock().unwrap().0 = false;
    h.now = h.t.poll_timeout().expect("a retry is scheduled");
    h.with(|t, ctx| t.handle_timeout(ctx));
    let out = h.drain();
    assert_eq!(e2e_cums(&out), vec![1]);
    assert_eq!(delivered(&mut h.t), vec![(0, 250)]);
    assert_eq!(log.lock().unwrap().1, vec![(0, 0, 250)]);
}

#[test]
fn restored_destination_resumes_from_its_progress() {
    let log = Arc::new(Mutex::new((false, Vec::new())));
    let mut t = HopTransport::with_store(small_cfg(), Box::new(Deliveries(log.clone())));
    t.restore_destination(
        Instant::ZERO,
        3,
        vec![DestProgress {
            flow: FLOW,
            next_block: 2,
            bytes: 500,
            finished: false,
        }],
    );
    let mut h = Harness::new(3, &[(1, 1)], t);
    // A retransmitted block below the progress is acknowledged again, not delivered again.
    feed_block(&mut h, 1, &[1u8; 250]);
    let out = h.drain();
    assert!(
        e2e_cums(&out).iter().all(|&c| c == 2),
        "{:?}",
        e2e_cums(&out)
    );
    assert!(!e2e_cums(&out).is_empty());
    assert!(delivered(&mut h.t).is_empty());
    // The next block continues the stream at the restored byte offset.
    feed_block(&mut h, 2, &[2u8; 250]);
    let out = h.drain();
    assert_eq!(e2e_cums(&out), vec![3]);
    assert_eq!(delivered(&mut h.t), vec![(500, 250)]);
    assert_eq!(log.lock().unwrap().1, vec![(2, 500, 250)]);
}

fn bsyn_expects(out: &[Outgoing]) -> Vec<u16> {
    bodies(out, |b| match b {
        HopBody::Bsyn { expect, .. } => Some(expect),
        _ => None,
    })
}

#[test]
fn unanswered_bsyn_is_repeated_alone_and_judges_no_packet_lost() {
    let (mut h, out) = source_round(small_cfg());
    assert_eq!(data_nums(&out).len(), 10);
    // The BSYN of this round (or its BACK) is lost: when its timer fires only the BSYN is
    // sent again, announcing just what the next hop reported, so it is answered at once.
    let mut repeated = Vec::new();
    for _ in 0..20 {
        let Some(t) = h.t.poll_timeout() else { break };
        h.now = t;
        h.with(|t, ctx| t.handle_timeout(ctx));
        repeated = h.drain();
        if !bsyn_expects(&repeated).is_empty() {
            break;
        }
    }
    assert!(data_nums(&repeated).is_empty());
    assert_eq!(bsyn_expects(&repeated), vec![0]);
    assert!(!h.t.stats().extra.contains_key("lost_unanswered"));
    // Its BACK: all but the newest packet arrived, so that one is still in flight (FIFO
    // queue) and nothing is sent again.
    h.recv(2, &source_back(&[0xff, 0x01]));
    assert!(data_nums(&h.drain()).is_empty());
    assert_eq!(h.t.stats().data_retransmissions, 0);
}

#[test]
fn destination_reports_unique_bytes_received_including_partial_blocks() {
    let mut h = Harness::new(3, &[(1, 1)], HopTransport::new(small_cfg()));
    assert!(h.t.received().is_empty());
    let data: Vec<u8> = (0..250u32).map(|i| i as u8).collect();
    feed_block(&mut h, 0, &data);
    assert_eq!(h.t.received(), vec![(FLOW, 250)]);
    // Block 1 (250 bytes: packets of 100, 100 and 50): the first and the short last packet
    // arrive, the last one twice. Nothing more is delivered, but 150 more bytes are held.
    h.recv(1, &bsyn_with_expect(1, 250, 0));
    h.recv(1, &data_packet(1, 250, 0, &data[..100]));
    h.recv(1, &data_packet(1, 250, 2, &data[200..]));
    h.recv(1, &data_packet(1, 250, 2, &data[200..]));
    h.drain();
    assert_eq!(delivered(&mut h.t), vec![(0, 250)]);
    assert_eq!(h.t.received(), vec![(FLOW, 400)]);
    // The missing packet completes the block: delivered and received agree again.
    h.recv(1, &data_packet(1, 250, 1, &data[100..200]));
    assert_eq!(h.t.received(), vec![(FLOW, 500)]);
    assert_eq!(delivered(&mut h.t), vec![(250, 250)]);
}

#[test]
fn a_withheld_bsyn_is_told_to_wait_and_answered_in_its_turn() {
    for notice in [true, false] {
        let cfg = HopConfig {
            wait_notice: notice,
            ..small_cfg()
        };
        let mut h = Harness::new(2, &[(1, 1), (3, 3)], HopTransport::new(cfg));
        h.recv(1, &bsyn_from(1, 1));
        h.recv(3, &bsyn_from(3, 1));
        let out = h.drain();
        assert_eq!(backs_to(&out, 1).len(), 1);
        assert!(backs_to(&out, 3).is_empty());
        assert_eq!(waits_to(&out, 3), usize::from(notice));
        assert_eq!(waits_to(&out, 1), 0);
        // Node 3 asks again while node 1's block is in progress: told again.
        h.recv(3, &bsyn_from(3, 1));
        assert_eq!(waits_to(&h.drain(), 3), usize::from(notice));
        // Node 1's block completes: node 3 gets its BACK unasked.
        complete_block_from(&mut h, 1, 1);
        let out = h.drain();
        assert_eq!(backs_to(&out, 3), vec![(0, 3)]);
        assert_eq!(waits_to(&out, 3), 0);
    }
}

/// Steps a harness through its timers until it sends a BSYN or `until` passes; the time of
/// that BSYN.
fn next_bsyn_at(h: &mut Harness, until: Instant) -> Option<Instant> {
    while let Some(t) = h.t.poll_timeout() {
        if t > until {
            return None;
        }
        h.now = t;
        h.with(|t, ctx| t.handle_timeout(ctx));
        if !bsyn_expects(&h.drain()).is_empty() {
            return Some(h.now);
        }
    }
    None
}

#[test]
fn a_sender_told_to_wait_asks_again_only_after_the_hold() {
    let (mut h, out) = source_round(small_cfg());
    assert_eq!(bsyn_expects(&out).len(), 1, "the round ends with a BSYN");
    let asked = h.now;
    let mut wait = source_back(&[]);
    wait.header.flags = FLAG_WAIT;
    if let HopBody::Back { packets, .. } = &mut wait.body {
        *packets = 0;
    }
    h.recv(2, &wait);
    assert!(h.drain().is_empty());
    assert_eq!(h.t.stats().extra["waits_heard"], 1);
    let hold = DEFAULT_WAIT_HOLD;
    let again = next_bsyn_at(&mut h, asked + hold * 2).expect("asks again after the hold");
    assert!(
        again >= asked + hold,
        "asked again after {:?}",
        again - asked
    );
    // Without a notice the same BSYN is repeated within the BSYN timer.
    let (mut h, _) = source_round(small_cfg());
    let asked = h.now;
    let again = next_bsyn_at(&mut h, asked + hold).expect("repeats on its timer");
    assert!(again < asked + DEFAULT_BSYN_TIMEOUT * 2);
}

/// A source (node 1) with two 1000-byte blocks of ten packets, flow 4 to node 3 via node 2 and
/// flow 5 to node 5 via node 4, a link window of eight packets and a txop of two.
fn two_flow_source(past_full: bool) -> Harness {
    two_flow_source_with(HopConfig {
        txop_past_full_window: past_full,
        ..small_cfg()
    })
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

#[test]
fn a_full_window_takes_a_txop_from_a_transfer_with_nothing_in_it_only_when_asked() {
    for past_full in [false, true] {
        let mut h = two_flow_source(past_full);
        // Flow 4's next hop answers: its packets fill the window.
        h.recv(2, &source_back(&[0, 0]));
        let out = h.drain();
        assert_eq!(data_nums(&out).len(), 8);
        assert_eq!(h.t.link_window(), 8);
        // Flow 5's next hop answers while the window is full of flow 4's packets.
        let mut back = source_back(&[0, 0]);
        back.header.flow_id = 5;
        back.header.dst = 5;
        h.recv(4, &back);
        let to4 = h
            .drain()
            .iter()
            .filter(|o| o.next_hop == 4)
            .filter(|o| {
                matches!(
                    HopMessage::parse(&o.body).unwrap().body,
                    HopBody::Data { .. }
                )
            })
            .count();
        assert_eq!(
            to4,
            if past_full { 2 } else { 0 },
            "past_full = {past_full}"
        );
    }
}

/// Packets handed to the link before one that arrived have left this node's FIFO queue,
/// whichever transfer they belong to: they no longer fill the link window, even while
/// their own next hop has not answered.
#[test]
fn packets_known_to_have_left_the_queue_free_the_window_for_every_transfer() {
    for queue_aware in [true, false] {
        let mut h = two_flow_source_with(HopConfig {
            queue_aware,
            ..small_cfg()
        });
        // Both next hops answer at once: the two transfers share the window a txop at a
        // time, four packets each.
        let mut back5 = source_back(&[0, 0]);
        back5.header.flow_id = 5;
        back5.header.dst = 5;
        h.recv(2, &source_back(&[0, 0]));
        h.recv(4, &back5);
        let out = h.drain();
        let to = |out: &[Outgoing], hop| {
            out.iter()
                .filter(|o| o.next_hop == hop)
                .filter(|o| {
                    matches!(
                        HopMessage::parse(&o.body).unwrap().body,
                        HopBody::Data { .. }
                    )
                })
                .count()
        };
        assert_eq!((to(&out, 2), to(&out, 4)), (4, 4));
        // Node 4 reports all four of flow 5's packets, the last one handed to the link:
        // flow 4's were handed over before it and have left the queue too.
        let mut back5 = source_back(&[0x0f, 0]);
        back5.header.flow_id = 5;
        back5.header.dst = 5;
        h.recv(4, &back5);
        let out = h.drain();
        // The rest of flow 5's block (6 packets) fits; counting flow 4's packets as still
        // queued would leave room for 4.
        assert_eq!(
            to(&out, 4),
            if queue_aware { 6 } else { 4 },
            "queue_aware = {queue_aware}"
        );
    }
}

/// The two-flow source with `hold_tail_losses` set, a second into its life (the tail rule
/// measures stalls from the first BACK, which must not come at time zero).
fn tail_source(hold: bool) -> Harness {
    let mut h = two_flow_source_with(HopConfig {
        hold_tail_losses: hold,
        ..small_cfg()
    });
    h.now += Duration::from_secs(1);
    h
}

/// A relay whose queue drains more slowly than the delivery delay it measured: the tail rule
/// gives up packets that are still queued. With `hold_tail_losses` they keep their place in
/// the link window, so their new copies do not pile up behind them; they leave it once the
/// queue's lifetime has passed. Without, the window forgets them and a second window's worth
/// goes into the same queue at once.
#[test]
fn packets_given_up_by_the_tail_rule_keep_their_place_in_the_window() {
    for hold in [true, false] {
        let mut h = tail_source(hold);
        h.recv(2, &source_back(&[0, 0]));
        assert_eq!(data_nums(&h.drain()).len(), 8, "hold = {hold}");
        // 300 ms later the next hop still has none of them: older than the tail rule's age
        // (the BSYN timeout while no delivery delay is measured), all eight are given up.
        h.now += Duration::from_millis(300);
        h.recv(2, &source_back(&[0, 0]));
        let again = data_nums(&h.drain());
        assert_eq!(again.len(), if hold { 0 } else { 8 }, "hold = {hold}");
        assert_eq!(h.t.link_window(), 8);
        if hold {
            // They leave the window when they outlive the queue's lifetime (500 ms after
            // they were handed to the link, 200 ms from now); the node wakes up then.
            let t = h.t.poll_timeout().unwrap();
            assert!(t <= h.now + Duration::from_millis(200), "{t:?}");
            h.now += Duration::from_millis(200);
            h.with(|t, ctx| t.handle_timeout(ctx));
            let mut resent = data_nums(&h.drain());
            // (and at the latest with the next BACK, still showing nothing)
            h.recv(2, &source_back(&[0, 0]));
            resent.extend(data_nums(&h.drain()));
            assert_eq!(resent.len(), 8, "{resent:?}");
        }
    }
}

/// A tail loss of one transfer says nothing about the packets other transfers handed to the
/// link before it: they may be queued ahead of it. Without `hold_tail_losses`, the other
/// transfer's next BACK judges them lost although it shows progress.
#[test]
fn a_tail_loss_does_not_condemn_other_transfers_packets() {
    for hold in [true, false] {
        let mut h = tail_source(hold);
        let back5 = |bitmap: &'static [u8]| {
            let mut b = source_back(bitmap);
            b.header.flow_id = 5;
            b.header.dst = 5;
            b
        };
        // Both next hops answer: four packets of each flow go, interleaved a txop at a time.
        h.recv(4, &back5(&[0, 0]));
        h.recv(2, &source_back(&[0, 0]));
        assert_eq!(data_nums(&h.drain()).len(), 8);
        // A second later flow 4's next hop has none of its four: the tail rule gives them up.
        h.now += Duration::from_secs(1);
        h.recv(2, &source_back(&[0, 0]));
        h.drain();
        let before = h.t.stats().data_retransmissions;
        // Flow 5's next hop reports its first packet: progress, so its other three are
        // probably queued, unless flow 4's tail loss is taken to mean the queue is empty.
        h.recv(4, &back5(&[0x01, 0]));
        h.drain();
        assert_eq!(
            h.t.stats().data_retransmissions - before,
            if hold { 0 } else { 3 },
            "hold = {hold}"
        );
    }
}

/// A resent packet's arrival does not tell which copy arrived, but any copy was handed to the
/// link no earlier than the oldest one not known lost: the packets handed over before that
/// have left the queue. Held tail losses among them leave the window at once, not when they
/// outlive the queue's lifetime. (On a lossy link most arrivals are of resent packets; in
/// the lab this did not remove the option's cost there, docs/wire-format.md.)
#[test]
fn a_resent_packets_arrival_frees_the_tail_losses_handed_over_before_its_first_copy() {
    let mut h = two_flow_source_window(
        HopConfig {
            hold_tail_losses: true,
            ..small_cfg()
        },
        16,
    );
    // Flow 4's next hop answers `ms` later with `bitmap`: the data packets that go out.
    let mut back_after = |ms: u64, bitmap: &[u8]| {
        h.now += Duration::from_millis(ms);
        h.recv(2, &source_back(bitmap));
        data_nums(&h.drain()).len()
    };
    // Flow 4's whole block (ten packets) goes; its next hop reports the first two.
    assert_eq!(back_after(1000, &[0, 0]), 10);
    assert_eq!(back_after(50, &[0x03, 0]), 0);
    // 300 ms on, nothing more: the other eight are given up by the tail rule and held (they
    // may still be queued); new copies of them go into the room left in the window.
    assert_eq!(back_after(300, &[0x03, 0]), 8);
    // Packet 9 arrives: one of its two copies, and the older was handed over after packets
    // 2-8's first copies, so those have left the queue. What stays in flight is the seven
    // new copies; flow 5's next hop answers and gets the rest of the window, 9 packets (the
    // held copies kept it to 2).
    assert_eq!(back_after(50, &[0x03, 0x02]), 0);
    let mut back5 = source_back(&[0, 0]);
    back5.header.flow_id = 5;
    back5.header.dst = 5;
    h.recv(4, &back5);
    assert_eq!(data_nums(&h.drain()).len(), 9);
}

/// The duplicates each BACK in `out` reports.
fn back_duplicates(out: &[Outgoing]) -> Vec<u16> {
    bodies(out, |b| match b {
        HopBody::Back { duplicates, .. } => Some(duplicates),
        _ => None,
    })
}

/// A receiver counts the DATA packets of a block it gets again from upstream and reports
/// them in its next BACK, once. A packet it held only from an overheard frame is no
/// duplicate the first time its sender sends it.
#[test]
fn a_back_reports_the_data_received_twice_since_the_previous_back() {
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(small_cfg()));
    let data = [7u8; 100];
    let bsyn = |expect| bsyn_with_expect(0, 250, expect);
    let pkt = |p: u16| data_packet(0, 250, p, &data);
    // Packet 1 overheard from node 0 on its way to node 1.
    h.overhear(0, 1, &pkt(1));
    h.recv(1, &bsyn(0));
    assert_eq!(back_duplicates(&h.drain()), vec![0]);
    for p in [0, 1, 0, 1, 1] {
        h.recv(1, &pkt(p));
    }
    h.drain();
    h.recv(1, &bsyn(2));
    assert_eq!(back_duplicates(&h.drain()), vec![3]);
    h.recv(1, &bsyn(2));
    assert_eq!(back_duplicates(&h.drain()), vec![0]);
}

/// Duplicates reported by the next hop show that the tail rule gave up packets that were
/// only queued: the loss age grows by one delivery delay, so the wait that gave packets up
/// before no longer does, and a longer one still does. Without `duplicate_feedback` the age
/// stays at twice the delivery delay.
#[test]
fn duplicates_reported_by_the_next_hop_lengthen_the_tail_rules_loss_age() {
    for feedback in [true, false] {
        let (mut h, out) = source_round(HopConfig {
            duplicate_feedback: feedback,
            ..small_cfg()
        });
        assert_eq!(data_nums(&out).len(), 10);
        let resent = |h: &Harness| h.t.stats().data_retransmissions;
        // 50 ms on, the next hop holds packets 0 and 1 (a delivery delay of 50 ms: the loss
        // age is 100 ms) and reports two copies it got twice.
        h.now += Duration::from_millis(50);
        let mut back = source_back(&[0x03, 0]);
        if let HopBody::Back { duplicates, .. } = &mut back.body {
            *duplicates = 2;
        }
        h.recv(2, &back);
        h.drain();
        assert_eq!(resent(&h), 0);
        // 120 ms later nothing more has arrived: the eight others are 170 ms old and the
        // transfer has stalled for 120 ms, past a loss age of 100 ms but not of 150 ms.
        h.now += Duration::from_millis(120);
        h.recv(2, &source_back(&[0x03, 0]));
        h.drain();
        let after = resent(&h);
        assert_eq!(after, if feedback { 0 } else { 8 }, "feedback = {feedback}");
        if feedback {
            // 40 ms more: past the longer age too. The transfer asks again when its oldest
            // packet is due (its timer), and the answer still shows nothing new.
            h.now += Duration::from_millis(40);
            h.with(|t, ctx| t.handle_timeout(ctx));
            h.drain();
            h.recv(2, &source_back(&[0x03, 0]));
            h.drain();
            assert_eq!(resent(&h), 8);
        }
    }
}

#[test]
fn poll_control_yields_the_queued_acks_and_never_data() {
    // A source with a block to send: nothing is queued yet, so poll_control has nothing;
    // poll_transmit forms the block and opens the round with its BSYN.
    let mut src = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(small_cfg()));
    let key = FlowKey { src: 1, id: 9 };
    src.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    src.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![7u8; 250])))
        .unwrap();
    assert!(src.with(|t, ctx| t.poll_control(ctx)).is_none());
    assert_eq!(bsyn_blocks(&src.drain()), vec![0]);
    // A relay that received a whole block owes node 1 its BACKs: poll_control yields them,
    // all control.
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(small_cfg()));
    feed_block(&mut h, 0, &[5u8; 250]);
    let mut control = Vec::new();
    while let Some(o) = h.with(|t, ctx| t.poll_control(ctx)) {
        control.push(o);
    }
    assert!(control.iter().all(|o| o.class == Class::Control));
    assert!(!backs_to(&control, 1).is_empty(), "the BACK to node 1");
    assert!(backs_to(&h.drain(), 1).is_empty(), "taken once");
}

#[test]
fn a_waiting_bsyn_for_a_block_cached_under_another_geometry_gets_its_turn() {
    let mut h = Harness::new(2, &[(3, 3), (1, 1), (4, 4)], HopTransport::new(small_cfg()));
    let theirs = HopHeader {
        flags: 0,
        ttl: 0,
        src: 4,
        flow_id: 7,
        dst: 3,
        block_num: 0,
    };
    // Node 1's block holds the turn; node 4 asks for its 250-byte block 0 and waits.
    h.recv(1, &bsyn_msg(hdr(0, 0), 250));
    h.recv(4, &bsyn_msg(theirs, 250));
    let out = h.drain();
    assert_eq!(backs_to(&out, 1).len(), 1);
    assert!(backs_to(&out, 4).is_empty());
    // Then node 2 overhears a packet of a 1000-byte block 0 of the same flow (an older copy,
    // from before node 4 restarted), sent to another node, and caches it.
    h.overhear(
        4,
        5,
        &HopMessage {
            header: theirs,
            body: HopBody::Data {
                offset: 0,
                geom: BlockGeom {
                    block_len: 1000,
                    packet_size: 100,
                },
                packet_num: 0,
                payload: &[1; 100],
            },
        },
    );
    // Node 1's block completes: node 4's turn comes, although the cached copy of its block
    // is larger than the block it now sends.
    feed_block(&mut h, 0, &[9; 250]);
    let out = h.drain();
    assert_eq!(backs_to(&out, 4).len(), 1);
}

#[test]
fn a_last_block_completed_by_data_alone_finishes_the_flow() {
    // Node 3, the destination, gets every packet of the flow's last block, each flagged FIN,
    // but no BSYN for it (withheld, lost, or answered before a restart).
    let mut h = Harness::new(3, &[(1, 1)], HopTransport::new(small_cfg()));
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
    h.drain();
    let mut finished = None;
    while let Some(e) = h.t.poll_event() {
        if let Event::FlowFinished { flow, bytes } = e {
            finished = Some((flow, bytes));
        }
    }
    assert_eq!(finished, Some((FLOW, 250)));
}

#[test]
fn early_bsyns_send_no_data_of_a_block_before_the_next_hop_answers_for_it() {
    let cfg = HopConfig {
        early_bsyn: true,
        max_block_bytes: 250,
        ..small_cfg()
    };
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    h.with(|t, ctx| t.open(ctx, FLOW, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, FLOW, Bytes::from(vec![5u8; 500])))
        .unwrap();
    let data_of = |o: &Outgoing| match HopMessage::parse(&o.body) {
        Ok(HopMessage {
            header,
            body: HopBody::Data { .. },
        }) => Some(header.block_num),
        _ => None,
    };
    let back = |block, flags, bitmap: &'static [u8]| HopMessage {
        header: hdr(block, flags),
        body: HopBody::Back {
            block_len: 250,
            packets: 3,
            duplicates: 0,
            bitmap,
        },
    };
    assert_eq!(bsyn_blocks(&h.drain()), vec![0]);
    h.recv(2, &back(0, 0, &[0]));
    // Block 0's three packets go out; the flow is still in the data rotation when node 2
    // reports the block complete and block 1 is cut.
    let mut sent = Vec::new();
    while sent.len() < 3 {
        let o = h.with(|t, ctx| t.poll_transmit(ctx)).unwrap();
        sent.extend(data_of(&o));
    }
    assert_eq!(sent, vec![0, 0, 0]);
    h.recv(2, &back(0, FLAG_COMPLETE, &[0x07]));
    let out = h.drain();
    // (The BSYN of block 0 that ended its round was already queued.)
    assert!(bsyn_blocks(&out).contains(&1));
    assert!(
        out.iter().all(|o| data_of(o).is_none()),
        "data of block 1 before its BACK"
    );
    // Node 2 serves another sender: it holds the BSYN and says so.
    h.recv(
        2,
        &HopMessage {
            header: hdr(1, FLAG_WAIT),
            body: HopBody::Back {
                block_len: 250,
                packets: 0,
                duplicates: 0,
                bitmap: &[],
            },
        },
    );
    assert!(
        h.drain().iter().all(|o| data_of(o).is_none()),
        "data after a wait notice"
    );
    // Its turn comes: the BACK starts the data.
    h.recv(2, &back(1, 0, &[0]));
    assert_eq!(
        h.drain().iter().filter_map(data_of).collect::<Vec<_>>(),
        vec![1, 1, 1]
    );
}

#[test]
fn an_older_block_passes_backpressure_without_the_vtx_flag() {
    // Node 2 holds block 5 of the flow (H = 1) and cannot move it on: its next hop waits for
    // block 3, which it lost in a crash. Node 1 starts block 3's transfer again as a plain
    // BSYN. Holding it back behind block 5 would deadlock the flow; block 6 still waits.
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(small_cfg()));
    feed_block(&mut h, 5, &[5; 250]);
    h.drain();
    h.recv(1, &bsyn_msg(hdr(6, 0), 250));
    assert!(backs_to(&h.drain(), 1).is_empty(), "block 6 passed H");
    h.recv(1, &bsyn_msg(hdr(3, 0), 250));
    assert_eq!(backs_to(&h.drain(), 1).len(), 1, "block 3 held back");
}

/// A message of one of a few flows this node knows (relayed, its own, its destination's) or
/// does not, with geometry and flags drawn so that most of them meet live state.
fn interleaved_msg(kind: u8, v: &[u32]) -> Vec<u8> {
    // (src, id, dst): relayed to 3, destined here, this node's own flow, one to nowhere.
    let flows = [(1, 9, 3), (4, 7, 2), (2, 1, 5), (1, 9, 2), (6, 3, 8)];
    let (src, flow_id, dst) = flows[v[0] as usize % flows.len()];
    let lens = [0, 1, 99, 100, 250, 1000, 1380, v[1] % 3000];
    let packet_size = if v[2] % 5 == 0 { 50 } else { 100 };
    let geom = BlockGeom {
        block_len: lens[v[1] as usize % lens.len()],
        packet_size,
    };
    let header = HopHeader {
        // Mostly none or one flag, sometimes any combination.
        flags: [
            0,
            0,
            0,
            0,
            FLAG_VTX,
            FLAG_FIN,
            FLAG_MICRO,
            FLAG_ABORT,
            FLAG_COMPLETE,
            FLAG_ASK,
            FLAG_WAIT,
            (v[3] >> 8) as u8 & 0x7f,
        ][v[3] as usize % 12],
        ttl: (v[4] % 4) as u8,
        src,
        flow_id,
        dst,
        block_num: v[5] % 4,
    };
    // Mostly a packet of the block, sometimes one past its end.
    let pn = (v[6] % (geom.packets() + 1).max(1)) as u16;
    let payload = vec![0xa5u8; geom.packet_range(u32::from(pn)).map_or(0, |r| r.len())];
    let bitmap: Vec<u8> = (0..(v[6] % 4)).map(|i| (v[2] >> (i * 8)) as u8).collect();
    let offset = u64::from(header.block_num) * 1000;
    let body = match kind % 10 {
        0..=2 => HopBody::Data {
            offset,
            geom,
            packet_num: pn,
            payload: &payload,
        },
        3 | 4 => HopBody::Bsyn {
            offset,
            geom,
            packet_num: pn,
            expect: (v[4] % 12) as u16,
            payload: if header.flags & FLAG_MICRO != 0 {
                &payload
            } else {
                &[]
            },
        },
        5 | 6 => HopBody::Back {
            block_len: geom.block_len,
            packets: geom.packets().min(u32::from(u16::MAX)) as u16,
            duplicates: (v[4] % 3) as u16,
            bitmap: &bitmap,
        },
        7 => HopBody::E2eBack {
            cum_blocks: v[5] % 5,
        },
        8 if v[4] % 4 == 0 => HopBody::Fin {
            total_bytes: u64::from(v[1] % 5000),
        },
        _ => HopBody::Bsyn {
            offset,
            geom,
            packet_num: 0,
            expect: 0,
            payload: &[],
        },
    };
    let mut out = Vec::new();
    if (HopMessage { header, body }).emit(&mut out).is_err() {
        out.clear();
    }
    if v[6] % 17 == 0 && !out.is_empty() {
        // A damaged copy: one byte changed.
        let i = v[1] as usize % out.len();
        out[i] ^= 1 + (v[2] as u8 & 0x7f);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]
    /// Any interleaving of messages (valid, damaged, overheard, from strangers), timeouts,
    /// polls and application calls, with the mechanisms switched on and off: no panic, a
    /// handled deadline is never reported again, and polling ends.
    #[test]
    fn interleavings_never_panic_never_spin(
        ops in proptest::collection::vec(
            (0u8..5, any::<u8>(), proptest::collection::vec(any::<u32>(), 7), 0u64..40),
            1..300,
        ),
        switches in any::<u16>(),
    ) {
        let on = |bit: u16| switches & (1 << bit) != 0;
        let cfg = HopConfig {
            max_block_bytes: if on(0) { 1000 } else { 250 },
            micro_block_threshold: if on(1) { 200 } else { 0 },
            pipelining: on(2),
            ack_withholding: on(3),
            backpressure: on(4),
            wait_notice: on(5),
            queue_aware: on(6),
            hold_tail_losses: on(7),
            duplicate_feedback: on(8),
            adaptive_bsyn_timeout: on(9),
            early_bsyn: on(10),
            round_per_next_hop: on(11),
            txop_past_full_window: on(12),
            cache_limit_bytes: if on(13) { 2500 } else { 1 << 20 },
            link_window_packets: if on(14) { 4 } else { 32 },
            txop_bytes: 300,
            ..small_cfg()
        };
        // Node 2 relays between 1 and 3 (5 lies behind 3, 4 behind 1) and sends a flow of its
        // own to 5.
        let mut h = Harness::new(2, &[(1, 1), (3, 3), (5, 3), (4, 1)], HopTransport::new(cfg));
        let own = FlowKey { src: 2, id: 1 };
        h.with(|t, ctx| t.open(ctx, own, 5)).unwrap();
        for (op, kind, v, dt) in ops {
            h.now += Duration::from_millis(dt);
            match op {
                0 => {
                    let body = interleaved_msg(kind, &v);
                    let from = [1, 3, 4, 6][v[0] as usize % 4];
                    let overheard = v[4] % 5 == 0;
                    let link_dst = if overheard { 9 } else { 2 };
                    let _ = h.with(|t, ctx| {
                        t.handle(ctx, Received { link_src: from, link_dst, overheard, body: &body })
                    });
                }
                1 => {
                    // Half the time, time jumps to the next deadline.
                    if let Some(d) = h.t.poll_timeout().filter(|_| kind % 2 == 0) {
                        h.now = h.now.max(d);
                    }
                    let now = h.now;
                    if h.t.poll_timeout().is_some_and(|d| d <= now) {
                        h.with(|t, ctx| t.handle_timeout(ctx));
                        prop_assert!(h.t.poll_timeout().is_none_or(|d| d > now));
                    }
                }
                2 => {
                    let mut n = 0;
                    while h.with(|t, ctx| {
                        if kind % 3 == 0 { t.poll_control(ctx) } else { t.poll_transmit(ctx) }
                    }).is_some() {
                        n += 1;
                        prop_assert!(n < 100_000, "polling does not end");
                    }
                }
                3 => {
                    let len = v[1] as usize % 3000;
                    let _ = h.with(|t, ctx| t.send(ctx, own, Bytes::from(vec![3u8; len])));
                    match kind % 11 {
                        0 => { let _ = h.with(|t, ctx| t.finish(ctx, own)); }
                        1 => { let _ = h.with(|t, ctx| t.abort(ctx, own)); }
                        _ => {}
                    }
                }
                _ => {
                    let _ = h.t.stats();
                    let _ = h.t.received();
                }
            }
            while h.t.poll_event().is_some() {}
        }
    }
}

#[test]
fn a_micro_block_repeated_without_an_answer_sends_one_packet_then_only_what_is_missing() {
    let cfg = HopConfig {
        micro_block_threshold: 1000,
        ..small_cfg()
    };
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    h.with(|t, ctx| t.open(ctx, FLOW, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, FLOW, Bytes::from(vec![5u8; 250])))
        .unwrap();
    h.with(|t, ctx| t.finish(ctx, FLOW)).unwrap();
    // (flags, packet, payload length) of every micro-block BSYN sent.
    let micros = |out: &[Outgoing]| -> Vec<(u8, u16, usize)> {
        out.iter()
            .filter_map(|o| match HopMessage::parse(&o.body) {
                Ok(HopMessage {
                    header,
                    body:
                        HopBody::Bsyn {
                            packet_num,
                            payload,
                            ..
                        },
                }) if header.flags & FLAG_MICRO != 0 => {
                    Some((header.flags & FLAG_ASK, packet_num, payload.len()))
                }
                _ => None,
            })
            .collect()
    };
    // The first send carries the whole block, the last packet asking for the BACK.
    assert_eq!(
        micros(&h.drain()),
        vec![(0, 0, 100), (0, 1, 100), (FLAG_ASK, 2, 50)]
    );
    // No answer: the repeat carries only the packet that asks.
    h.now = h.t.poll_timeout().unwrap();
    h.with(|t, ctx| t.handle_timeout(ctx));
    assert_eq!(micros(&h.drain()), vec![(FLAG_ASK, 2, 50)]);
    // Node 2 holds packet 0 only: the other two go again, with their data.
    h.recv(
        2,
        &HopMessage {
            header: hdr(0, 0),
            body: HopBody::Back {
                block_len: 250,
                packets: 3,
                duplicates: 0,
                bitmap: &[0x01],
            },
        },
    );
    assert_eq!(micros(&h.drain()), vec![(0, 1, 100), (FLAG_ASK, 2, 50)]);
}

#[test]
fn time_in_state_counters_split_a_senders_time() {
    let ms = |h: &Harness, k: &str| h.t.stats().extra.get(k).copied().unwrap_or(0);
    let cfg = HopConfig {
        link_window_packets: 0,
        ..small_cfg()
    };
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    let key = FlowKey { src: 1, id: 4 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    // an open flow without bytes has nothing to send
    h.now += Duration::from_secs(1);
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; 1000])))
        .unwrap();
    assert_eq!(ms(&h, "time_idle_ms"), 1000);
    // the BSYN goes out; its answer comes 40 ms later
    let out = h.drain();
    assert_eq!(bsyn_blocks(&out), vec![0]);
    h.now += Duration::from_millis(40);
    h.recv(2, &source_back(&[0, 0]));
    assert_eq!(ms(&h, "time_round_ms"), 40);
    // the packets wait 5 ms for the link
    h.now += Duration::from_millis(5);
    let out = h.drain();
    assert_eq!(out.iter().filter(|o| o.class == Class::Data).count(), 10);
    assert_eq!(ms(&h, "time_ready_ms"), 5);
    // no answer to the round's BSYN: the first wait is a round, the repeats' are silence
    let start = h.now;
    for _ in 0..3 {
        h.now = h.t.poll_timeout().unwrap();
        h.with(|t, ctx| t.handle_timeout(ctx));
        h.drain();
    }
    let waited = h.now.saturating_duration_since(start).as_millis() as u64;
    let round = ms(&h, "time_round_ms") - 40;
    let silent = ms(&h, "time_silent_ms");
    assert!(round > 0 && silent > 0, "round {round} silent {silent}");
    // (each counter rounds down to whole milliseconds)
    assert!(
        waited - (round + silent) <= 2,
        "{round} + {silent} of {waited}"
    );
    assert_eq!(ms(&h, "time_held_ms"), 0);
    // every millisecond since the flow opened is in one counter
    assert_eq!(ms(&h, "time_feed_ms"), 0);
    let total: u64 = [
        "time_idle_ms",
        "time_ready_ms",
        "time_feed_ms",
        "time_round_ms",
        "time_silent_ms",
        "time_held_ms",
    ]
    .iter()
    .map(|k| ms(&h, k))
    .sum();
    let elapsed = h.now.saturating_duration_since(Instant::ZERO).as_millis() as u64;
    assert!(elapsed - total <= 5, "{total} of {elapsed}");
}

#[test]
fn a_relay_waiting_for_packets_from_upstream_counts_as_fed() {
    let ms = |h: &Harness, k: &str| h.t.stats().extra.get(k).copied().unwrap_or(0);
    // relay 2 on the path 1 -> 2 -> 3, a 1000-byte block of ten 100-byte packets (fewer than
    // a txop): pipelining forwards it only once it is complete
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(small_cfg()));
    h.recv(1, &relay_bsyn(1000));
    let geom = BlockGeom {
        block_len: 1000,
        packet_size: 100,
    };
    let data = |p: u16| HopMessage {
        header: hdr(0, 0),
        body: HopBody::Data {
            offset: 0,
            geom,
            packet_num: p,
            payload: &[7u8; 100],
        },
    };
    for p in 0..5 {
        h.recv(1, &data(p));
    }
    h.drain();
    // the other half arrives 30 ms later
    h.now += Duration::from_millis(30);
    for p in 5..10 {
        h.recv(1, &data(p));
    }
    assert_eq!(ms(&h, "time_feed_ms"), 30);
    // the block is complete: the relay asks its next hop, which answers 10 ms later
    let out = h.drain();
    assert_eq!(bsyn_blocks(&out), vec![0]);
    h.now += Duration::from_millis(10);
    h.recv(
        3,
        &HopMessage {
            header: hdr(0, 0),
            body: HopBody::Back {
                duplicates: 0,
                block_len: 1000,
                packets: 10,
                bitmap: &[0, 0],
            },
        },
    );
    assert_eq!(ms(&h, "time_round_ms"), 10);
    h.now += Duration::from_millis(2);
    let out = h.drain();
    assert_eq!(out.iter().filter(|o| o.class == Class::Data).count(), 10);
    assert_eq!(ms(&h, "time_ready_ms"), 2);
    assert_eq!(ms(&h, "time_feed_ms"), 30);
}
