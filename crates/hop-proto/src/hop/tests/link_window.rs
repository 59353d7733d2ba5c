//! Extension: the link window.

use super::*;

#[test]
fn link_window_bounds_packets_not_known_to_have_left() {
    let cfg = HopConfig {
        link_window_packets: 4,
        ..small_cfg()
    };
    let (mut h, out) = source_round(cfg);
    // Four packets fill the window; the BSYN announces them and its BACK opens the window.
    assert_eq!(data_nums(&out), vec![0, 1, 2, 3]);
    assert_eq!(bsyn_blocks(&out), vec![0]);
    assert!(h.drain().is_empty());
    h.recv(2, &source_back(&[0x0f, 0]));
    let out = h.drain();
    assert_eq!(data_nums(&out), vec![4, 5, 6, 7]);
    assert_eq!(bsyn_blocks(&out), vec![0]);
    // Two of them arrived (6 and 7 did not yet): two more packets may go.
    h.recv(2, &source_back(&[0x3f, 0]));
    assert_eq!(data_nums(&h.drain()), vec![8, 9]);
}

/// The link window seen after each BACK while a source moves one 600-packet block over a
/// link that carries `capacity` packets per second: each BSYN is answered `base` plus the
/// time the link takes for the packets sent before it, and the BACK reports them all held.
fn windows_over_rounds(base: Duration, capacity: f64) -> Vec<usize> {
    let cfg = HopConfig {
        link_window_packets: 4,
        link_window_max_packets: 64,
        link_queue_target: Duration::from_millis(50),
        ..small_cfg()
    };
    let mut h = Harness::new(1, &[(3, 2), (2, 2)], HopTransport::new(cfg));
    let key = FlowKey { src: 1, id: 4 };
    h.with(|t, ctx| t.open(ctx, key, 3)).unwrap();
    h.with(|t, ctx| t.send(ctx, key, Bytes::from(vec![1u8; 60_000])))
        .unwrap();
    let mut held = vec![0u8; 75];
    let mut windows = Vec::new();
    for _ in 0..2_000 {
        let sent = data_nums(&h.drain());
        for p in &sent {
            held[usize::from(p / 8)] |= 1 << (p % 8);
        }
        if held.iter().all(|b| *b == 0xff) {
            break;
        }
        h.now = h.now + base + Duration::from_secs_f64(sent.len() as f64 / capacity);
        h.recv(
            2,
            &HopMessage {
                header: HopHeader {
                    src: 1,
                    flow_id: 4,
                    ..hdr(0, 0)
                },
                body: HopBody::Back {
                    ctl: ControlSeq::default(),
                    duplicates: 0,
                    block_hint_kib: 0,
                    block_len: 60_000,
                    packets: 600,
                    bitmap: &held,
                },
            },
        );
        windows.push(h.t.link_window());
    }
    assert!(held.iter().all(|b| *b == 0xff), "the block was not moved");
    windows
}

#[test]
fn link_window_grows_to_the_queue_target_on_a_fast_link_only() {
    let ms = Duration::from_millis;
    // 100 000 packets/s, 1 ms per round: 4 packets per round to start with; the window grows
    // to its ceiling (5 000 packets in 50 ms).
    let fast = windows_over_rounds(ms(1), 100_000.0);
    assert_eq!(fast.iter().max(), Some(&64));
    assert!(fast.iter().all(|w| (4..=64).contains(w)));
    // 400 packets/s: the window settles near the 20 packets the link carries in 50 ms.
    let medium = windows_over_rounds(ms(1), 400.0);
    let settled = &medium[medium.len() / 2..];
    assert!(settled.iter().all(|w| (17..=21).contains(w)), "{medium:?}");
    // 60 packets/s (3 in 50 ms): the window stays at its floor.
    let slow = windows_over_rounds(ms(1), 60.0);
    assert!(slow.iter().all(|w| *w == 4), "{slow:?}");
    // A fixed window when the ceiling is not above the floor.
    let (h, _) = source_round(HopConfig {
        link_window_packets: 4,
        link_window_max_packets: 4,
        ..small_cfg()
    });
    assert_eq!(h.t.link_window(), 4);
}

#[test]
fn a_full_window_takes_no_packet_of_another_transfer() {
    let mut h = two_flow_source_with(small_cfg());
    // Flow 4's next hop answers: its packets fill the window.
    h.recv(2, &source_back(&[0, 0]));
    let out = h.drain();
    assert_eq!(data_nums(&out).len(), 8);
    assert_eq!(h.t.link_window(), 8);
    // Flow 5's next hop answers while the window is full of flow 4's packets: nothing of
    // flow 5 goes until flow 4's BACK opens the window.
    let mut back = source_back(&[0, 0]);
    back.header.flow_id = 5;
    back.header.dst = 5;
    h.recv(4, &back);
    let to4 = h
        .drain()
        .iter()
        .filter(|o| o.next_hop == 4)
        .filter(|o| {
            matches!(
                HopMessage::parse(o.message()).unwrap().body,
                HopBody::Data { .. }
            )
        })
        .count();
    assert_eq!(to4, 0);
}

/// Packets handed to the link before one that arrived have left this node's FIFO queue,
/// whichever transfer they belong to: they no longer fill the link window, even while
/// their own next hop has not answered.
#[test]
fn packets_known_to_have_left_the_queue_free_the_window_for_every_transfer() {
    for queue_aware in [true, false] {
        let mut h = two_flow_source_with(HopConfig {
            queue_aware,
            ..small_cfg()
        });
        // Both next hops answer at once: the two transfers share the window a txop at a
        // time, four packets each.
        let mut back5 = source_back(&[0, 0]);
        back5.header.flow_id = 5;
        back5.header.dst = 5;
        h.recv(2, &source_back(&[0, 0]));
        h.recv(4, &back5);
        let out = h.drain();
        let to = |out: &[Outgoing], hop| {
            out.iter()
                .filter(|o| o.next_hop == hop)
                .filter(|o| {
                    matches!(
                        HopMessage::parse(o.message()).unwrap().body,
                        HopBody::Data { .. }
                    )
                })
                .count()
        };
        assert_eq!((to(&out, 2), to(&out, 4)), (4, 4));
        // Node 4 reports all four of flow 5's packets, the last one handed to the link:
        // flow 4's were handed over before it and have left the queue too.
        let mut back5 = source_back(&[0x0f, 0]);
        back5.header.flow_id = 5;
        back5.header.dst = 5;
        h.recv(4, &back5);
        let out = h.drain();
        // The rest of flow 5's block (6 packets) fits; counting flow 4's packets as still
        // queued would leave room for 4.
        assert_eq!(
            to(&out, 4),
            if queue_aware { 6 } else { 4 },
            "queue_aware = {queue_aware}"
        );
    }
}
