//! A node running Hop, HxH and ATP, driven by a sequence of operations decoded from the
//! input: datagrams (arbitrary bodies in envelopes whose checksum is made valid, so that they
//! reach the transports), timer expiries, polls and application calls. No input may panic
//! the node or make a poll loop forever.

#![no_main]

use std::time::Duration;

use bytes::Bytes;
use hop_proto::atp::{AtpConfig, AtpTransport};
use hop_proto::hop::{HopConfig, HopTransport};
use hop_proto::hxh::{HxhConfig, HxhTransport};
use hop_proto::{Instant, Node, StaticRoutes, TransportId};
use hop_wire::EnvelopeRepr;
use libfuzzer_sys::fuzz_target;

/// Most datagrams one poll loop may yield before it counts as endless.
const POLL_BOUND: usize = 200_000;

fn take<'a>(input: &mut &'a [u8], n: usize) -> &'a [u8] {
    let n = n.min(input.len());
    let (head, tail) = input.split_at(n);
    *input = tail;
    head
}

fuzz_target!(|data: &[u8]| {
    // Node 2 between neighbours 1 and 3; 5 lies behind 3 and 4 behind 1.
    let routes: StaticRoutes = [(1, 1), (3, 3), (5, 3), (4, 1)].into_iter().collect();
    let mut node = Node::new(2, Box::new(routes), 1);
    let hop = HopConfig {
        packet_payload_bytes: 100,
        max_block_bytes: 1000,
        txop_bytes: 300,
        micro_block_threshold: 200,
        ..HopConfig::default()
    };
    node.add_transport(Box::new(HopTransport::new(hop)));
    node.add_transport(Box::new(HxhTransport::new(HxhConfig::default())));
    node.add_transport(Box::new(AtpTransport::new(AtpConfig::default())));
    let mut now = Instant::ZERO;
    let flows: Vec<_> = [TransportId::Hop, TransportId::Hxh, TransportId::Atp]
        .into_iter()
        .filter_map(|t| node.open(now, t, 5).ok())
        .collect();
    let mut input = data;
    while let Some((&op, rest)) = input.split_first() {
        input = rest;
        now += Duration::from_millis(u64::from(op >> 4) * 9);
        match op & 0x0f {
            0..=6 => {
                // A datagram: transport, flags, link source, overheard or not, body length,
                // body.
                let head = take(&mut input, 4);
                let [t, flags, src, len] = [0, 1, 2, 3].map(|i| head.get(i).copied().unwrap_or(0));
                let transport = match t % 3 {
                    0 => TransportId::Hop,
                    1 => TransportId::Hxh,
                    _ => TransportId::Atp,
                };
                let link_dst = if src & 0x80 != 0 { 7 } else { 2 };
                let repr = EnvelopeRepr {
                    transport,
                    flags: flags & 0x01,
                    link_src: u32::from(src & 0x07),
                    link_dst,
                };
                let body = take(&mut input, usize::from(len) * 4);
                let mut dg = Vec::new();
                if repr.emit(body, &mut dg).is_ok() {
                    let _ = node.handle_datagram(now, &dg);
                }
            }
            7 | 8 => {
                if let Some(d) = node.poll_timeout() {
                    if op & 0x10 != 0 {
                        now = now.max(d);
                    }
                    if d <= now {
                        node.handle_timeout(now);
                        assert!(
                            node.poll_timeout().is_none_or(|d| d > now),
                            "deadline reported again"
                        );
                    }
                }
            }
            9 => {
                let mut n = 0;
                while node.poll_transmit(now).is_some() {
                    n += 1;
                    assert!(n < POLL_BOUND, "poll_transmit does not end");
                }
            }
            10 => {
                let mut n = 0;
                while node.poll_control(now).is_some() {
                    n += 1;
                    assert!(n < POLL_BOUND, "poll_control does not end");
                }
            }
            11 | 12 => {
                if let Some(&f) = flows.get(usize::from(op >> 4) % flows.len().max(1)) {
                    let len = take(&mut input, 1).first().copied().unwrap_or(0);
                    let _ = node.send(now, f, Bytes::from(vec![op; usize::from(len) * 20]));
                }
            }
            13 => {
                if let Some(&f) = flows.get(usize::from(op >> 4) % flows.len().max(1)) {
                    let _ = node.finish(now, f);
                }
            }
            14 => {
                if let Some(&f) = flows.get(usize::from(op >> 4) % flows.len().max(1)) {
                    let _ = node.abort(now, f);
                }
            }
            _ => {
                while node.poll_event().is_some() {}
                let _ = node.stats();
                let _ = node.received();
            }
        }
    }
});
