//! The BSYN timer: how long a sender waits for the BACK of a BSYN (§3.1 retries with backoff;
//! the adaptive timer from BSYN-to-BACK round trips is not in the paper).

use super::*;

pub(super) fn backoff(base: Duration, max: Duration, attempts: u32) -> Duration {
    base.saturating_mul(1u32 << attempts.min(16))
        .min(max.max(base))
}

/// Smoothed BSYN-to-BACK round trip of one next hop (RFC 6298 §2 estimator).
#[derive(Debug, Clone, Copy)]
pub(super) struct RttEstimate {
    pub(super) srtt: Duration,
    pub(super) rttvar: Duration,
}

impl RttEstimate {
    pub(super) fn update(prev: Option<Self>, r: Duration) -> Self {
        match prev {
            None => Self {
                srtt: r,
                rttvar: r / 2,
            },
            Some(e) => {
                let dev = e.srtt.abs_diff(r);
                Self {
                    rttvar: (e.rttvar * 3 + dev) / 4,
                    srtt: (e.srtt * 7 + r) / 8,
                }
            }
        }
    }
}

/// Floor of the adaptive BSYN timer: `bsyn_min_timeout`, lowered on a link whose data
/// drains fast. A BSYN overtakes the data queued before it, so its BACK may rightly wait for
/// that data to arrive: twice the measured delivery delay (hand-over to BACK) covers that,
/// since the BSYN names the round's last packet and a next hop that has it answers at once.
/// It waits longer (`back_quiet`) when that packet was lost or the BSYN overtook its data;
/// then a repeated BSYN, which asks for an answer at once, ends the wait sooner, as a tail
/// loss probe does (RFC 8985 §7). On 802.11b a window of data takes longer than `bsyn_min_timeout` to drain
/// and the floor stays there; on a wired or veth link (delivery in about a millisecond) it
/// falls to [`MIN_BSYN_FLOOR`], so a lost BSYN, BACK or round end costs milliseconds.
pub(super) fn bsyn_floor(cfg: &HopConfig, delivery_delay: Option<Duration>) -> Duration {
    match delivery_delay {
        Some(d) => (d * 2).max(MIN_BSYN_FLOOR).min(cfg.bsyn_min_timeout),
        None => cfg.bsyn_min_timeout,
    }
}

/// Lowest floor of the adaptive BSYN timer: a few timer ticks of a user-space daemon.
pub(super) const MIN_BSYN_FLOOR: Duration = Duration::from_millis(2);

/// How long to wait for the BACK of a BSYN sent after `attempts` unanswered ones (`micro`:
/// the BSYNs of a micro-block, which carry its packets).
pub(super) fn bsyn_wait(
    cfg: &HopConfig,
    rtt: Option<&RttEstimate>,
    delivery_delay: Option<Duration>,
    attempts: u32,
    micro: bool,
) -> Duration {
    if !cfg.adaptive_bsyn_timeout {
        return backoff(cfg.bsyn_timeout, cfg.bsyn_max_backoff, attempts);
    }
    let floor = bsyn_floor(cfg, delivery_delay);
    let first = match rtt {
        Some(e) => (e.srtt + e.rttvar * 4).max(floor),
        // Before the first sample, `bsyn_timeout` covers the drain of the data this node
        // handed to its link before the BSYN. A micro-block's packets ride on its BSYNs, in
        // the control class, and the next hop answers the last one at once (no BACK
        // deferral), so nothing of the block is queued behind them: the floor covers their
        // BACK. Without samples (a next hop this node has not sent to, or whose first tries
        // all went unanswered, Karn's rule) a wait of `bsyn_timeout` per round would dominate
        // a small file's delay next to a hidden sender (docs/design/hop.md#36-micro-blocks).
        None if micro => floor,
        // A link that does not retry control frames (a wire, a tunnel, a veth): no MAC
        // retries or contention stretch the drain, and a window of data (32 packets of
        // 1,400 bytes) leaves it within the floor down to about 7 Mbit/s. There a first
        // round over a lossy link, whose first BSYNs are lost as often as its data and whose
        // answered repeats give no sample, would wait `bsyn_timeout` per round (a 1 MiB
        // block over a link losing 30 % took up to a second: docs/notebook/
        // 2026-12-03-first-block-on-a-lossy-link.md). A repeat that comes too early costs one
        // control datagram: the next hop answers with what it holds, and the packets handed
        // to the link after the newest one reported are not judged lost (loss.rs). On 802.11
        // (retries, or not said) the 200 ms stay: on a busy medium a first BSYN's answer can
        // take longer than the floor (the lossy-hub mesh moved 9 % less with it).
        None if cfg.link_retries == Some(false) => floor,
        None => cfg.bsyn_timeout,
    };
    if attempts == 0 {
        return first;
    }
    // A repeated BSYN finds the data sent before the first one delivered (the first timer
    // covered its drain) and asks for an answer at once: its BACK comes after what is queued
    // ahead of it leaves, one delivery delay, not the two of the floor. The repeats wait a
    // multiple of that, growing linearly (under random loss a round fails often, and
    // doubling would let the waits, not the losses, set the rate); an unreachable next hop
    // still slows to one BSYN per bsyn_max_backoff.
    let step = delivery_delay.map_or(floor, |d| d.clamp(MIN_BSYN_FLOOR, floor));
    step.saturating_mul(attempts)
        .min(cfg.bsyn_max_backoff.max(step))
}
