use super::config::{EPOCH, EPOCH_AGGRESSIVE, KAPPA, KAPPA_AGGRESSIVE};
use super::*;
use crate::test_support::Env;

const F: FlowKey = FlowKey { src: 1, id: 3 };

fn ms(v: f64) -> Instant {
    Instant::from_nanos((v * 1e6) as u64)
}

fn rx(from: NodeId, body: &[u8]) -> Received<'_> {
    Received {
        link_src: from,
        link_dst: 0,
        overheard: false,
        body,
        shared: None,
    }
}

fn feedback(flags: u8, cum: u32, d_avg_us: u32, hops: u8) -> Vec<u8> {
    Message::Feedback(wire::Feedback {
        flags,
        hops,
        src: F.src,
        id: F.id,
        cum,
        d_avg_us,
        blocks: Vec::new(),
    })
    .to_vec()
}

/// A sender at node 1 toward 9 via 2, past quick-start with a 10 ms probe delay.
fn running(v: AtpVariant, probe_hops: u8) -> (AtpTransport, Env) {
    let mut t = AtpTransport::new(AtpConfig::for_variant(v));
    let mut env = Env::new(&[(9, 2)], 2);
    t.open(&mut env.ctx(ms(0.0), 1), F, 9).unwrap();
    t.send(&mut env.ctx(ms(0.0), 1), F, Bytes::from(vec![1u8; 100_000]))
        .unwrap();
    let probe = t.poll_transmit(&mut env.ctx(ms(0.0), 1)).unwrap();
    let Ok(Message::Data(d)) = wire::parse(&probe.body) else {
        panic!("probe expected");
    };
    assert!(d.is_probe());
    assert_eq!(d.hops, 1, "the source counts its own transmission");
    assert!(t.poll_transmit(&mut env.ctx(ms(0.0), 1)).is_none());
    let fb = feedback(wire::FLAG_SACK_REQ, 0, 10_000, probe_hops);
    t.handle(&mut env.ctx(ms(5.0), 1), rx(2, &fb)).unwrap();
    (t, env)
}

#[test]
fn quick_start_sets_the_rate_and_adaptive_scales_by_hops() {
    let (t, _) = running(AtpVariant::Default, 4);
    assert!((t.flow_rate(F).unwrap() - 100.0).abs() < 1e-6);
    let (t, _) = running(AtpVariant::Adaptive, 4);
    // η(4) = 3.0 + 0.5 * 3 = 4.5 replaces η = 3 (§V-A3): D = 10 ms * 4.5 / 3.
    assert!((t.flow_rate(F).unwrap() - 1.0 / 0.015).abs() < 1e-6);
}

#[test]
fn increase_decrease_maintain() {
    let (mut t, mut env) = running(AtpVariant::Default, 1);
    // Feedback rate 200 > 1.1 * 100: R += 0.2 * (200 - 100) (§II-C).
    let fb = feedback(0, 0, 5_000, 1);
    t.handle(&mut env.ctx(ms(10.0), 1), rx(2, &fb)).unwrap();
    assert!((t.flow_rate(F).unwrap() - 120.0).abs() < 1e-6);
    // Feedback rate 125 is within φ of 120: maintain.
    let fb = feedback(0, 0, 8_000, 1);
    t.handle(&mut env.ctx(ms(20.0), 1), rx(2, &fb)).unwrap();
    assert!((t.flow_rate(F).unwrap() - 120.0).abs() < 1e-6);
    // Feedback rate 50 < 120: drop to it at once.
    let fb = feedback(0, 0, 20_000, 1);
    t.handle(&mut env.ctx(ms(30.0), 1), rx(2, &fb)).unwrap();
    assert!((t.flow_rate(F).unwrap() - 50.0).abs() < 1e-6);
    // The aggressive κ is 0.5.
    let (mut t, mut env) = running(AtpVariant::Aggressive, 1);
    let fb = feedback(0, 0, 5_000, 1);
    t.handle(&mut env.ctx(ms(10.0), 1), rx(2, &fb)).unwrap();
    assert!((t.flow_rate(F).unwrap() - 150.0).abs() < 1e-6);
}

