//! A node's own flows beyond `max_sending_flows`: they wait, and start as others end.

use super::*;

fn source(max_sending: usize, per_dst: usize, max_waiting: usize) -> Harness {
    let cfg = HopConfig {
        max_sending_flows: max_sending,
        max_sending_flows_per_destination: per_dst,
        max_waiting_flows: max_waiting,
        ..small_cfg()
    };
    // Node 1; destinations 3 and 4, both through node 2.
    Harness::new(1, &[(3, 2), (4, 2), (2, 2)], HopTransport::new(cfg))
}

fn key(id: u32) -> FlowKey {
    FlowKey { src: 1, id }
}

fn open(h: &mut Harness, id: u32, dst: NodeId) -> Result<(), AppError> {
    h.with(|t, ctx| t.open(ctx, key(id), dst))
}

fn send(h: &mut Harness, id: u32, data: &[u8]) -> usize {
    h.with(|t, ctx| t.send(ctx, key(id), Bytes::copy_from_slice(data)))
        .unwrap()
}

/// Flow ids whose BSYNs are among `out`.
fn flows_sending(out: &[Outgoing]) -> Vec<u32> {
    let mut ids: Vec<u32> = out
        .iter()
        .filter_map(|o| HopMessage::parse(o.message()).ok())
        .filter(|m| m.msg_type() == MsgType::Bsyn)
        .map(|m| m.header.flow_id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

#[test]
fn flows_beyond_the_limit_wait_and_start_oldest_first_as_others_end() {
    let mut h = source(2, 2, 10);
    for id in 0..4 {
        open(&mut h, id, 3).unwrap();
        assert_eq!(
            send(&mut h, id, &[id as u8; 250]),
            250,
            "bytes kept while waiting"
        );
        h.with(|t, ctx| t.finish(ctx, key(id))).unwrap();
    }
    assert_eq!(h.t.stats().extra["flows_waited"], 2);
    assert_eq!(flows_sending(&h.drain()), vec![0, 1]);
    assert_eq!(
        h.t.stats().cache_bytes,
        1000,
        "the waiting flows' bytes are held"
    );
    h.with(|t, ctx| t.abort(ctx, key(1))).unwrap();
    assert_eq!(
        flows_sending(&h.drain()),
        vec![2],
        "the oldest waiting flow starts"
    );
    h.with(|t, ctx| t.abort(ctx, key(0))).unwrap();
    assert_eq!(flows_sending(&h.drain()), vec![3]);
}

#[test]
fn a_destination_at_its_limit_does_not_hold_up_the_others() {
    let mut h = source(8, 1, 10);
    for (id, dst) in [(0, 3), (1, 3), (2, 3), (3, 4)] {
        open(&mut h, id, dst).unwrap();
        send(&mut h, id, &[1; 250]);
    }
    assert_eq!(flows_sending(&h.drain()), vec![0, 3]);
    h.with(|t, ctx| t.abort(ctx, key(3))).unwrap();
    assert!(
        flows_sending(&h.drain()).is_empty(),
        "3's flows still wait for 0"
    );
    h.with(|t, ctx| t.abort(ctx, key(0))).unwrap();
    assert_eq!(flows_sending(&h.drain()), vec![1]);
}

#[test]
fn an_aborted_waiting_flow_sends_nothing_and_frees_its_bytes() {
    let mut h = source(1, 1, 10);
    open(&mut h, 0, 3).unwrap();
    open(&mut h, 1, 3).unwrap();
    send(&mut h, 1, &[7; 250]);
    assert_eq!(h.t.stats().cache_bytes, 250);
    h.with(|t, ctx| t.abort(ctx, key(1))).unwrap();
    assert_eq!(h.t.stats().cache_bytes, 0);
    h.with(|t, ctx| t.abort(ctx, key(0))).unwrap();
    assert!(flows_sending(&h.drain()).is_empty());
    let r = h.with(|t, ctx| t.send(ctx, key(1), Bytes::from_static(b"x")));
    assert_eq!(r, Err(AppError::UnknownFlow(key(1))));
}

#[test]
fn a_waiting_flow_refused_bytes_hears_writable_when_it_starts() {
    let cfg = HopConfig {
        max_sending_flows: 1,
        cache_limit_bytes: 300,
        ..small_cfg()
    };
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    open(&mut h, 0, 3).unwrap();
    assert_eq!(send(&mut h, 0, &[1; 250]), 250);
    open(&mut h, 1, 3).unwrap();
    assert_eq!(
        send(&mut h, 1, &[2; 250]),
        50,
        "the cache budget bounds waiting bytes"
    );
    while h.t.poll_event().is_some() {}
    h.with(|t, ctx| t.abort(ctx, key(0))).unwrap();
    h.drain();
    let mut writable = false;
    while let Some(e) = h.t.poll_event() {
        writable |= e == Event::Writable { flow: key(1) };
    }
    assert!(writable);
    assert_eq!(send(&mut h, 1, &[2; 200]), 200);
}

#[test]
fn an_open_beyond_the_waiting_limit_is_refused_with_the_limit_named() {
    let mut h = source(1, 1, 2);
    for id in 0..3 {
        open(&mut h, id, 3).unwrap();
    }
    let r = open(&mut h, 3, 3);
    assert_eq!(r, Err(AppError::TooManyWaitingFlows(2)));
    let msg = r.unwrap_err().to_string();
    assert!(
        msg.contains("limit 2") && msg.contains("max_waiting_flows"),
        "{msg}"
    );
    assert_eq!(h.t.stats().extra["flows_refused_at_open"], 1);
}

/// Node 1 with a start hold of 1 s; destinations 3 and 4 through node 2.
fn holding_source(max_block_bytes: usize) -> Harness {
    let cfg = HopConfig {
        max_block_bytes,
        flow_start_hold: Duration::from_secs(1),
        ..small_cfg()
    };
    Harness::new(1, &[(3, 2), (4, 2), (2, 2)], HopTransport::new(cfg))
}

/// Open flow `id` to `dst` with `len` bytes, all it will send.
fn open_sized(h: &mut Harness, id: u32, dst: NodeId, len: usize) {
    open(h, id, dst).unwrap();
    send(h, id, &vec![id as u8; len]);
    h.with(|t, ctx| t.finish(ctx, key(id))).unwrap();
}

fn open_small(h: &mut Harness, id: u32, dst: NodeId) {
    open_sized(h, id, dst, 250);
}

#[test]
fn small_flows_to_one_destination_start_one_after_the_other() {
    let mut h = holding_source(1 << 20);
    open_small(&mut h, 0, 3);
    open_small(&mut h, 1, 3);
    open_small(&mut h, 2, 4);
    assert_eq!(
        flows_sending(&h.drain()),
        vec![0, 2],
        "1 waits for 0; 4's flow does not"
    );
    assert!(h
        .t
        .poll_timeout()
        .is_some_and(|t| t <= h.now + Duration::from_secs(1)));
    h.with(|t, ctx| t.abort(ctx, key(0))).unwrap();
    assert_eq!(
        flows_sending(&h.drain()),
        vec![1],
        "the next starts as 0 ends"
    );
}

#[test]
fn a_small_flow_holds_the_next_one_back_for_the_hold_at_most() {
    let mut h = holding_source(1 << 20);
    open_small(&mut h, 0, 3);
    open_small(&mut h, 1, 3);
    assert_eq!(flows_sending(&h.drain()), vec![0]);
    h.now += Duration::from_millis(999);
    h.with(|t, ctx| t.handle_timeout(ctx));
    assert!(!flows_sending(&h.drain()).contains(&1));
    h.now += Duration::from_millis(1);
    h.with(|t, ctx| t.handle_timeout(ctx));
    assert!(
        h.t.poll_timeout().is_none_or(|t| t > h.now),
        "the hold's end is not left as a deadline passed"
    );
    assert!(
        flows_sending(&h.drain()).contains(&1),
        "0 has not ended, but its hold has"
    );
}

#[test]
fn a_flow_of_more_than_one_block_holds_nothing_back() {
    // Blocks of 200 bytes: flow 0's 250 bytes are two blocks.
    let mut h = holding_source(200);
    open_small(&mut h, 0, 3);
    open_small(&mut h, 1, 3);
    assert_eq!(flows_sending(&h.drain()), vec![0, 1]);
}

#[test]
fn beside_a_long_flow_small_flows_to_its_destination_start_at_once() {
    // Blocks of 200 bytes: flow 0 is long, 1 and 2 are small and would hold each other
    // back, but each would wait for its turn behind 0's rounds here.
    let mut h = holding_source(200);
    open_sized(&mut h, 0, 3, 250);
    open_sized(&mut h, 1, 3, 50);
    open_sized(&mut h, 2, 3, 50);
    assert_eq!(flows_sending(&h.drain()), vec![0, 1, 2]);
    h.with(|t, ctx| t.abort(ctx, key(0))).unwrap();
    open_sized(&mut h, 3, 3, 50);
    open_sized(&mut h, 4, 3, 50);
    assert!(
        flows_sending(&h.drain()).is_empty(),
        "without 0, 3 waits for 2, the last started"
    );
    h.with(|t, ctx| t.abort(ctx, key(2))).unwrap();
    assert_eq!(flows_sending(&h.drain()), vec![3], "and 4 for 3");
}
