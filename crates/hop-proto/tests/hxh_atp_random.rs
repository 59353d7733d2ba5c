//! HxH and the three ATP variants deliver every byte, once and in order, over random chains:
//! lengths, frame losses, a shared or per-link medium, and concurrent flows of mixed sizes in
//! both directions; and leave no flow state behind.

#[path = "hxh_harness/mod.rs"]
mod harness;

use harness::{pattern, secs, Net};
use hop_proto::atp::{AtpConfig, AtpTransport, AtpVariant};
use hop_proto::hxh::{HxhConfig, HxhTransport};
use hop_proto::{Transport, TransportId};
use proptest::prelude::*;

/// Builds a transport of one kind: 0 HxH with passive feedback, 1 HxH with explicit
/// per-hop acks, 2-4 the ATP variants.
fn maker(kind: u8) -> (TransportId, impl Fn() -> Box<dyn Transport>) {
    let id = if kind < 2 {
        TransportId::Hxh
    } else {
        TransportId::Atp
    };
    let make = move || -> Box<dyn Transport> {
        match kind {
            0 | 1 => Box::new(HxhTransport::new(HxhConfig {
                passive_feedback: kind == 0,
                ..HxhConfig::default()
            })),
            k => Box::new(AtpTransport::new(AtpConfig::for_variant(
                [
                    AtpVariant::Default,
                    AtpVariant::Aggressive,
                    AtpVariant::Adaptive,
                ][usize::from(k - 2)],
            ))),
        }
    };
    (id, make)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_chains_deliver_every_byte(
        kind in 0u8..5,
        n in 2u32..6,
        loss_pct in 0u32..20,
        shared: bool,
        flows in proptest::collection::vec((any::<bool>(), 0usize..120_000, 0u32..2000), 1..4),
        seed in any::<u64>(),
    ) {
        let (id, make) = maker(kind);
        let mut net = Net::chain(seed, n, id, &make);
        net.shared_medium = shared;
        net.default_link.loss = f64::from(loss_pct) / 100.0;
        for (i, &(back, len, start_ms)) in flows.iter().enumerate() {
            let (src, dst) = if back { (n - 1, 0) } else { (0, n - 1) };
            net.start_flow(secs(f64::from(start_ms) / 1000.0), src, dst, pattern(len, i as u8));
        }
        net.run_until(secs(600.0), |n| n.all_done());
        for (k, r) in &net.flows {
            prop_assert!(!r.out_of_order, "{id:?} kind {kind}: flow {k} out of order");
            prop_assert!(
                r.received == r.payload[..],
                "{id:?} kind {kind}: flow {k} got {} of {} bytes by {:?}",
                r.received.len(),
                r.payload.len(),
                net.now
            );
            prop_assert!(r.flow_finished.is_some(), "{id:?} kind {kind}: flow {k} not finished");
            prop_assert!(r.send_complete.is_some(), "{id:?} kind {kind}: flow {k} not complete at its source");
            prop_assert!(!r.send_failed, "{id:?} kind {kind}: flow {k} failed");
        }
    }
}
