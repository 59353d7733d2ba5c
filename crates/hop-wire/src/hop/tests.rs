//! Round trips, bounds and malformed input of the Hop messages.

use super::*;
use proptest::prelude::*;

fn header(flags: u8) -> HopHeader {
    HopHeader {
        priority: 0,
        flags,
        ttl: 7,
        src: 1,
        flow_id: 0xdead_beef,
        dst: 9,
        block_num: 3,
    }
}

fn round_trip(msg: HopMessage<'_>) {
    let mut out = Vec::new();
    msg.emit(&mut out).unwrap();
    assert_eq!(out.len(), msg.encoded_len());
    let back = HopMessage::parse(&out).unwrap();
    assert_eq!(back, msg);
}

#[test]
fn a_flows_class_travels_in_byte_three_and_only_known_classes_parse() {
    for p in [PRIORITY_NORMAL, PRIORITY_BULK, PRIORITY_EXPEDITED] {
        let msg = HopMessage {
            header: HopHeader {
                priority: p,
                ..header(0)
            },
            body: HopBody::E2eBack { cum_blocks: 4 },
        };
        let mut out = Vec::new();
        msg.emit(&mut out).unwrap();
        assert_eq!(out[3], p);
        round_trip(msg);
    }
    let mut out = Vec::new();
    HopMessage {
        header: header(0),
        body: HopBody::E2eBack { cum_blocks: 4 },
    }
    .emit(&mut out)
    .unwrap();
    out[3] = 3;
    assert!(matches!(
        HopMessage::parse(&out),
        Err(Error::ReservedBits(_))
    ));
    let bad = HopMessage {
        header: HopHeader {
            priority: 3,
            ..header(0)
        },
        body: HopBody::E2eBack { cum_blocks: 4 },
    };
    assert!(bad.emit(&mut Vec::new()).is_err());
    assert!(priority_rank(PRIORITY_BULK) < priority_rank(PRIORITY_NORMAL));
    assert!(priority_rank(PRIORITY_NORMAL) < priority_rank(PRIORITY_EXPEDITED));
}

#[test]
fn data_payload_must_match_geometry() {
    let geom = BlockGeom {
        block_len: 2500,
        packet_size: 1000,
    };
    let payload = vec![1u8; 500];
    round_trip(HopMessage {
        header: header(0),
        body: HopBody::Data {
            offset: 0,
            geom,
            packet_num: 2,
            payload: &payload,
        },
    });
    let mut out = Vec::new();
    HopMessage {
        header: header(0),
        body: HopBody::Data {
            offset: 0,
            geom,
            packet_num: 1,
            payload: &payload,
        },
    }
    .emit(&mut out)
    .unwrap();
    assert!(matches!(
        HopMessage::parse(&out),
        Err(Error::Malformed {
            field: "payload_len",
            ..
        })
    ));
}

#[test]
fn back_rejects_stray_bits() {
    let bitmap = [0xffu8, 0x07];
    let msg = HopMessage {
        header: header(0),
        body: HopBody::Back {
            block_len: 11_000,
            packets: 11,
            duplicates: 3,
            block_hint_kib: 256,
            ctl: ControlSeq {
                seq: 7,
                echo: 65_535,
                loss: 30,
            },
            bitmap: &bitmap,
        },
    };
    round_trip(msg);
    let mut out = Vec::new();
    msg.emit(&mut out).unwrap();
    *out.last_mut().unwrap() = 0xff;
    assert!(HopMessage::parse(&out).is_err());
}

#[test]
fn bsyn_expect_and_round_end_bounded_by_block() {
    let geom = BlockGeom {
        block_len: 2500,
        packet_size: 1000,
    };
    let msg = |expect, packet_num| HopMessage {
        header: header(0),
        body: HopBody::Bsyn {
            offset: 0,
            geom,
            packet_num,
            expect,
            ctl: ControlSeq::default(),
            payload: &[],
        },
    };
    // Three packets: `expect` up to 3, the round end up to 3 (1 + packet 2, the last).
    round_trip(msg(3, 3));
    for (bad, field, at) in [(msg(4, 0), "expect", 39), (msg(0, 4), "packet_num", 35)] {
        let mut out = Vec::new();
        assert!(bad.emit(&mut out).is_err());
        assert!(out.is_empty());
        msg(3, 3).emit(&mut out).unwrap();
        // expect at offset 38, the round end at 34; one more than the packets is malformed.
        assert_eq!(out[at], 3);
        out[at] = 4;
        assert!(
            matches!(HopMessage::parse(&out), Err(Error::Malformed { field: f, .. }) if f == field)
        );
    }
}

