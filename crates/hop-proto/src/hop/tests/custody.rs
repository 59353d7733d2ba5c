//! §3.4 Custody: persisting blocks before the completing BACK, restarts, the store's refusals.

use super::*;

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
    whole_back(hdr(0, FLAG_COMPLETE))
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
        .find_map(|o| match HopMessage::parse(o.message()).ok()? {
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
    // The source hears why (once), toward it through node 1.
    assert_eq!(full_notices(&out), vec![(1, 0)]);
    // Room again: the next timer delivers and acknowledges.
    log.lock().unwrap().0 = false;
    h.now = h.t.poll_timeout().expect("a retry is scheduled");
    h.with(|t, ctx| t.handle_timeout(ctx));
    let out = h.drain();
    assert_eq!(e2e_cums(&out), vec![1]);
    assert_eq!(delivered(&mut h.t), vec![(0, 250)]);
    assert_eq!(log.lock().unwrap().1, vec![(0, 0, 250)]);
}

/// A destination store that writes deliveries later: it records them and answers
/// [`Persist::Later`]; the test reports the writes.
struct LaterDeliveries(Arc<Mutex<Vec<u32>>>);

impl CustodyStore for LaterDeliveries {
    fn persist(&mut self, _b: &StoredBlock) -> Result<Persist, StoreFull> {
        Ok(Persist::Done)
    }
    fn release(&mut self, _flow: FlowKey, _block_num: u32) {}
    fn deliver(&mut self, d: &Delivery) -> Result<Persist, StoreFull> {
        self.0.lock().unwrap().push(d.block_num);
        Ok(Persist::Later)
    }
}

/// Node 3, the destination of FLOW, over a store that writes deliveries later; the log of
/// the blocks handed to it.
fn later_destination() -> (Harness, Arc<Mutex<Vec<u32>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let t = HopTransport::with_store(small_cfg(), Box::new(LaterDeliveries(log.clone())));
    (Harness::new(3, &[(1, 1)], t), log)
}

fn finished_events(t: &mut HopTransport) -> (Vec<(u64, usize)>, Vec<u64>) {
    let (mut delivered, mut finished) = (Vec::new(), Vec::new());
    while let Some(e) = t.poll_event() {
        match e {
            Event::Delivered { offset, data, .. } => delivered.push((offset, data.len())),
            Event::FlowFinished { bytes, .. } => finished.push(bytes),
            _ => {}
        }
    }
    (delivered, finished)
}

#[test]
fn deferred_deliveries_are_acknowledged_end_to_end_only_once_durable() {
    let (mut h, log) = later_destination();
    feed_block(&mut h, 0, &[1u8; 250]);
    feed_block_flags(&mut h, 1, FLAG_FIN, &[2u8; 250]);
    let out = h.drain();
    // The store has both; the application gets neither, and the source keeps its copy,
    // until the store says they are on disk. Their bytes stay counted in the cache.
    assert_eq!(*log.lock().unwrap(), vec![0, 1]);
    assert!(e2e_cums(&out).is_empty(), "{:?}", e2e_cums(&out));
    assert_eq!(finished_events(&mut h.t), (vec![], vec![]));
    assert_eq!(h.t.stats().cache_bytes, 500);
    // A late BSYN for a delivered block gets no end-to-end BACK yet: nodes on the way would
    // drop the block it names.
    h.recv(1, &bsyn_with_expect(0, 250, 0));
    assert!(e2e_cums(&h.drain()).is_empty());
    // Block 0's write fails (the store retries it): the source hears, once, that the
    // destination cannot store, and the flow's new blocks are held back meanwhile.
    h.with(|t, ctx| t.delivery_persisted(ctx, FLOW, 0, false));
    assert_eq!(full_notices(&h.drain()), vec![(1, 0)]);
    h.with(|t, ctx| t.delivery_persisted(ctx, FLOW, 0, false));
    assert!(full_notices(&h.drain()).is_empty());
    // Block 1 is written first: it waits for block 0.
    h.with(|t, ctx| t.delivery_persisted(ctx, FLOW, 1, true));
    assert!(e2e_cums(&h.drain()).is_empty());
    assert_eq!(finished_events(&mut h.t), (vec![], vec![]));
    // Block 0 is written: both reach the application in order, FIN end to end.
    h.with(|t, ctx| t.delivery_persisted(ctx, FLOW, 0, true));
    let out = h.drain();
    assert_eq!(e2e_cums(&out), vec![2]);
    assert!(out
        .iter()
        .any(|o| HopMessage::parse(o.message()).is_ok_and(|m| m.header.flags & FLAG_FIN != 0)));
    assert_eq!(
        finished_events(&mut h.t),
        (vec![(0, 250), (250, 250)], vec![500])
    );
    assert_eq!(h.t.stats().cache_bytes, 0);
    // A repeated report changes nothing.
    h.with(|t, ctx| t.delivery_persisted(ctx, FLOW, 1, true));
    assert!(e2e_cums(&h.drain()).is_empty());
}

/// End-to-end BACKs in `out`: (block named, cumulative blocks).
fn e2e_named(out: &[Outgoing]) -> Vec<(u32, u32)> {
    out.iter()
        .filter_map(|o| match HopMessage::parse(o.message()).ok()? {
            HopMessage {
                header,
                body: HopBody::E2eBack { cum_blocks },
            } => Some((header.block_num, cum_blocks)),
            _ => None,
        })
        .collect()
}

/// The block an end-to-end BACK names is dropped by every node on the way, so a late BSYN
/// for a block still being written is answered naming the last durable one.
#[test]
fn an_end_to_end_back_names_only_a_durable_block() {
    let (mut h, _) = later_destination();
    feed_block(&mut h, 0, &[1u8; 250]);
    feed_block(&mut h, 1, &[2u8; 250]);
    h.drain();
    h.with(|t, ctx| t.delivery_persisted(ctx, FLOW, 0, true));
    assert_eq!(e2e_named(&h.drain()), vec![(0, 1)]);
    h.recv(1, &bsyn_with_expect(1, 250, 0));
    assert_eq!(e2e_named(&h.drain()), vec![(0, 1)]);
    h.with(|t, ctx| t.delivery_persisted(ctx, FLOW, 1, true));
    assert_eq!(e2e_named(&h.drain()), vec![(1, 2)]);
}

#[test]
fn a_destination_keeps_a_flow_whose_deliveries_are_being_written() {
    let (mut h, _) = later_destination();
    feed_block_flags(&mut h, 0, FLAG_FIN, &[1u8; 250]);
    h.drain();
    // Long past every idle timeout, the write still pending: the flow is not forgotten, so
    // its end is still reported and acknowledged when the write finishes.
    for _ in 0..20 {
        h.now += Duration::from_secs(600);
        h.with(|t, ctx| t.handle_timeout(ctx));
    }
    h.drain();
    h.with(|t, ctx| t.delivery_persisted(ctx, FLOW, 0, true));
    assert_eq!(e2e_cums(&h.drain()), vec![1]);
    assert_eq!(finished_events(&mut h.t).1, vec![250]);
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
