//! The TCP-like baseline driven over a toy network: nodes on a chain, each sending one
//! datagram at a time over its outgoing link (a fixed time per datagram), with chosen
//! datagrams dropped.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::*;
use crate::test_support::Env;

const F: FlowKey = FlowKey { src: 1, id: 7 };
const STEP: Duration = Duration::from_micros(100);

/// Whether to drop a datagram: (sender, message, how many times this segment was sent).
type DropRule = Box<dyn FnMut(NodeId, &Message<'_>, u32) -> bool>;

struct Net {
    nodes: BTreeMap<NodeId, (TcpTransport, Env)>,
    now: Instant,
    /// Time a node's link takes per datagram.
    tx_time: BTreeMap<NodeId, Duration>,
    busy_until: BTreeMap<NodeId, Instant>,
    /// (arrival, to, from, body), in sending order.
    air: VecDeque<(Instant, NodeId, NodeId, Vec<u8>)>,
    drop: DropRule,
    /// How often each segment left its source.
    sends: BTreeMap<u32, u32>,
    delivered: Vec<u8>,
    events: Vec<(NodeId, Event)>,
    /// Application bytes the source has not accepted yet (offered again on Writable).
    unsent: Bytes,
}

impl Net {
    /// Nodes 1..=n on a chain, each sending a datagram in `tx` (node 1) or `relay_tx`.
    fn chain(n: u32, cfg: TcpConfig, tx: Duration, relay_tx: Duration) -> Net {
        let mut nodes = BTreeMap::new();
        let mut tx_time = BTreeMap::new();
        for id in 1..=n {
            let routes: Vec<(NodeId, NodeId)> = (1..=n)
                .filter(|&d| d != id)
                .map(|d| (d, if d > id { id + 1 } else { id - 1 }))
                .collect();
            nodes.insert(
                id,
                (
                    TcpTransport::new(cfg.clone()),
                    Env::new(&routes, u64::from(id)),
                ),
            );
            tx_time.insert(id, if id == 1 { tx } else { relay_tx });
        }
        Net {
            nodes,
            now: Instant::from_nanos(0),
            tx_time,
            busy_until: BTreeMap::new(),
            air: VecDeque::new(),
            drop: Box::new(|_, _, _| false),
            sends: BTreeMap::new(),
            delivered: Vec::new(),
            events: Vec::new(),
            unsent: Bytes::new(),
        }
    }

    fn start(&mut self, dst: NodeId, data: &[u8]) {
        let now = self.now;
        let (t, env) = self.nodes.get_mut(&1).unwrap();
        t.open(&mut env.ctx(now, 1), F, dst).unwrap();
        self.unsent = Bytes::copy_from_slice(data);
        self.feed();
    }

    /// Offer the source what it has not taken yet; finish once it took everything.
    fn feed(&mut self) {
        let now = self.now;
        let (t, env) = self.nodes.get_mut(&1).unwrap();
        let n = t
            .send(&mut env.ctx(now, 1), F, self.unsent.clone())
            .unwrap();
        self.unsent = self.unsent.slice(n..);
        if self.unsent.is_empty() {
            t.finish(&mut env.ctx(now, 1), F).unwrap();
        }
    }

    fn drain_events(&mut self) {
        let mut writable = false;
        for (&id, (t, _)) in self.nodes.iter_mut() {
            while let Some(e) = t.poll_event() {
                writable |= matches!(e, Event::Writable { .. });
                if let Event::Delivered { offset, data, .. } = &e {
                    assert_eq!(*offset, self.delivered.len() as u64, "in order, once");
                    self.delivered.extend_from_slice(data);
                }
                self.events.push((id, e));
            }
        }
        if writable {
            self.feed();
        }
    }

    fn step(&mut self) {
        let now = self.now;
        while self.air.front().is_some_and(|a| a.0 <= now) {
            let (_, to, from, body) = self.air.pop_front().unwrap();
            let (t, env) = self.nodes.get_mut(&to).unwrap();
            let rx = Received {
                link_src: from,
                link_dst: to,
                overheard: false,
                body: &body,
                shared: None,
            };
            t.handle(&mut env.ctx(now, to), rx).unwrap();
        }
        for (&id, (t, env)) in self.nodes.iter_mut() {
            if t.poll_timeout().is_some_and(|d| d <= now) {
                t.handle_timeout(&mut env.ctx(now, id));
                assert!(
                    t.poll_timeout().is_none_or(|d| d > now),
                    "a handled deadline is not reported again"
                );
            }
            if self.busy_until.get(&id).is_some_and(|&b| b > now) {
                continue;
            }
            let Some(o) = t.poll_transmit(&mut env.ctx(now, id)) else {
                continue;
            };
            assert_eq!(o.class, Class::Acked);
            let took = self.tx_time[&id];
            self.busy_until.insert(id, now + took);
            let msg = wire::parse(o.message()).unwrap();
            let mut nth = 0;
            if let (1, Message::Segment(s)) = (id, &msg) {
                let c = self.sends.entry(s.seq).or_insert(0);
                *c += 1;
                nth = *c;
            }
            if !(self.drop)(id, &msg, nth) {
                self.air.push_back((now + took, o.next_hop, id, o.body));
            }
        }
        self.drain_events();
        self.now += STEP;
    }

    /// Run until the source's flow completes (or fails), at most `limit`.
    fn run(&mut self, limit: Duration) {
        let end = self.now + limit;
        while self.now < end {
            self.step();
            let over = self
                .events
                .iter()
                .any(|(_, e)| matches!(e, Event::SendComplete { .. } | Event::SendFailed { .. }));
            if over {
                // Let the last ACKs and events settle.
                for _ in 0..10 {
                    self.step();
                }
                return;
            }
        }
    }

    fn stats(&self, id: NodeId) -> TransportStats {
        self.nodes[&id].0.stats()
    }

    fn extra(&self, id: NodeId, k: &str) -> u64 {
        self.stats(id).extra.get(k).copied().unwrap_or(0)
    }

    fn kinds(&self, id: NodeId) -> Vec<&'static str> {
        self.kinds_all(id)
            .into_iter()
            .filter(|k| *k != "delivered" && *k != "writable")
            .collect()
    }

    fn kinds_all(&self, id: NodeId) -> Vec<&'static str> {
        self.events
            .iter()
            .filter(|(n, _)| *n == id)
            .map(|(_, e)| match e {
                Event::FlowOpened { .. } => "opened",
                Event::Delivered { .. } => "delivered",
                Event::FlowFinished { .. } => "finished",
                Event::FlowAbandoned { .. } => "abandoned",
                Event::SendComplete { .. } => "complete",
                Event::SendFailed { .. } => "failed",
                Event::Writable { .. } => "writable",
                Event::Acknowledged { .. } => "acknowledged",
                Event::NeighbourSilent { .. } => "silent",
                Event::NeighbourReturned { .. } => "returned",
                Event::DestinationFull { .. } => "full",
            })
            .collect()
    }
}

fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

const MS: Duration = Duration::from_millis(1);

fn assert_complete(net: &Net, dst: NodeId, sent: &[u8]) {
    assert_eq!(net.delivered.len(), sent.len());
    assert!(net.delivered == sent, "delivered bytes differ");
    assert_eq!(net.kinds(1), vec!["complete"]);
    assert_eq!(net.kinds(dst), vec!["opened", "finished"]);
    assert!(net.events.contains(&(
        1,
        Event::SendComplete {
            flow: F,
            bytes: sent.len() as u64
        }
    )));
    assert!(net.events.contains(&(
        dst,
        Event::FlowFinished {
            flow: F,
            bytes: sent.len() as u64
        }
    )));
    for (id, (t, _)) in &net.nodes {
        assert_eq!(t.stats().flows, 0, "node {id} released the flow");
    }
}

#[test]
fn lossless_one_hop_transfer_delivers_exactly_the_bytes() {
    let mut net = Net::chain(2, TcpConfig::default(), MS, MS);
    let sent = data(400_000);
    net.start(2, &sent);
    net.run(Duration::from_secs(10));
    assert_complete(&net, 2, &sent);
    assert!(
        net.kinds_all(1).contains(&"writable"),
        "the send buffer filled and drained"
    );
    let segments = sent.len().div_ceil(1380) as u64;
    let s = net.stats(1);
    assert_eq!(s.sent_by_type["data"], segments, "every segment once");
    assert_eq!(s.data_retransmissions, 0);
    // Delayed ACKs: about one ACK per two segments, never more than one per segment.
    let acks = net.stats(2).sent_by_type["ack"];
    assert!(acks >= segments / 2 && acks <= segments, "{acks} acks");
    assert_eq!(net.extra(1, "rto_expirations"), 0);
}

