use super::*;
use crate::test_support::Env;

const F: FlowKey = FlowKey { src: 1, id: 7 };

fn ms(v: u64) -> Instant {
    Instant::from_nanos(v * 1_000_000)
}

fn data(seq: u32, flags: u8) -> Vec<u8> {
    data_with_credits(seq, flags, 4)
}

fn data_with_credits(seq: u32, flags: u8, credits: u16) -> Vec<u8> {
    Message::Data(wire::Data {
        flags,
        credits,
        src: F.src,
        id: F.id,
        dst: 9,
        seq,
        rev_ack: 0,
        payload: b"payload",
    })
    .to_vec()
}

fn rx(from: NodeId, to: NodeId, body: &[u8]) -> Received<'_> {
    Received {
        link_src: from,
        link_dst: to,
        overheard: false,
        body,
        shared: None,
    }
}

fn drain(t: &mut HxhTransport, env: &mut Env, now: Instant, local: NodeId) -> Vec<Outgoing> {
    let mut out = Vec::new();
    while let Some(o) = t.poll_transmit(&mut env.ctx(now, local)) {
        out.push(o);
    }
    out
}

fn hop_acks(out: &[Outgoing]) -> Vec<wire::HopAck> {
    out.iter()
        .filter_map(|o| match wire::parse(o.message()) {
            Ok(Message::HopAck(a)) => Some(a),
            _ => None,
        })
        .collect()
}

/// Source node 1 with 20 000 bytes of flow F queued for 9, whose next hop is 2.
fn source(cfg: HxhConfig) -> (HxhTransport, Env) {
    let mut t = HxhTransport::new(cfg);
    let mut env = Env::new(&[(9, 2)], 1);
    t.open(&mut env.ctx(ms(0), 1), F, 9).unwrap();
    t.send(&mut env.ctx(ms(0), 1), F, Bytes::from(vec![7u8; 20_000]))
        .unwrap();
    (t, env)
}

#[test]
fn relay_advertises_free_buffer_and_refuses_beyond_reserve() {
    // Node 5 relays flow F toward 9 via 6; its next hop (6) never answers.
    let cfg = HxhConfig::default();
    let mut t = HxhTransport::new(cfg.clone());
    let mut env = Env::new(&[(9, 6), (1, 4)], 1);
    let mut acks = Vec::new();
    for seq in 0..8u32 {
        let b = data(seq, 0);
        t.handle(&mut env.ctx(ms(0), 5), rx(4, 5, &b)).unwrap();
        let out: Vec<Outgoing> = t.control.drain(..).collect();
        acks.extend(hop_acks(&out));
    }
    let credits: Vec<u16> = acks.iter().map(|a| a.credits).collect();
    // Advertised = 4 - held, under-reporting the 2 reserve packets (§3.2).
    assert_eq!(credits, vec![3, 2, 1, 0, 0, 0, 0, 0]);
    let refused: Vec<bool> = acks
        .iter()
        .map(|a| a.flags & wire::HOPACK_REFUSED != 0)
        .collect();
    let cap = usize::from(cfg.buffer_packets + cfg.reserve_packets);
    assert!(refused[..cap].iter().all(|r| !r));
    assert!(refused[cap..].iter().all(|r| *r));
    // Duplicates are acknowledged, not queued twice.
    let b = data(0, 0);
    t.handle(&mut env.ctx(ms(1), 5), rx(4, 5, &b)).unwrap();
    let a = hop_acks(&t.control.drain(..).collect::<Vec<_>>());
    assert_eq!(a[0].flags & wire::HOPACK_REFUSED, 0);
    assert_eq!(t.flows[&F].fwd.held(), cap);
}

