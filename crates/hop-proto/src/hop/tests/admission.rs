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