#[test]
fn three_hop_chain_transfer_completes() {
    let mut net = Net::chain(4, TcpConfig::default(), MS, MS);
    let sent = data(300_000);
    net.start(4, &sent);
    net.run(Duration::from_secs(20));
    assert_complete(&net, 4, &sent);
    for relay in [2, 3] {
        let s = net.stats(relay);
        assert!(s.sent_by_type["forwarded"] > 217, "relay {relay}: {s:?}");
        assert!(!s.sent_by_type.contains_key("data"));
    }
    assert_eq!(net.stats(1).data_retransmissions, 0);
}

#[test]
fn a_lost_segment_is_recovered_by_fast_retransmit_not_rto() {
    let mut net = Net::chain(2, TcpConfig::default(), MS, MS);
    net.drop = Box::new(
        |from, m, nth| matches!(m, Message::Segment(s) if from == 1 && s.seq == 5 && nth == 1),
    );
    let sent = data(100_000);
    net.start(2, &sent);
    net.run(Duration::from_secs(10));
    assert_complete(&net, 2, &sent);
    assert_eq!(net.sends[&5], 2, "segment 5 resent once");
    assert_eq!(net.stats(1).data_retransmissions, 1);
    assert_eq!(net.extra(1, "fast_recoveries"), 1);
    assert_eq!(net.extra(1, "rto_expirations"), 0);
    // The receiver acknowledged out-of-order segments at once, with SACK blocks.
    assert!(net.stats(2).sent_by_type["ack"] > 40);
}

#[test]
fn a_lost_tail_is_recovered_by_the_retransmission_timeout() {
    let mut net = Net::chain(2, TcpConfig::default(), MS, MS);
    let sent = data(10 * 1380 + 100);
    let last = 10;
    net.drop = Box::new(
        move |from, m, nth| matches!(m, Message::Segment(s) if from == 1 && s.seq == last && nth == 1),
    );
    net.start(2, &sent);
    let t0 = net.now;
    net.run(Duration::from_secs(10));
    assert_complete(&net, 2, &sent);
    assert_eq!(net.sends[&last], 2);
    assert_eq!(net.extra(1, "rto_expirations"), 1);
    assert_eq!(net.extra(1, "fast_recoveries"), 0);
    // The path's RTT is a few milliseconds: the RTO is its 200 ms floor (Linux's, RFC 6298
    // §2.4) plus SRTT, counted from the last ACK that advanced.
    let done = net.now - t0;
    assert!(done > Duration::from_millis(200), "{done:?}");
    assert!(done < Duration::from_millis(240), "{done:?}");
}

#[test]
fn relay_queue_overflow_drops_and_the_flow_still_completes() {
    let cfg = TcpConfig {
        queue_limit_packets: 4,
        ..TcpConfig::default()
    };
    // The relay's link is three times slower than the source's: its FIFO overflows.
    let mut net = Net::chain(3, cfg, MS, 3 * MS);
    let sent = data(400_000);
    net.start(3, &sent);
    net.run(Duration::from_secs(30));
    assert_complete(&net, 3, &sent);
    let drops = net.extra(2, "queue_drops");
    assert!(drops > 0, "the relay dropped at its tail");
    // Only dropped segments are resent (the drops also count ACKs), and SACK recovery
    // finds them without waiting for the timer.
    let resent = net.stats(1).data_retransmissions;
    assert!(
        resent > 0 && resent <= drops,
        "{resent} resent, {drops} dropped"
    );
    assert_eq!(net.extra(1, "rto_expirations"), 0);
    assert!(net.extra(1, "fast_recoveries") > 0);
}

