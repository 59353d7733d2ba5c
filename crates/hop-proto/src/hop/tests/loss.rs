//! Extension: queue-aware loss inference (the FIFO rule and the tail rule).

use super::*;

#[test]
fn packets_sent_before_one_that_arrived_are_lost_at_once() {
    let (mut h, out) = source_round(small_cfg());
    assert_eq!(data_nums(&out).len(), 10);
    // Packets 0 and 4 missing, 9 held: the link's data queue is FIFO, so both are lost.
    h.recv(2, &source_back(&[0xee, 0x03]));
    assert_eq!(data_nums(&h.drain()), vec![0, 4]);
    assert_eq!(h.t.stats().data_retransmissions, 2);
}

#[test]
fn a_copy_of_a_packet_known_lost_is_evidence_when_it_arrives() {
    let (mut h, _) = source_round(small_cfg());
    // 0 and 4 lost (9 arrived after them) and sent again, 0 first: their earlier copies
    // have left the FIFO queue, so these copies are the only ones in flight.
    h.recv(2, &source_back(&[0xee, 0x03]));
    assert_eq!(data_nums(&h.drain()), vec![0, 4]);
    // 4's new copy arrived and 0's, handed to the link before it, did not: 0 is lost again.
    h.recv(2, &source_back(&[0xfe, 0x03]));
    assert_eq!(data_nums(&h.drain()), vec![0]);
    assert_eq!(h.t.stats().data_retransmissions, 3);
}

#[test]
fn paper_mode_resends_everything_a_back_reports_missing() {
    let cfg = HopConfig {
        queue_aware: false,
        link_window_packets: 0,
        ..small_cfg()
    };
    let (mut h, out) = source_round(cfg);
    assert_eq!(data_nums(&out).len(), 10);
    h.recv(2, &source_back(&[0xff, 0]));
    assert_eq!(data_nums(&h.drain()), vec![8, 9]);
}

/// A relay whose queue drains more slowly than the delivery delay it measured: the tail rule
/// gives up packets that are still queued, and they leave the link window at once, so a
/// second window's worth goes into the same queue (docs/design/hop.md#tail-loss-rule says
/// why packets given up are not held in the window).
#[test]
fn packets_given_up_by_the_tail_rule_are_sent_again() {
    let mut h = two_flow_source_with(small_cfg());
    // A second into the source's life (the tail rule measures stalls from the first BACK,
    // which must not come at time zero).
    h.now += Duration::from_secs(1);
    h.recv(2, &source_back(&[0, 0]));
    assert_eq!(data_nums(&h.drain()).len(), 8);
    // 300 ms later the next hop still has none of them: older than the tail rule's age (the
    // BSYN timeout while no delivery delay is measured), all eight are given up and sent
    // again.
    h.now += Duration::from_millis(300);
    h.recv(2, &source_back(&[0, 0]));
    assert_eq!(data_nums(&h.drain()).len(), 8);
    assert_eq!(h.t.link_window(), 8);
}

/// Duplicates reported by the next hop show that the tail rule gave up packets that were
/// only queued: the loss age grows by one delivery delay, so the wait that gave packets up
/// before no longer does, and a longer one still does. Without `duplicate_feedback` the age
/// stays at twice the delivery delay.
#[test]
fn duplicates_reported_by_the_next_hop_lengthen_the_tail_rules_loss_age() {
    for feedback in [true, false] {
        let (mut h, out) = source_round(HopConfig {
            duplicate_feedback: feedback,
            ..small_cfg()
        });
        assert_eq!(data_nums(&out).len(), 10);
        let resent = |h: &Harness| h.t.stats().data_retransmissions;
        // 50 ms on, the next hop holds packets 0 and 1 (a delivery delay of 50 ms: the loss
        // age is 100 ms) and reports two copies it got twice.
        h.now += Duration::from_millis(50);
        let mut back = source_back(&[0x03, 0]);
        if let HopBody::Back {
            duplicates,
            block_hint_kib: 0,
            ..
        } = &mut back.body
        {
            *duplicates = 2;
        }
        h.recv(2, &back);
        h.drain();
        assert_eq!(resent(&h), 0);
        // 120 ms later nothing more has arrived: the eight others are 170 ms old and the
        // transfer has stalled for 120 ms, past a loss age of 100 ms but not of 150 ms.
        h.now += Duration::from_millis(120);
        h.recv(2, &source_back(&[0x03, 0]));
        h.drain();
        let after = resent(&h);
        assert_eq!(after, if feedback { 0 } else { 8 }, "feedback = {feedback}");
        if feedback {
            // 40 ms more: past the longer age too. The transfer asks again when its oldest
            // packet is due (its timer), and the answer still shows nothing new.
            h.now += Duration::from_millis(40);
            h.with(|t, ctx| t.handle_timeout(ctx));
            h.drain();
            h.recv(2, &source_back(&[0x03, 0]));
            h.drain();
            assert_eq!(resent(&h), 8);
        }
    }
}

/// The answer to a repeated BSYN is no delivery-delay sample (Karn's rule): the packets it
/// reports arrived before the first BSYN's BACK was lost, a timer's wait earlier. Counted,
/// the delay (which rises at once) would become that wait, and with it the BSYN timer's floor
/// and the tail's loss age.
#[test]
fn the_answer_to_a_repeated_bsyn_is_no_delivery_delay_sample() {
    let (mut h, out) = source_round(HopConfig {
        back_quiet: Duration::from_millis(10),
        ..small_cfg()
    });
    assert_eq!(data_nums(&out).len(), 10);
    // 1 ms on, packets 0-4 are there: the BSYN followed them at once, a 1 ms sample.
    h.now += Duration::from_millis(1);
    h.recv(2, &source_back(&[0x1f, 0]));
    h.drain();
    let one_ms = Some(Duration::from_millis(1));
    assert_eq!(h.t.link_queue.delivery_delay, one_ms);
    // The BACK of the round's next BSYN is lost; the timer repeats the BSYN.
    h.now += Duration::from_millis(5);
    h.with(|t, ctx| t.handle_timeout(ctx));
    assert!(h.drain().iter().any(|o| o.class == Class::Control));
    // Its answer shows the other five, handed to the link 6 ms ago.
    h.now += Duration::from_micros(100);
    h.recv(2, &source_back(&[0xff, 0x03]));
    assert_eq!(h.t.link_queue.delivery_delay, one_ms);
}
