//! §3.6 Micro-blocks: small transfers on the BSYN.

use super::*;

#[test]
fn a_micro_block_without_samples_waits_the_floor_not_the_bsyn_timeout() {
    let cfg = HopConfig::default();
    let ms = Duration::from_millis;
    // A block's first BSYN to a next hop without samples: its data may still drain.
    assert_eq!(bsyn_wait(&cfg, None, None, 0, false), cfg.bsyn_timeout);
    // A micro-block's packets are on its BSYNs: the BACK comes after one control round.
    assert_eq!(bsyn_wait(&cfg, None, None, 0, true), ms(50));
    assert_eq!(bsyn_wait(&cfg, None, Some(ms(1)), 0, true), ms(2));
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
            .filter_map(|o| match HopMessage::parse(o.message()) {
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
                ctl: ControlSeq::default(),
                block_len: 250,
                packets: 3,
                duplicates: 0,
                block_hint_kib: 0,
                bitmap: &[0x01],
            },
        },
    );
    assert_eq!(micros(&h.drain()), vec![(0, 1, 100), (FLAG_ASK, 2, 50)]);
}

/// The flows whose BSYNs are in `out`.
fn bsyn_flows(out: &[Outgoing]) -> BTreeSet<u32> {
    bsyn_headers(out).map(|h| h.flow_id).collect()
}

/// Source 1 with three one-micro-block flows to 3 through next hop 2: two are in progress
/// at once and the third starts when the next hop has taken one of them whole; the paper's
/// scheduler sends all three at once.
#[test]
fn micro_blocks_to_one_next_hop_take_turns_two_at_a_time() {
    for (rounds, first) in [(true, vec![1, 2]), (false, vec![1, 2, 3])] {
        let cfg = HopConfig {
            micro_block_threshold: 1000,
            round_per_next_hop: rounds,
            ..small_cfg()
        };
        let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
        for id in 1..=3 {
            let key = FlowKey { src: 1, id };
            h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
            h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![id as u8; 250])))
                .unwrap();
            h.with(|t, ctx| t.finish(ctx, key)).unwrap();
        }
        let out = h.drain();
        assert_eq!(
            bsyn_flows(&out),
            first.into_iter().collect(),
            "rounds {rounds}"
        );
        if !rounds {
            continue;
        }
        let back = whole_back(HopHeader {
            src: 1,
            flow_id: 1,
            ..hdr(0, FLAG_COMPLETE)
        });
        h.recv(2, &back);
        assert_eq!(bsyn_flows(&h.drain()), [3].into_iter().collect());
    }
}
