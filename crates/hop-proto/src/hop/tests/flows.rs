//! Flows' lifetimes: closing, late messages of a closed flow, and sources giving up.

use super::*;

/// Node 3, the destination of `FLOW` from node 1, after delivering its one 250-byte block
/// and forgetting the flow (the source's FIN came).
fn closed_destination() -> Harness {
    let mut h = Harness::new(3, &[(1, 1)], HopTransport::new(small_cfg()));
    last_block_by_data(&mut h);
    h.recv(
        1,
        &HopMessage {
            header: hdr(0, 0),
            body: HopBody::Fin { total_bytes: 250 },
        },
    );
    h.drain();
    while h.t.poll_event().is_some() {}
    assert_eq!(h.t.stats().flows, 0);
    h
}

fn late_bsyn(block: u32) -> HopMessage<'static> {
    HopMessage {
        header: hdr(block, FLAG_FIN),
        body: HopBody::Bsyn {
            ctl: ControlSeq::default(),
            offset: 0,
            geom: BlockGeom {
                block_len: 250,
                packet_size: 100,
            },
            packet_num: 0,
            expect: 3,
            payload: &[],
        },
    }
}

/// A relay whose BACKs from the destination were all lost still holds the flow's block in
/// custody and asks for it. The destination, which delivered the flow and forgot it, answers
/// as it did while it held the flow: the block arrived, the flow is delivered. Without the
/// answer the relay asked until its custody expired, and the source, served by the relay,
/// never heard the end of its flow.
#[test]
fn a_finished_flows_late_bsyn_is_answered_after_the_destination_forgot_it() {
    let mut h = closed_destination();
    h.now += Duration::from_secs(900);
    h.recv(1, &late_bsyn(0));
    let out = h.drain();
    assert_eq!(backs_to(&out, 1), vec![(FLAG_COMPLETE, 0)]);
    assert_eq!(e2e_cums(&out), vec![1]);
    assert_eq!(h.t.stats().flows, 0, "the flow is not opened again");
    assert_eq!(h.t.stats().extra.get("closed_flow_answered"), Some(&1));
    // It is remembered while a relay's custody or the source's tries may last, then
    // forgotten: the next BSYN opens a new flow.
    h.now += HopConfig::default().custody_expiry;
    h.with(|t, ctx| t.handle_timeout(ctx));
    h.recv(1, &late_bsyn(0));
    assert_eq!(e2e_cums(&h.drain()), Vec::<u32>::new());
    assert_eq!(h.t.stats().flows, 1);
}

/// A source whose blocks only a relay's cache answers (virtual retransmissions) makes no
/// progress: it gives up after `give_up_after` and says why, rather than trying forever.
#[test]
fn a_source_served_only_from_a_relays_cache_gives_up() {
    let cfg = HopConfig {
        give_up_after: Duration::from_secs(30),
        vtx_initial_timeout: Duration::from_secs(1),
        ..small_cfg()
    };
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    let key = FlowKey { src: 1, id: 9 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![5u8; 250])))
        .unwrap();
    h.with(|t, ctx| t.finish(ctx, key)).unwrap();
    let mut failed = None;
    for _ in 0..400 {
        h.now += Duration::from_millis(250);
        h.with(|t, ctx| t.handle_timeout(ctx));
        // Relay 2 answers every BSYN: it holds the whole block (a first transfer, then
        // virtual retransmissions served from its cache); no end-to-end BACK ever comes.
        for o in h.drain() {
            if let Ok(HopMessage {
                header,
                body: HopBody::Bsyn { .. },
            }) = HopMessage::parse(o.message())
            {
                let back = HopMessage {
                    header: HopHeader {
                        flags: FLAG_COMPLETE,
                        ..header
                    },
                    body: HopBody::Back {
                        ctl: ControlSeq::default(),
                        block_len: 0,
                        packets: 0,
                        duplicates: 0,
                        block_hint_kib: 0,
                        bitmap: &[],
                    },
                };
                h.recv(2, &back);
            }
        }
        while let Some(e) = h.t.poll_event() {
            if let Event::SendFailed { flow, reason } = e {
                failed = Some((flow, reason, h.now));
            }
        }
        if failed.is_some() {
            break;
        }
    }
    let (flow, reason, at) = failed.expect("the source gives up");
    assert_eq!((flow, reason), (key, FailReason::Timeout));
    assert!(at <= Instant::ZERO + Duration::from_secs(32), "{at:?}");
}