#[test]
fn passive_relay_acknowledges_only_what_its_forwarding_cannot() {
    // Relay 5 (upstream 4, next hop 6): accepted data is acknowledged by forwarding it.
    let cfg = HxhConfig {
        passive_feedback: true,
        ..HxhConfig::default()
    };
    let mut t = HxhTransport::new(cfg.clone());
    let mut env = Env::new(&[(9, 6), (1, 4)], 1);
    for seq in 0..2u32 {
        t.handle(&mut env.ctx(ms(0), 5), rx(4, 5, &data(seq, 0)))
            .unwrap();
    }
    assert!(hop_acks(&t.control.drain(..).collect::<Vec<_>>()).is_empty());
    // Its data carries its credits for the upstream node: 4 minus what it holds,
    // the packet being sent included.
    let out = drain(&mut t, &mut env, ms(1), 5);
    let credits: Vec<u16> = out
        .iter()
        .filter_map(|o| match wire::parse(o.message()) {
            Ok(Message::Data(d)) => Some(d.credits),
            _ => None,
        })
        .collect();
    assert_eq!(credits, vec![2, 2]);
    // A packet it already has (the upstream missed the forward) and one it has no room
    // for are acknowledged explicitly.
    t.handle(&mut env.ctx(ms(2), 5), rx(4, 5, &data(1, 0)))
        .unwrap();
    let a = hop_acks(&t.control.drain(..).collect::<Vec<_>>());
    assert_eq!((a.len(), a[0].seq, a[0].flags), (1, 1, 0));
    for seq in 2..8u32 {
        t.handle(&mut env.ctx(ms(3), 5), rx(4, 5, &data(seq, 0)))
            .unwrap();
    }
    let a = hop_acks(&t.control.drain(..).collect::<Vec<_>>());
    assert!(!a.is_empty() && a.iter().all(|a| a.flags & wire::HOPACK_REFUSED != 0));
}

#[test]
fn passive_upstream_learns_delivery_and_credits_from_the_forward_it_overhears() {
    // Source 1 sends to 9 via relay 2, which forwards to 3.
    let (mut t, mut env) = source(HxhConfig {
        passive_feedback: true,
        ..HxhConfig::default()
    });
    assert_eq!(drain(&mut t, &mut env, ms(0), 1).len(), 4);
    assert!(t.flows[&F].fwd.passive);
    // Relay 2 forwards packet 2 to 3 with one credit left; we overhear it. Packets 0
    // and 1 went before it, so they reached the relay too.
    let fwd = |seq: u32, credits: u16| data_with_credits(seq, 0, credits);
    let heard = |from, to, body| Received {
        link_src: from,
        link_dst: to,
        overheard: true,
        body,
        shared: None,
    };
    let b = fwd(2, 1);
    t.handle(&mut env.ctx(ms(20), 1), heard(2, 3, &b)).unwrap();
    let f = &t.flows[&F].fwd;
    assert_eq!(f.inflight.keys().copied().collect::<Vec<_>>(), vec![3]);
    assert_eq!(f.pool(), 1);
    assert_eq!(drain(&mut t, &mut env, ms(20), 1).len(), 1);
    // A link-layer retry of the same frame, heard again, is not a second advertisement.
    t.handle(&mut env.ctx(ms(21), 1), heard(2, 3, &b)).unwrap();
    assert!(drain(&mut t, &mut env, ms(21), 1).is_empty());
    // Another flow's packet from the same relay, or our packet sent by another node,
    // says nothing about ours.
    let other = fwd(3, 4);
    t.handle(&mut env.ctx(ms(22), 1), heard(7, 3, &other))
        .unwrap();
    assert!(drain(&mut t, &mut env, ms(22), 1).is_empty());
    // Without overheard feedback a packet is sent again only after §3.2's stall time
    // (five EWMAs of the delay), not after the explicit variant's shorter timeout.
    let fw = &t.flows[&F].fwd;
    assert!(fw.hop_rto(&t.cfg) >= fw.stall_after(&t.cfg));
}

#[test]
fn passive_credits_count_what_is_still_on_the_way_to_the_next_hop() {
    // Source 1 hands four packets to its interface, one a millisecond; relay 2 has
    // received only the first when it forwards it, advertising three credits.
    let (mut t, mut env) = source(HxhConfig {
        passive_feedback: true,
        ..HxhConfig::default()
    });
    for i in 0..4 {
        assert!(t.poll_transmit(&mut env.ctx(ms(i), 1)).is_some());
    }
    let heard = |body| Received {
        link_src: 2,
        link_dst: 3,
        overheard: true,
        body,
        shared: None,
    };
    let b = data_with_credits(0, 0, 3);
    t.handle(&mut env.ctx(ms(10), 1), heard(&b)).unwrap();
    // Packets 1-3 left after packet 0 and are not in the relay's three credits: sending
    // three more would put seven packets toward a relay that takes six (4 + reserve 2).
    assert_eq!(t.flows[&F].fwd.pool(), 0);
    assert!(drain(&mut t, &mut env, ms(10), 1).is_empty());
    // The relay forwards packet 3 with one credit: 1 and 2 went before it, nothing of
    // ours is on the way, and the one credit is ours to use.
    let b = data_with_credits(3, 0, 1);
    t.handle(&mut env.ctx(ms(20), 1), heard(&b)).unwrap();
    assert!(t.flows[&F].fwd.inflight.is_empty());
    assert_eq!(drain(&mut t, &mut env, ms(20), 1).len(), 1);
}