#[test]
fn paces_by_withholding_packets_until_the_next_send_time() {
    let (mut t, mut env) = running(AtpVariant::Default, 1);
    // 100 packets/s: one packet now, the next 10 ms later.
    assert!(t.poll_transmit(&mut env.ctx(ms(5.0), 1)).is_some());
    assert!(t.poll_transmit(&mut env.ctx(ms(5.0), 1)).is_none());
    assert_eq!(t.poll_timeout(), Some(ms(15.0)));
    assert!(t.poll_transmit(&mut env.ctx(ms(14.0), 1)).is_none());
    t.handle_timeout(&mut env.ctx(ms(15.0), 1));
    let p = t.poll_transmit(&mut env.ctx(ms(15.0), 1)).unwrap();
    let Ok(Message::Data(d)) = wire::parse(&p.body) else {
        panic!()
    };
    assert_eq!(d.seq, 1);
    assert_eq!(
        d.d_s_us, 10_000,
        "the sending delay D_s travels in the header"
    );
}

#[test]
fn three_missed_feedbacks_restart_quick_start() {
    let (mut t, mut env) = running(AtpVariant::Default, 1);
    let e = t.cfg.feedback_interval();
    let mut now = ms(5.0);
    for _ in 0..3 {
        now += e;
        t.handle_timeout(&mut env.ctx(now, 1));
    }
    assert_eq!(t.flow_rate(F), None, "back in quick-start");
    // The next transmission is a probe.
    let p = t.poll_transmit(&mut env.ctx(now, 1)).unwrap();
    let Ok(Message::Data(d)) = wire::parse(&p.body) else {
        panic!()
    };
    assert!(d.is_probe());
}

#[test]
fn sack_holes_are_retransmitted_before_new_data() {
    let (mut t, mut env) = running(AtpVariant::Default, 1);
    let mut now = ms(5.0);
    for _ in 0..5 {
        t.handle_timeout(&mut env.ctx(now, 1));
        assert!(t.poll_transmit(&mut env.ctx(now, 1)).is_some());
        now += Duration::from_millis(10);
    }
    // Receiver holds 0, 1, 3, 4: 2 is missing. Let the retransmission guard pass.
    now += t.cfg.feedback_interval();
    let fb = Message::Feedback(wire::Feedback {
        flags: wire::FLAG_SACK_OPT,
        hops: 1,
        src: F.src,
        id: F.id,
        cum: 2,
        d_avg_us: 10_000,
        blocks: vec![(3, 5)],
    })
    .to_vec();
    t.handle(&mut env.ctx(now, 1), rx(2, &fb)).unwrap();
    t.handle_timeout(&mut env.ctx(now, 1));
    let p = t.poll_transmit(&mut env.ctx(now, 1)).unwrap();
    let Ok(Message::Data(d)) = wire::parse(&p.body) else {
        panic!()
    };
    assert_eq!(d.seq, 2);
    assert_eq!(t.stats().data_retransmissions, 1);
}

/// §II-A: the EWMAs are updated for every packet. After a busy period, packets that find
/// the link free pull `T_t` down, so the stamped delay follows the end of contention;
/// with `idle_updates_t = false` (the earlier behaviour) it stays at η times the delay
/// of the busy period however long the channel stays idle.
#[test]
fn idle_observations_relax_the_transmission_delay() {
    for idle_updates_t in [true, false] {
        let cfg = AtpConfig {
            idle_updates_t,
            ..AtpConfig::default()
        };
        let mut t = AtpTransport::new(cfg);
        let mut env = Env::new(&[(9, 6)], 2);
        let body = Message::Data(wire::Data {
            flags: 0,
            hops: 1,
            src: F.src,
            id: F.id,
            dst: 9,
            seq: 0,
            d_max_us: 0,
            d_s_us: 0,
            payload: b"x",
        })
        .to_vec();
        // Busy: ten packets queued at once, the link takes one per 5 ms.
        for _ in 0..10 {
            t.handle(&mut env.ctx(ms(0.0), 5), rx(4, &body)).unwrap();
        }
        for i in 1..=10 {
            t.poll_transmit(&mut env.ctx(ms(5.0 * f64::from(i)), 5))
                .unwrap();
        }
        let busy_t = t.t_t;
        assert!(busy_t > 0.004, "{busy_t}");
        // Idle: twenty packets, each taken by the link the moment it arrives.
        let mut last = 0;
        for i in 0..20 {
            let now = ms(100.0 + 10.0 * f64::from(i));
            t.handle(&mut env.ctx(now, 5), rx(4, &body)).unwrap();
            let o = t.poll_transmit(&mut env.ctx(now, 5)).unwrap();
            let Ok(Message::Data(d)) = wire::parse(o.message()) else {
                panic!()
            };
            last = d.d_max_us;
        }
        if idle_updates_t {
            assert!(t.t_t < busy_t / 100.0, "{} vs {busy_t}", t.t_t);
            assert!(f64::from(last) < 0.05 * 3.0 * busy_t * 1e6, "{last}");
        } else {
            assert_eq!(t.t_t, busy_t);
            assert!(f64::from(last) >= 0.99 * 3.0 * busy_t * 1e6, "{last}");
        }
    }
}