/// With `initial_block_bytes` a flow's blocks start small and double up to the block size,
/// so its first bytes arrive after a small block, not after a whole one.
#[test]
fn a_flows_blocks_start_small_and_double_with_a_block_ramp() {
    let cfg = HopConfig {
        initial_block_bytes: 1000,
        opening_block_packets: 0,
        ramp_while_shared: false,
        max_block_bytes: 5000,
        ..small_cfg()
    };
    let sizes = block_sizes(cfg, 25_000, false, 0);
    assert_eq!(&sizes[..4], &[1000, 2000, 4000, 5000], "{sizes:?}");
}

/// The first BSYN among `out`: its header and the block's geometry.
fn bsyn_in(out: Vec<Outgoing>) -> Option<(HopHeader, BlockGeom)> {
    out.into_iter()
        .find_map(|o| match HopMessage::parse(o.message()) {
            Ok(HopMessage {
                header,
                body: HopBody::Bsyn { geom, .. },
            }) => Some((header, geom)),
            _ => None,
        })
}

/// The next hop's BACK to a BSYN (`header`, `geom`) holding the whole block, asking for
/// `hint_kib`.
fn whole_back(header: HopHeader, geom: BlockGeom, hint_kib: u16) -> HopMessage<'static> {
    HopMessage {
        header: HopHeader {
            flags: FLAG_COMPLETE,
            ..header
        },
        body: HopBody::Back {
            ctl: ControlSeq::default(),
            block_len: geom.block_len,
            packets: 0,
            duplicates: 0,
            block_hint_kib: hint_kib,
            bitmap: &[],
        },
    }
}

/// The sizes of the blocks a source at node 1 cuts for one flow to node 3 (next hop 2) of
/// `bytes`, finished or not: each block is taken whole at once by a BACK carrying `hint_kib`.
fn block_sizes(cfg: HopConfig, bytes: usize, finish: bool, hint_kib: u16) -> Vec<u32> {
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    let key = FlowKey { src: 1, id: 9 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; bytes])))
        .unwrap();
    if finish {
        h.with(|t, ctx| t.finish(ctx, key)).unwrap();
    }
    let mut sizes = Vec::new();
    for _ in 0..8 {
        let bsyn = bsyn_in(h.drain());
        let Some((header, geom)) = bsyn else {
            break;
        };
        sizes.push(geom.block_len);
        h.recv(2, &whole_back(header, geom, hint_kib));
    }
    sizes
}

fn ramp_cfg(while_shared: bool) -> HopConfig {
    HopConfig {
        initial_block_bytes: 1000,
        opening_block_packets: 0,
        ramp_while_shared: while_shared,
        max_block_bytes: 8000,
        // No virtual retransmission while the test runs.
        vtx_initial_timeout: Duration::from_secs(3600),
        ..small_cfg()
    }
}

