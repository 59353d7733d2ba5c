//! Robustness: arbitrary input and interleavings never panic and never spin.

use super::*;

proptest! {
    #[test]
    fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..200), overheard: bool) {
        let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(small_cfg()));
        let _ = h.with(|t, ctx| t.handle(ctx, Received { link_src: 1, link_dst: 2, overheard, body: &body, shared: None }));
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
        let header = HopHeader { priority: 0, flags, ttl, src, flow_id: 1, dst, block_num: block };
        let body = match (kind, &payload) {
            (0, Some(p)) => HopBody::Data { offset: 0, geom, packet_num: pn, payload: p },
            (1, Some(p)) if flags & FLAG_MICRO != 0 => HopBody::Bsyn { ctl: ControlSeq::default(), offset: 0, geom, packet_num: pn, expect: 0, payload: p },
            (1, _) => HopBody::Bsyn { ctl: ControlSeq::default(), offset: 0, geom, packet_num: 0, expect: (pn as u32).min(geom.packets()) as u16, payload: &[] },
            (2, _) => HopBody::Back { ctl: ControlSeq::default(), duplicates: 0, block_hint_kib: 0, block_len: len, packets: 3, bitmap: &[0x05] },
            (3, _) => HopBody::E2eBack { cum_blocks: cum },
            _ => HopBody::Fin { total_bytes: 7 },
        };
        let msg = HopMessage { header: HopHeader { flags: if matches!(body, HopBody::Bsyn { .. }) && flags & FLAG_MICRO != 0 && payload.is_none() { flags & !FLAG_MICRO } else { flags }, ..header }, body };
        let mut bytes = Vec::new();
        if msg.emit(&mut bytes).is_ok() && HopMessage::parse(&bytes).is_ok() {
            for step in 0..3 {
                let _ = h.with(|t, ctx| t.handle(ctx, Received { link_src: 1 + step % 2 * 2, link_dst: 2, overheard: false, body: &bytes, shared: None }));
                h.now += Duration::from_millis(300);
                h.with(|t, ctx| t.handle_timeout(ctx));
                h.drain();
            }
        }
    }
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
        priority: 0,
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
            ctl: ControlSeq::default(),
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
            ctl: ControlSeq::default(),
            block_len: geom.block_len,
            packets: geom.packets().min(u32::from(u16::MAX)) as u16,
            duplicates: (v[4] % 3) as u16,
            block_hint_kib: 0,
            bitmap: &bitmap,
        },
        7 => HopBody::E2eBack {
            cum_blocks: v[5] % 5,
        },
        8 if v[4] % 4 == 0 => HopBody::Fin {
            total_bytes: u64::from(v[1] % 5000),
        },
        _ => HopBody::Bsyn {
            ctl: ControlSeq::default(),
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
            queue_aware: on(5),
            duplicate_feedback: on(6),
            adaptive_bsyn_timeout: on(7),
            round_per_next_hop: on(8),
            virtual_retransmission: on(9),
            cache_limit_bytes: if on(10) { 2500 } else { 1 << 20 },
            link_window_packets: if on(11) { 4 } else { 32 },
            next_hop_backpressure: on(12),
            initial_block_bytes: if on(13) { 300 } else { 0 },
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
                        t.handle(ctx, Received { link_src: from, link_dst, overheard, body: &body, shared: None })
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