#[test]
fn relay_stamps_the_larger_delay_and_idle_uses_eta() {
    let mut t = AtpTransport::new(AtpConfig::default());
    let mut env = Env::new(&[(9, 6)], 2);
    let pkt = |d_max: u32| {
        Message::Data(wire::Data {
            flags: 0,
            hops: 1,
            src: F.src,
            id: F.id,
            dst: 9,
            seq: 0,
            d_max_us: d_max,
            d_s_us: 0,
            payload: b"x",
        })
        .to_vec()
    };
    // Three packets arrive at once; the link takes one per 2 ms.
    for _ in 0..3 {
        let b = pkt(0);
        t.handle(&mut env.ctx(ms(0.0), 5), rx(4, &b)).unwrap();
    }
    let mut stamped = Vec::new();
    for i in 0..3 {
        let now = ms(2.0 * f64::from(i) + 0.5);
        let o = t.poll_transmit(&mut env.ctx(now, 5)).unwrap();
        assert_eq!(o.next_hop, 6);
        let Ok(Message::Data(d)) = wire::parse(o.message()) else {
            panic!()
        };
        assert_eq!(d.hops, 2);
        stamped.push(d.d_max_us);
    }
    // Q and T samples: (0, 0.5), (0.5, 2), (2.5, 2) ms, averaged with α = 0.75.
    let a = 0.75;
    let (mut q, mut tt) = (0.0f64, 0.0f64);
    let mut expect = Vec::new();
    for (qs, ts) in [(0.0, 0.5), (0.5, 2.0), (2.5, 2.0)] {
        q = a * q + (1.0 - a) * qs;
        tt = a * tt + (1.0 - a) * ts;
        expect.push(((q + tt) * 1000.0).round() as u32);
    }
    assert_eq!(stamped, expect);
    // A packet already carrying a larger delay keeps it.
    let b = pkt(1_000_000);
    t.handle(&mut env.ctx(ms(10.0), 5), rx(4, &b)).unwrap();
    let o = t.poll_transmit(&mut env.ctx(ms(10.0), 5)).unwrap();
    let Ok(Message::Data(d)) = wire::parse(o.message()) else {
        panic!()
    };
    assert_eq!(d.d_max_us, 1_000_000);
    // That one found the link free at once: an idle observation, stamped with η.
    let before = t.node_delay();
    let b = pkt(0);
    t.handle(&mut env.ctx(ms(20.0), 5), rx(4, &b)).unwrap();
    let o = t.poll_transmit(&mut env.ctx(ms(20.0), 5)).unwrap();
    let Ok(Message::Data(d)) = wire::parse(o.message()) else {
        panic!()
    };
    let q_after = t.q_t;
    assert!(t.node_delay() <= before);
    assert_eq!(d.d_max_us, us_from_secs(3.0 * (q_after + t.t_t)));
}

#[test]
fn adaptive_receiver_sends_immediate_feedback() {
    let run = |v: AtpVariant| {
        let mut t = AtpTransport::new(AtpConfig::for_variant(v));
        let mut env = Env::new(&[(1, 4)], 2);
        // Ten packets whose path delay exceeds the sender's D_s (§V-A3).
        for seq in 0..10u32 {
            let b = Message::Data(wire::Data {
                flags: 0,
                hops: 3,
                src: F.src,
                id: F.id,
                dst: 9,
                seq,
                d_max_us: 5_000,
                d_s_us: 1_000,
                payload: b"x",
            })
            .to_vec();
            t.handle(&mut env.ctx(ms(f64::from(seq)), 9), rx(4, &b))
                .unwrap();
        }
        t.control.len()
    };
    assert_eq!(run(AtpVariant::Adaptive), 1);
    assert_eq!(run(AtpVariant::Aggressive), 0);
}

