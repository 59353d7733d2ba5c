//! Rounds behind their data (an extension, rounds_behind.rs): a BSYN marked `BEHIND` is
//! answered at once and what its BACK lacks is lost; `END_HEARD` tells the sender its BSYN
//! came behind the round's end; a sender marks its BSYNs once it has learnt so.

use super::*;

/// A receiver that waits for data to pause (`back_quiet`) before a BACK that would report
/// packets missing.
fn quiet_cfg() -> HopConfig {
    HopConfig {
        back_quiet: Duration::from_millis(10),
        ..small_cfg()
    }
}

/// A 1000-byte block's BSYN from node 1 naming round end `end` (packet number) and
/// announcing `expect` packets.
fn round_bsyn(flags: u8, end: u16, expect: u16) -> HopMessage<'static> {
    let mut m = bsyn_with_expect(0, 1000, expect);
    m.header.flags |= flags;
    if let HopBody::Bsyn { packet_num, .. } = &mut m.body {
        *packet_num = end + 1;
    }
    m
}

fn deliver(h: &mut Harness, packets: &[u16]) {
    let data = [7u8; 100];
    for &p in packets {
        h.recv(1, &data_packet(0, 1000, p, &data));
    }
}

#[test]
fn a_receiver_answers_a_bsyn_behind_its_data_at_once() {
    // Packets 0-4 sent, 4 (the round's end) lost.
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(quiet_cfg()));
    deliver(&mut h, &[0, 1, 2, 3]);
    h.recv(1, &round_bsyn(0, 4, 5));
    assert!(
        backs_to(&h.drain(), 1).is_empty(),
        "unmarked: waits for data still queued"
    );
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(quiet_cfg()));
    deliver(&mut h, &[0, 1, 2, 3]);
    h.recv(1, &round_bsyn(FLAG_BEHIND, 4, 5));
    let backs = backs_to(&h.drain(), 1);
    assert_eq!(backs.len(), 1, "marked: answered at once");
    assert_eq!(backs[0].0 & FLAG_END_HEARD, 0, "its round end had not come");
}

#[test]
fn a_back_says_when_the_rounds_end_had_arrived_before_its_bsyn() {
    // Packets 0-4 sent, 3 lost, the round's end (4) here before the BSYN: answered at once
    // (round end, FIFO), with END_HEARD.
    let mut h = Harness::new(2, &[(3, 3), (1, 1)], HopTransport::new(quiet_cfg()));
    deliver(&mut h, &[0, 1, 2, 4]);
    h.recv(1, &round_bsyn(0, 4, 5));
    let backs = backs_to(&h.drain(), 1);
    assert_eq!(backs.len(), 1);
    assert_ne!(backs[0].0 & FLAG_END_HEARD, 0);
}

/// The BSYNs in `out` and whether each is marked `BEHIND`.
fn bsyn_behind(out: &[Outgoing]) -> Vec<bool> {
    out.iter()
        .filter_map(|o| match HopMessage::parse(o.message()).ok()? {
            HopMessage {
                header,
                body: HopBody::Bsyn { .. },
            } => Some(header.flags & FLAG_BEHIND != 0),
            _ => None,
        })
        .collect()
}

/// `source_round`'s source after it has learnt that its BSYNs reach node 2 behind their
/// data (a streak of rounds whose end came first): the harness and its first round.
fn learnt_source_round(cfg: HopConfig) -> (Harness, Vec<Outgoing>) {
    source_round_with(cfg, |t| {
        for _ in 0..BEHIND_STREAK {
            t.round_order.learn(&t.cfg, 2, true, false);
        }
    })
}

#[test]
fn a_sender_that_has_learnt_its_order_marks_its_bsyns_and_takes_the_missing_tail_as_lost() {
    // Packets 0-7 of the ten arrived, 8 and 9 (the tail) did not.
    let tail_missing = [0xff, 0x00];
    // Unlearnt: the tail may still be queued here, nothing is sent again yet.
    let (mut h, out) = source_round(small_cfg());
    assert_eq!(bsyn_behind(&out), vec![false]);
    h.recv(2, &source_back(&tail_missing));
    assert!(data_nums(&h.drain()).is_empty());
    // Learnt (a streak of rounds whose end came before the BSYN): the round's BSYN is
    // marked, and the tail its BACK lacks is sent again at once.
    let (mut h, out) = learnt_source_round(small_cfg());
    assert_eq!(bsyn_behind(&out), vec![true]);
    h.recv(2, &source_back(&tail_missing));
    let out = h.drain();
    assert_eq!(data_nums(&out), vec![8, 9]);
    // The next hop reports duplicates (a packet taken for lost was only late): the next
    // round's BSYN is not marked.
    let mut back = source_back(&tail_missing);
    if let HopBody::Back { duplicates, .. } = &mut back.body {
        *duplicates = 1;
    }
    h.recv(2, &back);
    h.drain();
    assert!(!h.t.round_order.behind(&h.t.cfg, 2));
}

#[test]
fn off_bsyns_are_never_marked() {
    let cfg = HopConfig {
        rounds_behind: false,
        ..small_cfg()
    };
    let (_, out) = learnt_source_round(cfg);
    assert_eq!(bsyn_behind(&out), vec![false]);
}
