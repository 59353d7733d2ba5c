//! Blocks sized to shared turns (an extension): a receiver whose turns (§3.5) are shared
//! among several flows asks their sources, through the BACKs, for smaller blocks.
//!
//! A receiver takes one block at a time from all its upstream senders (§3.5), and a relay
//! holds H blocks per next hop (§3.3); so with k flows through a node each flow waits for the
//! other k − 1 flows' blocks between two of its own, and a turn lasts one block. With 1 MiB
//! blocks (§4.2) on a busy 802.11b mesh that is minutes without a byte. A block is cut at the
//! source and kept whole along the path, so only the source can make it smaller: every BACK
//! carries the largest block its sender's receiver, and the nodes beyond it, ask for
//! (`block_hint_kib`), the smallest of them reaching the source hop by hop. A flow's first
//! block, cut before any ask can have come, is the smallest a node asks for; a flow alone on
//! its path is asked for nothing and cuts whole blocks after it.

use super::*;

/// How long a flow counts as sharing a receiver's turns after its last BSYN there: several
/// times the longest gap between a waiting sender's BSYNs (`bsyn_max_backoff`), so that a
/// flow waiting for its turn is still counted.
const SHARE_WINDOW_BACKOFFS: u32 = 5;

/// The flows a node has heard BSYNs from as their receiver, and when.
#[derive(Debug, Default)]
pub(super) struct SharedTurns {
    /// Flow → the last BSYN this node received for it (not micro-blocks: they are served
    /// first and take no turn).
    heard: BTreeMap<FlowKey, Instant>,
    /// Flows in `heard` within the window when last counted, plus those new since.
    count: usize,
    counted_at: Instant,
}

impl SharedTurns {
    /// A BSYN for `key` arrived at this node, addressed to it.
    pub(super) fn note(&mut self, key: FlowKey, now: Instant) {
        if self.heard.insert(key, now).is_none() {
            self.count += 1;
        }
    }

    /// Flows sharing this node's turns now (recounted at most once per second: the count
    /// walks every flow heard).
    fn sharing(&mut self, now: Instant, window: Duration) -> usize {
        if now.saturating_duration_since(self.counted_at) >= Duration::from_secs(1) {
            self.heard
                .retain(|_, at| now.saturating_duration_since(*at) <= window);
            self.count = self.heard.len();
            self.counted_at = now;
        }
        self.count
    }

    /// The largest block, in bytes, this node asks its flows' sources for: the block size
    /// divided among the flows sharing its turns (a turn then lasts about what one whole
    /// block's would with the flow alone), no smaller than a sixteenth of it; `None` while
    /// at most one flow uses the node.
    /// Sent whatever this node's own switches: each source decides what to do with it
    /// (`shared_turn_blocks`, `ramp_while_shared`).
    pub(super) fn own_hint(&mut self, cfg: &HopConfig, now: Instant) -> Option<usize> {
        let window = cfg.bsyn_max_backoff.max(Duration::from_secs(1)) * SHARE_WINDOW_BACKOFFS;
        let k = self.sharing(now, window);
        if k <= 1 {
            return None;
        }
        Some((cfg.block_bytes() / k).max(smallest_ask(cfg)))
    }
}

/// The smallest block a node asks for: 1/16 of the block size (64 KiB of 1 MiB). Also a
/// flow's first block, which is cut before any ask can have come.
pub(super) fn smallest_ask(cfg: &HopConfig) -> usize {
    (cfg.block_bytes() / 16).max(1)
}

/// The hint as the BACK carries it: KiB, rounded down but at least 1; 0 for none.
pub(super) fn hint_to_kib(hint: Option<usize>) -> u16 {
    match hint {
        None => 0,
        Some(b) => (b / 1024).clamp(1, usize::from(u16::MAX)) as u16,
    }
}

/// The smaller of two hints (`None` is no limit).
pub(super) fn smaller_hint(a: Option<usize>, b: Option<usize>) -> Option<usize> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> HopConfig {
        HopConfig {
            shared_turn_blocks: true,
            ..HopConfig::default()
        }
    }

    fn key(id: u32) -> FlowKey {
        FlowKey { src: 1, id }
    }

    #[test]
    fn one_flow_asks_for_nothing_and_four_for_a_quarter() {
        let cfg = on();
        let mut s = SharedTurns::default();
        let t = Instant::ZERO + Duration::from_secs(5);
        s.note(key(1), t);
        assert_eq!(s.own_hint(&cfg, t), None);
        for i in 2..=4 {
            s.note(key(i), t);
        }
        assert_eq!(s.own_hint(&cfg, t), Some(cfg.block_bytes() / 4));
        for i in 5..=100 {
            s.note(key(i), t);
        }
        assert_eq!(s.own_hint(&cfg, t), Some(cfg.block_bytes() / 16));
    }

    #[test]
    fn flows_no_longer_heard_stop_counting() {
        let cfg = on();
        let mut s = SharedTurns::default();
        let t = Instant::ZERO + Duration::from_secs(1);
        s.note(key(1), t);
        s.note(key(2), t);
        assert!(s.own_hint(&cfg, t).is_some());
        let later = t + cfg.bsyn_max_backoff * SHARE_WINDOW_BACKOFFS + Duration::from_secs(2);
        s.note(key(1), later);
        assert_eq!(s.own_hint(&cfg, later), None);
    }

    /// The ask is information for the sources, sent whatever this node's own switches: a
    /// source with the ramp on learns of shared turns from relays that do not ramp.
    #[test]
    fn a_node_asks_with_its_own_switches_off() {
        let cfg = HopConfig {
            shared_turn_blocks: false,
            ramp_while_shared: false,
            initial_block_bytes: 0,
            ..HopConfig::default()
        };
        let mut s = SharedTurns::default();
        for i in 1..=8 {
            s.note(key(i), Instant::ZERO);
        }
        assert_eq!(s.own_hint(&cfg, Instant::ZERO), Some(cfg.block_bytes() / 8));
    }

    #[test]
    fn hints_in_kib() {
        assert_eq!(hint_to_kib(None), 0);
        assert_eq!(hint_to_kib(Some(100)), 1);
        assert_eq!(hint_to_kib(Some(256 * 1024)), 256);
        assert_eq!(smaller_hint(Some(5), None), Some(5));
        assert_eq!(smaller_hint(Some(5), Some(3)), Some(3));
        assert_eq!(smaller_hint(None, None), None);
    }
}