/// A receiver whose source still sends quick-start probes keeps the flow, however long
/// data takes; a receiver that hears nothing for `give_up` drops it.
#[test]
fn probes_keep_the_receiver_of_a_live_source() {
    for probing in [true, false] {
        let mut t = AtpTransport::new(AtpConfig::default());
        let mut env = Env::new(&[(1, 4)], 2);
        let pkt = |flags: u8, payload: &'static [u8]| {
            Message::Data(wire::Data {
                flags,
                hops: 2,
                src: F.src,
                id: F.id,
                dst: 9,
                seq: 0,
                d_max_us: 1_000,
                d_s_us: 1_000,
                payload,
            })
            .to_vec()
        };
        let b = pkt(0, b"x");
        t.handle(&mut env.ctx(ms(0.0), 9), rx(4, &b)).unwrap();
        for s in 1..=8u32 {
            let now = ms(5_000.0 * f64::from(s));
            if probing {
                let b = pkt(wire::FLAG_SACK_REQ, b"");
                t.handle(&mut env.ctx(now, 9), rx(4, &b)).unwrap();
            }
            t.handle_timeout(&mut env.ctx(now, 9));
        }
        assert_eq!(t.receivers.contains_key(&F), probing);
        assert_eq!(t.abandoned.get(&F).is_some(), !probing);
    }
}

#[test]
fn variant_parameters() {
    let d = AtpConfig::for_variant(AtpVariant::Default);
    assert_eq!((d.epoch, d.kappa), (EPOCH, KAPPA));
    let a = AtpConfig::for_variant(AtpVariant::Aggressive);
    assert_eq!((a.epoch, a.kappa), (EPOCH_AGGRESSIVE, KAPPA_AGGRESSIVE));
    assert!(!a.immediate_feedback);
    let ad = AtpConfig::for_variant(AtpVariant::Adaptive);
    assert!(ad.immediate_feedback && ad.hop_scaled_eta);
    assert_eq!(AtpConfig::default(), d);
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn msg(kind: u8, v: &[u32]) -> Vec<u8> {
        let src = [1, 4][v[0] as usize % 2];
        let id = [3, 5][v[1] as usize % 2];
        let dst = [1, 9][v[2] as usize % 2];
        let seq = v[3] % 24;
        if kind % 2 == 0 {
            let probe = kind % 6 == 0;
            Message::Data(wire::Data {
                flags: (v[4] as u8) & (wire::FLAG_FIN | wire::FLAG_SACK_REQ),
                hops: (v[5] % 8) as u8,
                src,
                id,
                dst,
                seq,
                d_max_us: v[6] % 100_000,
                d_s_us: v[5] % 100_000,
                payload: if probe { &[] } else { &[7; 10] },
            })
            .to_vec()
        } else {
            Message::Feedback(wire::Feedback {
                flags: v[4] as u8 & 0xe1,
                hops: (v[5] % 8) as u8,
                src,
                id,
                cum: v[6] % 24,
                d_avg_us: v[5] % 200_000,
                blocks: vec![(seq, seq + 1 + v[2] % 4)],
            })
            .to_vec()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Any interleaving of messages, timeouts, polls and application calls, in every
        /// variant: no panic, and a handled deadline is never reported again.
        #[test]
        fn never_panics_never_spins(variant in 0usize..3, ops in proptest::collection::vec(
            (0u8..4, any::<u8>(), proptest::collection::vec(any::<u32>(), 7), 0u64..300),
            1..120,
        )) {
            let v = [AtpVariant::Default, AtpVariant::Aggressive, AtpVariant::Adaptive][variant];
            let mut t = AtpTransport::new(AtpConfig::for_variant(v));
            let mut env = Env::new(&[(9, 2), (4, 4), (2, 2)], 2);
            t.open(&mut env.ctx(ms(0.0), 1), F, 9).unwrap();
            let mut now = ms(0.0);
            for (op, kind, vals, dt) in ops {
                now += Duration::from_millis(dt);
                match op {
                    0 => {
                        let b = msg(kind, &vals);
                        let from = [2, 4][vals[0] as usize % 2];
                        let _ = t.handle(&mut env.ctx(now, 1), rx(from, &b));
                    }
                    1 => {
                        if t.poll_timeout().is_some_and(|d| d <= now) {
                            t.handle_timeout(&mut env.ctx(now, 1));
                            while t.poll_transmit(&mut env.ctx(now, 1)).is_some() {}
                            prop_assert!(t.poll_timeout().is_none_or(|d| d > now));
                        }
                    }
                    2 => while t.poll_transmit(&mut env.ctx(now, 1)).is_some() {},
                    _ => {
                        let _ = t.send(&mut env.ctx(now, 1), F, Bytes::from(vec![1; 3000]));
                        if kind % 7 == 0 {
                            let _ = t.finish(&mut env.ctx(now, 1), F);
                        }
                    }
                }
                while t.poll_event().is_some() {}
            }
        }
    }
}