/// With `ramp_while_shared` the blocks after a flow's first double only while its next hop
/// reports turns shared with other flows; a flow whose path reports none cuts whole blocks
/// after its first, since a flow alone has no turns to shorten.
#[test]
fn the_ramp_while_shared_doubles_only_while_the_path_reports_shared_turns() {
    assert_eq!(
        block_sizes(ramp_cfg(true), 20_000, false, 0),
        vec![1000, 8000, 8000, 3000],
        "alone"
    );
    assert_eq!(
        block_sizes(ramp_cfg(true), 20_000, false, 1),
        vec![1000, 2000, 4000, 8000, 5000],
        "shared"
    );
    // Without the switch the ramp doubles whatever the path reports, and a hint does not
    // cut blocks unless `shared_turn_blocks` is on.
    assert_eq!(
        block_sizes(ramp_cfg(false), 20_000, false, 0),
        vec![1000, 2000, 4000, 8000, 5000],
        "ramp, alone"
    );
    let plain = HopConfig {
        max_block_bytes: 8000,
        vtx_initial_timeout: Duration::from_secs(3600),
        ..small_cfg()
    };
    assert_eq!(
        block_sizes(plain, 20_000, false, 1),
        vec![8000, 8000, 4000],
        "no ramp"
    );
}

/// With `opening_block_packets` under the ramp a flow's first block holds that many packets
/// and the ramp goes on from `initial_block_bytes`; below `micro_block_threshold` the first
/// block is a micro-block, whose packets ride on its BSYN (§3.6). A flow alone cuts whole
/// blocks after it, as with the ramp's own first block.
#[test]
fn an_opening_block_sets_the_first_block_and_the_ramp_goes_on_from_the_initial_size() {
    let cfg = |micro| HopConfig {
        opening_block_packets: 1,
        micro_block_threshold: micro,
        ..ramp_cfg(true)
    };
    assert_eq!(
        block_sizes(cfg(0), 20_000, false, 1),
        vec![100, 1000, 2000, 4000, 8000, 4900],
        "shared"
    );
    assert_eq!(
        block_sizes(cfg(0), 20_000, false, 0),
        vec![100, 8000, 8000, 3900],
        "alone"
    );
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg(500)));
    let key = FlowKey { src: 1, id: 9 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; 20_000])))
        .unwrap();
    let first = h
        .drain()
        .into_iter()
        .find_map(|o| match HopMessage::parse(o.message()) {
            Ok(HopMessage {
                header,
                body: HopBody::Bsyn { geom, payload, .. },
            }) => Some((header.flags, geom.block_len, payload.len())),
            _ => None,
        });
    let (flags, len, carried) = first.expect("a first BSYN");
    assert_eq!(len, 100);
    assert!(flags & FLAG_MICRO != 0, "a micro-block: {flags:#x}");
    assert_eq!(carried, 100, "its packet rides on the BSYN");
}