#[test]
fn control_fields_are_filled_in_place_in_bsyns_and_backs_only() {
    let ctl = ControlSeq {
        seq: 513,
        echo: 2,
        loss: 77,
    };
    let geom = BlockGeom {
        block_len: 2500,
        packet_size: 1000,
    };
    let bitmap = [0x05u8];
    for body in [
        HopBody::Bsyn {
            offset: 9,
            geom,
            packet_num: 3,
            expect: 2,
            ctl: ControlSeq::default(),
            payload: &[],
        },
        HopBody::Back {
            block_len: 2500,
            packets: 3,
            duplicates: 1,
            block_hint_kib: 4,
            ctl: ControlSeq::default(),
            bitmap: &bitmap,
        },
    ] {
        let mut out = Vec::new();
        HopMessage {
            header: header(0),
            body,
        }
        .emit(&mut out)
        .unwrap();
        assert!(set_control_seq(&mut out, ctl));
        let expected = match body {
            HopBody::Bsyn { .. } => HopBody::Bsyn {
                offset: 9,
                geom,
                packet_num: 3,
                expect: 2,
                ctl,
                payload: &[],
            },
            _ => HopBody::Back {
                block_len: 2500,
                packets: 3,
                duplicates: 1,
                block_hint_kib: 4,
                ctl,
                bitmap: &bitmap,
            },
        };
        assert_eq!(HopMessage::parse(&out).unwrap().body, expected);
    }
    let mut out = Vec::new();
    HopMessage {
        header: header(0),
        body: HopBody::E2eBack { cum_blocks: 4 },
    }
    .emit(&mut out)
    .unwrap();
    let before = out.clone();
    assert!(!set_control_seq(&mut out, ctl));
    assert_eq!(out, before);
    assert!(!set_control_seq(&mut [2u8; 10], ctl), "truncated");
}

#[test]
fn unknown_type_and_truncation() {
    assert_eq!(
        HopMessage::parse(&[9; 20]),
        Err(Error::UnknownMessageType(9))
    );
    assert!(matches!(
        HopMessage::parse(&[1; 5]),
        Err(Error::Truncated { .. })
    ));
}

fn arb_geom() -> impl Strategy<Value = (BlockGeom, u16)> {
    (1u16..1500, 1u32..200_000).prop_flat_map(|(ps, len)| {
        let len = len.min(u32::from(ps) * MAX_PACKETS_PER_BLOCK);
        let geom = BlockGeom {
            block_len: len,
            packet_size: ps,
        };
        let n = geom.packets();
        (Just(geom), 0..n as u16)
    })
}

proptest! {
    #[test]
    fn data_round_trip((geom, pn) in arb_geom(), flags in 0u8..0x40, ttl: u8, src: u32, id: u32, dst: u32, bn: u32) {
        let r = geom.packet_range(u32::from(pn)).unwrap();
        let payload: Vec<u8> = (0..r.len()).map(|i| i as u8).collect();
        round_trip(HopMessage {
            header: HopHeader { priority: 0, flags, ttl, src, flow_id: id, dst, block_num: bn },
            body: HopBody::Data { offset: u64::from(bn) * 7, geom, packet_num: pn, payload: &payload },
        });
    }

    #[test]
    fn bsyn_round_trip((geom, pn) in arb_geom(), micro: bool, vtx: bool, offset: u64, ttl: u8, bn: u32, exp: u16, seq: u16, echo: u16, loss: u8) {
        let expect = (u32::from(exp) % (geom.packets() + 1)) as u16;
        let flags = if micro { FLAG_MICRO } else { 0 } | if vtx { FLAG_VTX } else { 0 };
        let payload: Vec<u8> = if micro {
            vec![0xa5; geom.packet_range(u32::from(pn)).unwrap().len()]
        } else {
            Vec::new()
        };
        round_trip(HopMessage {
            header: HopHeader { priority: 0, flags, ttl, src: 4, flow_id: 5, dst: 6, block_num: bn },
            body: HopBody::Bsyn { offset, geom, packet_num: if micro { pn } else { pn + 1 }, expect, ctl: ControlSeq { seq, echo, loss }, payload: &payload },
        });
    }

    #[test]
    fn back_round_trip(bits in proptest::collection::vec(any::<bool>(), 0..2000), block_len: u32, duplicates: u16, block_hint_kib: u16, flags in 0u8..0x40, seq: u16, echo: u16, loss: u8) {
        let packets = bits.len() as u16;
        let mut bitmap = vec![0u8; bits.len().div_ceil(8)];
        for (i, b) in bits.iter().enumerate() {
            if *b { bitmap[i / 8] |= 1 << (i % 8); }
        }
        round_trip(HopMessage {
            header: header(flags),
            body: HopBody::Back { block_len, packets, duplicates, block_hint_kib, ctl: ControlSeq { seq, echo, loss }, bitmap: &bitmap },
        });
    }

    #[test]
    fn e2e_back_and_fin_round_trip(cum: u32, total: u64, flags in 0u8..0x40) {
        round_trip(HopMessage { header: header(flags), body: HopBody::E2eBack { cum_blocks: cum } });
        round_trip(HopMessage { header: header(flags), body: HopBody::Fin { total_bytes: total } });
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..3000)) {
        if let Ok(msg) = HopMessage::parse(&bytes) {
            // Whatever parses re-encodes to the same bytes.
            let mut out = Vec::new();
            msg.emit(&mut out).unwrap();
            prop_assert_eq!(out, bytes);
        }
    }

    #[test]
    fn mutated_messages_never_panic(pos in 0usize..60, val: u8, cut in 0usize..60) {
        let payload = [3u8; 17];
        let msg = HopMessage {
            header: header(FLAG_MICRO),
            body: HopBody::Bsyn { offset: 5, geom: BlockGeom { block_len: 17, packet_size: 1380 }, packet_num: 0, expect: 1, ctl: ControlSeq::default(), payload: &payload },
        };
        let mut out = Vec::new();
        msg.emit(&mut out).unwrap();
        if pos < out.len() { out[pos] = val; }
        out.truncate(cut.max(1).min(out.len()));
        let _ = HopMessage::parse(&out);
    }
}