#[test]
fn credits_gate_sending_and_a_stalled_flow_is_probed() {
    // Source node 1 sends to 9 via 2.
    let (mut t, mut env) = source(HxhConfig::default());
    let first = drain(&mut t, &mut env, ms(0), 1);
    // Four default credits: four packets, then nothing until feedback.
    assert_eq!(first.len(), 4);
    assert!(first
        .iter()
        .all(|o| o.class == Class::Data && o.next_hop == 2));
    // The next hop acknowledges all four but has no room left (credits 0).
    for seq in 0..4 {
        let a = Message::HopAck(wire::HopAck {
            flags: 0,
            credits: 0,
            src: F.src,
            id: F.id,
            seq,
            rev_ack: 0,
        })
        .to_vec();
        t.handle(&mut env.ctx(ms(10), 1), rx(2, 1, &a)).unwrap();
    }
    assert!(drain(&mut t, &mut env, ms(10), 1).is_empty());
    // Stall probe at 5 x EWMA of the per-hop delay after the last feedback (§3.2).
    let ewma = t.flows[&F].fwd.hop_delay;
    let due = t.poll_timeout().unwrap();
    let expect = ms(10) + Duration::from_secs_f64(5.0 * ewma);
    assert_eq!(due, expect);
    t.handle_timeout(&mut env.ctx(due, 1));
    let probe = drain(&mut t, &mut env, due, 1);
    assert_eq!(probe.len(), 1, "exactly one probe packet");
    assert!(drain(&mut t, &mut env, due, 1).is_empty());
    // A credit update reopens the flow.
    let c = Message::Credit(wire::Credit {
        flags: 0,
        credits: 4,
        src: F.src,
        id: F.id,
        rev_ack: 2,
    })
    .to_vec();
    t.handle(&mut env.ctx(due, 1), rx(2, 1, &c)).unwrap();
    // 4 credits minus the probe still in flight.
    assert_eq!(drain(&mut t, &mut env, due, 1).len(), 3);
    assert_eq!(t.flows[&F].rev_ack, 2);
}

#[test]
fn last_hop_sets_sync_bit_after_a_gap_and_resyncs() {
    // Node 5 is the last hop of F (next hop = destination 9).
    let mut t = HxhTransport::new(HxhConfig::default());
    let mut env = Env::new(&[(9, 9), (1, 4)], 1);
    for seq in [0u32, 2, 3] {
        let b = data(seq, 0);
        t.handle(&mut env.ctx(ms(0), 5), rx(4, 5, &b)).unwrap();
    }
    t.control.clear();
    let sent = drain(&mut t, &mut env, ms(0), 5);
    assert_eq!(sent.len(), 3);
    let ack = |seq: u32, flags: u8, rev: u32| {
        Message::HopAck(wire::HopAck {
            flags,
            credits: 4,
            src: F.src,
            id: F.id,
            seq,
            rev_ack: rev,
        })
        .to_vec()
    };
    t.handle(&mut env.ctx(ms(1), 5), rx(9, 5, &ack(0, 0, 0)))
        .unwrap();
    assert_eq!(t.flows[&F].rev_ack, 1);
    // Packet 2 reached the destination while 1 is neither acknowledged nor held: a gap.
    t.handle(&mut env.ctx(ms(1), 5), rx(9, 5, &ack(2, 0, 0)))
        .unwrap();
    assert!(!t.flows[&F].fwd.in_sync);
    assert_eq!(t.flows[&F].rev_ack, 1, "no update across the gap");
    // Packet 3 was acknowledged too, but the last hop does not advance while out of sync.
    t.handle(&mut env.ctx(ms(1), 5), rx(9, 5, &ack(3, 0, 0)))
        .unwrap();
    assert_eq!(t.flows[&F].rev_ack, 1);
    // Packet 1 finally arrives from upstream and leaves with the sync bit.
    let b = data(1, wire::DATA_RETX);
    t.handle(&mut env.ctx(ms(2), 5), rx(4, 5, &b)).unwrap();
    t.control.clear();
    let out = drain(&mut t, &mut env, ms(2), 5);
    let Ok(Message::Data(d)) = wire::parse(&out[0].body) else {
        panic!("expected data");
    };
    assert_eq!(d.seq, 1);
    assert_ne!(d.flags & wire::DATA_SYNC, 0);
    // The destination answers with its cumulative ACK: back in sync.
    t.handle(
        &mut env.ctx(ms(3), 5),
        rx(9, 5, &ack(1, wire::HOPACK_SYNC_REPLY, 4)),
    )
    .unwrap();
    assert!(t.flows[&F].fwd.in_sync);
    assert_eq!(t.flows[&F].rev_ack, 4);
    assert_eq!(t.stats().extra.get("sync_replies"), Some(&1));
}