#[test]
fn malformed_segments_are_errors_and_change_nothing() {
    let mut net = Net::chain(2, TcpConfig::default(), MS, MS);
    let (t, env) = net.nodes.get_mut(&2).unwrap();
    let good = Message::Segment(wire::Segment {
        flags: 0,
        src: 1,
        id: 7,
        dst: 2,
        seq: 0,
        payload: b"abc",
    })
    .to_vec();
    for bad in [&good[..10], &good[..0], &[7u8, 0, 0, 0][..]] {
        let rx = Received {
            link_src: 1,
            link_dst: 2,
            overheard: false,
            body: bad,
            shared: None,
        };
        assert!(t
            .handle(&mut env.ctx(Instant::from_nanos(0), 2), rx)
            .is_err());
    }
    assert_eq!(t.stats().flows, 0);
    assert!(t.poll_event().is_none());
    assert!(t
        .poll_transmit(&mut env.ctx(Instant::from_nanos(0), 2))
        .is_none());
}

#[test]
fn a_flow_without_a_route_fails_after_give_up() {
    let cfg = TcpConfig {
        give_up_after: Duration::from_secs(2),
        ..TcpConfig::default()
    };
    let mut net = Net::chain(2, cfg, MS, MS);
    net.start(9, &data(5000));
    net.run(Duration::from_secs(5));
    assert!(net.events.contains(&(
        1,
        Event::SendFailed {
            flow: F,
            reason: FailReason::NoRoute
        }
    )));
}

mod arbitrary {
    use super::*;
    use proptest::prelude::*;

    /// A message body: random bytes, or a well-formed segment or ACK with random fields.
    fn body() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..60),
            (any::<bool>(), 0u32..4, 0u32..4, 0u32..200, 0usize..50).prop_map(
                |(fin, src, dst, seq, len)| Message::Segment(wire::Segment {
                    flags: if fin { wire::FLAG_FIN } else { 0 },
                    src,
                    id: 7,
                    dst,
                    seq,
                    payload: &vec![1; len],
                })
                .to_vec()
            ),
            (
                0u32..4,
                0u32..200,
                0u32..100,
                proptest::collection::vec((0u32..200, 1u32..9), 0..3)
            )
                .prop_map(|(src, ack, wnd, b)| Message::Ack(wire::Ack {
                    src,
                    id: 7,
                    ack,
                    wnd,
                    blocks: b.into_iter().map(|(s, l)| (s, s + l)).collect(),
                })
                .to_vec()),
        ]
    }

    proptest! {
        /// Node 1 sends a flow to 3 and receives whatever comes, in any order, with timeouts
        /// and polls between: nothing panics and a handled deadline is not reported again.
        #[test]
        fn never_panics_never_spins(steps in proptest::collection::vec((body(), 0u8..4, 0u64..300), 1..80)) {
            let mut t = TcpTransport::new(TcpConfig::default());
            let mut env = Env::new(&[(2, 2), (3, 2), (0, 0)], 1);
            let mut now = Instant::from_nanos(0);
            t.open(&mut env.ctx(now, 1), F, 3).unwrap();
            let _ = t.send(&mut env.ctx(now, 1), F, Bytes::from(vec![5u8; 30_000]));
            for (b, op, dt) in steps {
                now += Duration::from_millis(dt);
                match op {
                    0 => {
                        let rx = Received { link_src: 2, link_dst: 1, overheard: false, body: &b, shared: None };
                        let _ = t.handle(&mut env.ctx(now, 1), rx);
                    }
                    1 if t.poll_timeout().is_some_and(|d| d <= now) => {
                        t.handle_timeout(&mut env.ctx(now, 1));
                        prop_assert!(t.poll_timeout().is_none_or(|d| d > now));
                    }
                    2 => { let _ = t.finish(&mut env.ctx(now, 1), F); }
                    _ => {}
                }
                let mut polled = 0;
                while t.poll_transmit(&mut env.ctx(now, 1)).is_some() {
                    polled += 1;
                    prop_assert!(polled < 10_000);
                }
                while t.poll_event().is_some() {}
            }
        }
    }
}
