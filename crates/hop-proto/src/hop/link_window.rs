//! The link window (not in the paper): a bound on the data packets a node has handed to its
//! link and not yet seen leave it, sized from the delivery rate.

use super::*;

/// The node's link window (`link_window_packets` up to `link_window_max_packets`).
#[derive(Debug, Clone)]
pub(super) struct LinkWindow {
    /// Packets handed to the link that next hops newly reported holding, over all transfers.
    pub(super) delivered: u64,
    /// Start of the current rate interval and `delivered` then.
    pub(super) rate_mark: Option<(Instant, u64)>,
    /// Current window in packets (0 = unbounded).
    pub(super) window: usize,
}

impl LinkWindow {
    /// Count `newly` packets of ours a next hop reported holding and, once per [`RATE_INTERVAL`], set
    /// the window to the packets delivered in `link_queue_target` at the rate of the interval
    /// just ended, between `link_window_packets` and `link_window_max_packets`. A
    /// window-limited interval measures window / round time, so on a link faster than the
    /// window the window grows by the ratio of the target to the round time per interval; a
    /// saturated link's rate does not grow with the window, so neither does the window.
    pub(super) fn note(&mut self, cfg: &HopConfig, now: Instant, newly: u64) {
        self.delivered += newly;
        let floor = cfg.link_window_packets;
        let ceiling = cfg.link_window_max_packets;
        if floor == 0 || ceiling <= floor {
            self.window = floor;
            return;
        }
        let Some((since, mark)) = self.rate_mark else {
            self.rate_mark = Some((now, self.delivered));
            return;
        };
        let elapsed = now.saturating_duration_since(since);
        if elapsed < RATE_INTERVAL {
            return;
        }
        let packets = (self.delivered - mark) as f64;
        let target = packets * cfg.link_queue_target.as_secs_f64() / elapsed.as_secs_f64();
        self.window = (target.ceil() as usize).clamp(floor, ceiling);
        self.rate_mark = Some((now, self.delivered));
    }
}

/// Length of one delivery-rate measurement behind the link window: several control rounds on
/// a fast link, about one round of a full 32-packet window on 802.11b.
pub(super) const RATE_INTERVAL: Duration = Duration::from_millis(100);

impl HopTransport {
    /// Data packets handed to the link and not yet known to have left it, over all
    /// transfers (the quantity `link_window_packets` bounds).
    pub(super) fn in_flight_total(&self) -> usize {
        self.in_flight
            .iter()
            .filter_map(|(k, n)| self.flows.get(k)?.outs.get(n))
            .filter(|x| !x.micro)
            .map(|x| self.queued(x) as usize)
            .sum()
    }

    /// Forget the transfers that no longer have packets of theirs in flight.
    pub(super) fn prune_in_flight(&mut self) {
        let flows = &self.flows;
        self.in_flight.retain(|(k, n)| {
            flows
                .get(k)
                .and_then(|f| f.outs.get(n))
                .is_some_and(|x| x.sent_round.count_in_not(&x.peer, &Bitmap::new(0)) > 0)
        });
    }

    pub(super) fn window_full(&self) -> bool {
        let w = self.window.window;
        if w == 0 {
            return false;
        }
        // With `queue_aware` a packet counts only if handed to the link after the newest
        // known arrival, and every packet has its own position in the link's stream: at
        // most `handed - arrived` count. Below the window that settles it without walking
        // every round (asked before every data packet; on a fast link this is most of them).
        let since_arrival = self
            .link_queue
            .handed
            .saturating_sub(self.link_queue.arrived);
        if self.cfg.queue_aware && since_arrival < w as u64 {
            return false;
        }
        self.in_flight_total() >= w
    }

    /// The current link window in packets (0 = unbounded).
    pub fn link_window(&self) -> usize {
        self.window.window
    }
}