fn nacks(t: &HxhTransport) -> Vec<wire::Nack> {
    t.control
        .iter()
        .filter_map(|o| match wire::parse(o.message()) {
            Ok(Message::Nack(n)) => Some(n),
            _ => None,
        })
        .collect()
}

#[test]
fn destination_nacks_gaps_at_once_without_holdoff_and_answers_ack_requests() {
    let cfg = HxhConfig {
        nack_holdoff: false,
        ..HxhConfig::default()
    };
    let mut t = HxhTransport::new(cfg);
    let mut env = Env::new(&[(1, 5)], 1);
    let b = data(0, 0);
    t.handle(&mut env.ctx(ms(0), 9), rx(5, 9, &b)).unwrap();
    let b = data(3, wire::DATA_ACK_REQ);
    t.handle(&mut env.ctx(ms(1), 9), rx(5, 9, &b)).unwrap();
    let n = nacks(&t);
    assert_eq!(n.len(), 1);
    assert_eq!((n[0].ranges.clone(), n[0].cum), (vec![(1, 3)], 1));
    assert!(t
        .control
        .iter()
        .any(|o| matches!(wire::parse(o.message()), Ok(Message::Ack(a)) if a.cum == 1)));
    assert_eq!(t.poll_event(), Some(Event::FlowOpened { flow: F }));
    // A later packet does not NACK the same gap again ...
    t.control.clear();
    let b = data(4, 0);
    t.handle(&mut env.ctx(ms(2), 9), rx(5, 9, &b)).unwrap();
    assert!(nacks(&t).is_empty());
    // ... the NACK timer does, while the gap stays open.
    let due = t.poll_timeout().unwrap();
    assert_eq!(due, ms(1) + HxhConfig::default().nack_timeout);
    t.handle_timeout(&mut env.ctx(due, 9));
    let n = nacks(&t);
    assert_eq!(n.len(), 1);
    assert_eq!(n[0].ranges, vec![(1, 3)]);
}

#[test]
fn destination_holds_off_nacks_for_reordered_packets() {
    let mut t = HxhTransport::new(HxhConfig::default());
    let mut env = Env::new(&[(1, 5)], 1);
    for (at, seq) in [(0, 0), (1, 3)] {
        let b = data(seq, 0);
        t.handle(&mut env.ctx(ms(at), 9), rx(5, 9, &b)).unwrap();
    }
    // The gap 1..3 is not NACKed at once: per-hop retries reorder packets.
    assert!(nacks(&t).is_empty());
    let due = t.poll_timeout().unwrap();
    assert!(due > ms(1) && due < ms(1) + HxhConfig::default().nack_timeout);
    // Packet 1 arrives late (reordered) before the hold-off ends: only 2 is NACKed.
    let b = data(1, 0);
    t.handle(&mut env.ctx(ms(5), 9), rx(5, 9, &b)).unwrap();
    assert!(nacks(&t).is_empty());
    let due = t.poll_timeout().unwrap();
    t.handle_timeout(&mut env.ctx(due, 9));
    let n = nacks(&t);
    assert_eq!(n.len(), 1, "{n:?}");
    assert_eq!((n[0].ranges.clone(), n[0].cum), (vec![(2, 3)], 2));
    // The deadline handled is not reported again; the NACK timer repeats the NACK.
    t.control.clear();
    let next = t.poll_timeout().unwrap();
    assert_eq!(next, due + HxhConfig::default().nack_timeout);
    t.handle_timeout(&mut env.ctx(next, 9));
    assert_eq!(nacks(&t).len(), 1);
    // Once filled, no more NACKs.
    t.control.clear();
    let b = data(2, wire::DATA_RETX);
    t.handle(
        &mut env.ctx(next + Duration::from_millis(1), 9),
        rx(5, 9, &b),
    )
    .unwrap();
    let later = t.poll_timeout().unwrap();
    t.handle_timeout(&mut env.ctx(later, 9));
    assert!(nacks(&t).is_empty());
}

