//! Control copies (an extension, control_copies.rs): numbered BSYNs and BACKs, the loss of
//! them reported back, copies where it is high, and a BACK that names the BSYNs it follows.

use super::*;

fn copies_cfg() -> HopConfig {
    HopConfig {
        control_copies: ControlCopies::On,
        ..small_cfg()
    }
}

/// The control fields and flags of each BSYN in `out`.
fn bsyn_ctls(out: &[Outgoing]) -> Vec<(ControlSeq, u8)> {
    out.iter()
        .filter_map(|o| match HopMessage::parse(o.message()).ok()? {
            HopMessage {
                header,
                body: HopBody::Bsyn { ctl, .. },
            } => Some((ctl, header.flags)),
            _ => None,
        })
        .collect()
}

/// The control fields of each BACK to `to`.
fn back_ctls(out: &[Outgoing], to: NodeId) -> Vec<ControlSeq> {
    out.iter()
        .filter(|o| o.next_hop == to)
        .filter_map(|o| match HopMessage::parse(o.message()).ok()?.body {
            HopBody::Back { ctl, .. } => Some(ctl),
            _ => None,
        })
        .collect()
}

fn with_ctl(mut m: HopMessage<'_>, seq: u16, echo: u16, loss: u8) -> HopMessage<'_> {
    match &mut m.body {
        HopBody::Bsyn { ctl, .. } | HopBody::Back { ctl, .. } => {
            *ctl = ControlSeq { seq, echo, loss }
        }
        _ => {}
    }
    m
}

#[test]
fn a_back_that_heard_none_of_the_rounds_bsyns_is_news_not_the_answer() {
    let (mut h, out) = source_round(small_cfg());
    let round = bsyn_ctls(&out);
    assert_eq!(round.len(), 1, "the round ends with one BSYN");
    let seq = round[0].0.seq;
    assert!(seq > 1, "the block's first BSYN came before it");
    // Packet 0 missing, 1-9 held: packet 0 was handed to the link before packets that
    // arrived, so the round's answer sends it again at once.
    let bitmap = [0xfe, 0x03];
    // A BACK sent before the next hop heard this round's BSYN (a copy or a late BACK of the
    // round before): its packets are taken, nothing is sent again, the BSYN still waits.
    h.recv(2, &with_ctl(source_back(&bitmap), 3, seq - 1, 0));
    assert!(data_nums(&h.drain()).is_empty());
    assert_eq!(h.t.stats.extra.get("backs_before_round"), Some(&1));
    // The answer: it heard the round's BSYN.
    h.recv(2, &with_ctl(source_back(&bitmap), 4, seq, 0));
    assert_eq!(data_nums(&h.drain()), vec![0]);
}

#[test]
fn where_the_next_hop_reports_control_loss_bsyns_go_twice_or_three_times() {
    for (cfg, loss, copies) in [
        // None reported lost, but the report rests on the one BSYN of ours the next hop
        // has heard: still twice (control_copies.rs, `KNOWN_AFTER`).
        (copies_cfg(), 0, 2),
        (copies_cfg(), 30, 2),
        (copies_cfg(), 60, 3),
        (small_cfg(), 60, 1),
    ] {
        let (mut h, out) = source_round(cfg);
        let seq = bsyn_ctls(&out)[0].0.seq;
        // The next hop answers the round (packet 0 lost) and reports `loss` of our control
        // datagrams lost: packet 0 goes again, and the BSYN after it `copies` times.
        h.recv(2, &with_ctl(source_back(&[0xfe, 0x03]), 1, seq, loss));
        let out = h.drain();
        assert_eq!(data_nums(&out), vec![0]);
        let sent = bsyn_ctls(&out);
        assert_eq!(sent.len(), copies, "reported loss {loss}: {sent:?}");
        for (i, (ctl, flags)) in sent.iter().enumerate() {
            assert_eq!(
                ctl.seq,
                sent[0].0.seq + i as u16,
                "each copy has its own number"
            );
            assert_eq!(flags & FLAG_COPY != 0, i > 0, "only the copies say so");
        }
    }
}

#[test]
fn a_receiver_answers_once_per_bsyn_and_reports_the_numbers_it_missed() {
    let mut h = Harness::new(2, &[(1, 1)], HopTransport::new(copies_cfg()));
    h.recv(1, &with_ctl(bsyn_from(1, 1), 5, 0, 0));
    let backs = back_ctls(&h.drain(), 1);
    // Twice: node 1's loss is not known yet (one of its datagrams heard, its report resting
    // on none of ours).
    assert_eq!(backs.len(), 2);
    assert!(
        backs.iter().all(|b| b.echo == 5),
        "the BACK names the BSYN it heard"
    );
    assert_eq!((backs[0].seq, backs[1].seq), (1, 2));
    // A copy of a BSYN that arrived is not answered again.
    let mut copy = with_ctl(bsyn_from(1, 1), 6, 0, 0);
    copy.header.flags |= FLAG_COPY;
    h.recv(1, &copy);
    assert!(back_ctls(&h.drain(), 1).is_empty());
    assert_eq!(h.t.stats.extra.get("control_copies_dropped"), Some(&1));
    // A copy whose original (7) was lost stands for it.
    let mut copy = with_ctl(bsyn_from(1, 1), 8, 0, 0);
    copy.header.flags |= FLAG_COPY;
    h.recv(1, &copy);
    assert!(!back_ctls(&h.drain(), 1).is_empty());
    // Every other BSYN lost from here on: the BACKs report about half of them lost, and go
    // three times, by this node's own measure of node 1's datagrams, though node 1 reports
    // none of ours lost.
    let mut last = Vec::new();
    for k in 0..100u16 {
        h.recv(1, &with_ctl(bsyn_from(1, 1), 10 + 2 * k, 100, 0));
        let backs = back_ctls(&h.drain(), 1);
        if !backs.is_empty() {
            last = backs;
        }
    }
    assert_eq!(last.len(), 3, "{last:?}");
    let last = last[0];
    assert!((100..=160).contains(&last.loss), "{last:?}");
    // Operators see it per neighbour, each way (node 1 reported none of ours lost).
    let report = h.t.neighbour_reports().into_iter().find(|r| r.id == 1);
    let loss = report.and_then(|r| r.control_loss).expect("a report");
    assert!((0.39..=0.63).contains(&loss.from), "{loss:?}");
    assert_eq!(loss.to, 0.0);
}

/// The flags of the end-to-end BACKs to `to` in `out`.
fn e2e_flags_to(out: &[Outgoing], to: NodeId) -> Vec<u8> {
    out.iter()
        .filter(|o| o.next_hop == to)
        .filter_map(|o| match HopMessage::parse(o.message()).ok()? {
            HopMessage {
                header,
                body: HopBody::E2eBack { .. },
            } => Some(header.flags),
            _ => None,
        })
        .collect()
}

/// The end-to-end BACK with `flags` for `FLOW`'s block 0, all of it delivered.
fn fin_back(flags: u8) -> HopMessage<'static> {
    HopMessage {
        header: hdr(0, flags),
        body: HopBody::E2eBack { cum_blocks: 1 },
    }
}