/// The BSYNs of block 0 a source at node 1 sends for one flow of 20,000 bytes to node 3
/// (next hop 2), when the next hop answers the first with a BACK holding nothing and
/// carrying `hint_kib`: the block lengths they name, in order.
fn first_block_after_first_back(cfg: HopConfig, hint_kib: u16) -> (Vec<u32>, u64) {
    // Not a micro-block, whose packets ride on its BSYNs (§3.6).
    let cfg = HopConfig {
        micro_block_threshold: 0,
        ..cfg
    };
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    let key = FlowKey { src: 1, id: 9 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; 20_000])))
        .unwrap();
    let bsyn0 = |out: &[Outgoing]| {
        out.iter()
            .filter_map(|o| match HopMessage::parse(o.message()) {
                Ok(HopMessage {
                    header,
                    body: HopBody::Bsyn { geom, .. },
                }) if header.block_num == 0 => Some((header, geom)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let first = bsyn0(&h.drain());
    let (header, geom) = first[0];
    let mut lens = vec![geom.block_len];
    let none_held = vec![0u8; geom.packets().div_ceil(8) as usize];
    let back = HopMessage {
        header,
        body: HopBody::Back {
            ctl: ControlSeq::default(),
            block_len: geom.block_len,
            packets: geom.packets() as u16,
            duplicates: 0,
            block_hint_kib: hint_kib,
            bitmap: &none_held,
        },
    };
    h.recv(2, &back);
    let out = h.drain();
    lens.extend(bsyn0(&out).iter().map(|(_, g)| g.block_len));
    let data = out
        .iter()
        .filter(|o| {
            matches!(
                HopMessage::parse(o.message()),
                Ok(HopMessage {
                    body: HopBody::Data { .. },
                    ..
                })
            )
        })
        .count() as u64;
    (lens, data)
}

/// With `ramp_while_shared` a flow's first block is small, since it is cut before any
/// answer can say whether the flow shares turns. If the first hop answers its BSYN without
/// reporting shared turns and nothing of it has been sent, the block is cut again as large
/// as the bytes ready allow: a flow alone pays one BSYN/BACK round instead of a small
/// block's tail on every hop (§3.1). Reported shared turns keep the small block.
#[test]
fn a_lone_flows_small_first_block_is_cut_again_whole_before_any_packet_leaves() {
    let (alone, sent) = first_block_after_first_back(ramp_cfg(true), 0);
    assert_eq!(
        alone,
        vec![1000, 8000],
        "alone: a new BSYN for the whole block"
    );
    assert_eq!(sent, 0, "nothing of the small block was sent");
    let (shared, sent) = first_block_after_first_back(ramp_cfg(true), 1);
    assert!(
        shared.iter().all(|&l| l == 1000),
        "shared: the small block stays: {shared:?}"
    );
    assert!(sent > 0, "its packets go");
    // The plain ramp keeps its small first block whatever the answer.
    let (plain, _) = first_block_after_first_back(ramp_cfg(false), 0);
    assert!(plain.iter().all(|&l| l == 1000), "{plain:?}");
}

/// Under the ramp a finished flow whose rest fits one block is cut whole: it ends within
/// that turn, and smaller blocks would only add rounds and tails (§3.1).
#[test]
fn under_the_ramp_a_flow_that_ends_within_a_block_is_cut_whole() {
    for while_shared in [false, true] {
        assert_eq!(
            block_sizes(ramp_cfg(while_shared), 5000, true, 1),
            vec![5000],
            "{while_shared}"
        );
    }
    // A longer finished flow ramps until its rest fits one block.
    assert_eq!(
        block_sizes(ramp_cfg(false), 12_000, true, 1),
        vec![1000, 2000, 4000, 5000]
    );
}

/// With `block_time` a source sizes each next block to what its flow moved over the first
/// hop in that time at the last block's rate, between `initial_block_bytes` and the block
/// size: a block taken quickly lets the next one grow at once, a slow one shrinks it.
#[test]
fn blocks_paced_by_rate_follow_how_fast_the_first_hop_takes_them() {
    let cfg = HopConfig {
        initial_block_bytes: 1000,
        max_block_bytes: 50_000,
        block_time: Duration::from_secs(1),
        // No virtual retransmission within the test's two minutes.
        vtx_initial_timeout: Duration::from_secs(3600),
        ..small_cfg()
    };
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    let key = FlowKey { src: 1, id: 9 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; 200_000])))
        .unwrap();
    // How long the next hop takes to take each block whole.
    let takes = [100u64, 1000, 4000, 100_000, 50];
    let mut sizes = Vec::new();
    for ms in takes {
        let bsyn = bsyn_in(h.drain());
        let (header, geom) = bsyn.expect("a block is in transfer");
        sizes.push(geom.block_len);
        h.now += Duration::from_millis(ms);
        h.recv(2, &whole_back(header, geom, 0));
    }
    let next = h
        .drain()
        .into_iter()
        .find_map(|o| match HopMessage::parse(o.message()) {
            Ok(HopMessage {
                body: HopBody::Bsyn { geom, .. },
                ..
            }) => Some(geom.block_len),
            _ => None,
        });
    sizes.extend(next);
    // 1000 B in 0.1 s: 10 kB/s, 10 kB per second; 10 kB in 1 s keeps it; 10 kB in 4 s:
    // 2.5 kB; 2.5 kB in 100 s: the floor; 1000 B in 50 ms: 20 kB.
    assert_eq!(
        sizes,
        vec![1000, 10_000, 10_000, 2500, 1000, 20_000],
        "{sizes:?}"
    );
}