#[test]
fn malformed_input_is_an_error_not_a_panic() {
    let mut t = HxhTransport::new(HxhConfig::default());
    let mut env = Env::new(&[], 1);
    assert!(t
        .handle(&mut env.ctx(ms(0), 1), rx(2, 1, &[1, 0, 0]))
        .is_err());
    assert!(t.handle(&mut env.ctx(ms(0), 1), rx(2, 1, &[])).is_err());
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn msg(kind: u8, v: &[u32]) -> Vec<u8> {
        let src = [1, 4][v[0] as usize % 2];
        let id = v[1] % 2;
        let dst = [1, 9][v[2] as usize % 2];
        let seq = v[3] % 24;
        match kind % 5 {
            0 => Message::Data(wire::Data {
                flags: (v[4] as u8) & 0x0f,
                credits: (v[5] % 8) as u16,
                src,
                id,
                dst,
                seq,
                rev_ack: v[6] % 24,
                payload: &[7; 10],
            }),
            1 => Message::HopAck(wire::HopAck {
                flags: (v[4] as u8) & 0x03,
                credits: (v[5] % 8) as u16,
                src,
                id,
                seq,
                rev_ack: v[6] % 24,
            }),
            2 => Message::Credit(wire::Credit {
                flags: 0,
                credits: (v[5] % 8) as u16,
                src,
                id,
                rev_ack: v[6] % 24,
            }),
            3 => Message::Nack(wire::Nack {
                src,
                id,
                cum: v[6] % 24,
                ranges: vec![(seq, seq + 1 + v[5] % 5)],
            }),
            _ => Message::Ack(wire::Ack {
                src,
                id,
                cum: v[6] % 24,
            }),
        }
        .to_vec()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Any interleaving of messages, timeouts, polls and application calls: no panic,
        /// and a deadline that has been handled is never reported again.
        #[test]
        fn never_panics_never_spins(ops in proptest::collection::vec(
            (0u8..4, any::<u8>(), proptest::collection::vec(any::<u32>(), 7), 0u64..300),
            1..120,
        ), passive in any::<bool>()) {
            let cfg = HxhConfig { passive_feedback: passive, ..HxhConfig::default() };
            let mut t = HxhTransport::new(cfg);
            let mut env = Env::new(&[(9, 2), (4, 4), (2, 2)], 1);
            let f = FlowKey { src: 1, id: 0 };
            t.open(&mut env.ctx(ms(0), 1), f, 9).unwrap();
            let mut now = ms(0);
            for (op, kind, v, dt) in ops {
                now += Duration::from_millis(dt);
                match op {
                    0 => {
                        let b = msg(kind, &v);
                        let from = [2, 4, 9][v[0] as usize % 3];
                        // Some of it overheard (sent to another node).
                        let to = if v[1] % 3 == 0 { 3 } else { 1 };
                        let r = Received { overheard: to != 1, ..rx(from, to, &b) };
                        let _ = t.handle(&mut env.ctx(now, 1), r);
                    }
                    1 => {
                        if t.poll_timeout().is_some_and(|d| d <= now) {
                            t.handle_timeout(&mut env.ctx(now, 1));
                            drain(&mut t, &mut env, now, 1);
                            prop_assert!(t.poll_timeout().is_none_or(|d| d > now));
                        }
                    }
                    2 => {
                        drain(&mut t, &mut env, now, 1);
                    }
                    _ => {
                        let _ = t.send(&mut env.ctx(now, 1), f, Bytes::from(vec![1; 3000]));
                        if kind % 7 == 0 {
                            let _ = t.finish(&mut env.ctx(now, 1), f);
                        }
                    }
                }
                while t.poll_event().is_some() {}
            }
        }
    }
}