/// Relay 2 between source 1 and destination 3, holding the flow's last block; node 1
/// reports `loss` of node 2's control datagrams lost.
fn relay_with_last_block(cfg: HopConfig, loss: u8) -> Harness {
    let mut h = Harness::new(2, &[(1, 1), (3, 3)], HopTransport::new(cfg));
    feed_block_flags(&mut h, 0, FLAG_FIN, &[7u8; 250]);
    h.recv(1, &with_ctl(bsyn_msg(hdr(0, FLAG_FIN), 250), 1, 0, loss));
    h.drain();
    h
}

#[test]
fn the_end_to_end_back_that_finishes_a_flow_goes_as_often_as_a_bsyn_and_is_passed_on_once() {
    // At least twice where copies are on, even with no loss reported yet (a short flow ends
    // before a report can grow); as often as a BSYN where more is reported.
    for (loss, copies) in [(0, 2), (8, 2), (60, 3)] {
        let mut h = relay_with_last_block(copies_cfg(), loss);
        // The destination's end-to-end BACK: passed on `copies` times, the copies marked.
        h.recv(3, &fin_back(FLAG_FIN));
        let sent = e2e_flags_to(&h.drain(), 1);
        assert_eq!(sent.len(), copies, "reported loss {loss}: {sent:?}");
        for (i, f) in sent.iter().enumerate() {
            assert_eq!(f & FLAG_COPY != 0, i > 0, "only the copies say so");
            assert_ne!(f & FLAG_FIN, 0);
        }
        // Its copies from the destination are not passed on again.
        h.recv(3, &fin_back(FLAG_FIN | FLAG_COPY));
        assert!(e2e_flags_to(&h.drain(), 1).is_empty());
        // The destination sending it again (asked by a probe) is passed on again.
        h.recv(3, &fin_back(FLAG_FIN));
        assert_eq!(e2e_flags_to(&h.drain(), 1).len(), copies);
    }
    // A copy that arrives where the original was lost stands for it, copied again.
    let mut h = relay_with_last_block(copies_cfg(), 60);
    h.recv(3, &fin_back(FLAG_FIN | FLAG_COPY));
    let sent = e2e_flags_to(&h.drain(), 1);
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert_eq!(sent[0] & FLAG_COPY, 0, "passed on as the relay's own");
    // Where copies are off (802.11's retried control, §4.1) it goes once.
    let mut h = relay_with_last_block(small_cfg(), 60);
    h.recv(3, &fin_back(FLAG_FIN));
    assert_eq!(e2e_flags_to(&h.drain(), 1).len(), 1);
}
