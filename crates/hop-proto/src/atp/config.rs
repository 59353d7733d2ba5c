//! ATP parameters (ATP paper Table I, §II, §III-C) and the aggressive and adaptive variants
//! (§V-A2, §V-A3). Values without a paper section are choices of this implementation,
//! explained in `docs/transports.md`.

use std::time::Duration;

/// Epoch timeout E (§II-B, Table I: 1 s).
pub const EPOCH: Duration = Duration::from_secs(1);
/// Aggressive and adaptive epoch timeout (§V-A2: "E to 0.04 second").
pub const EPOCH_AGGRESSIVE: Duration = Duration::from_millis(40);
/// Intermediate-node averaging weight α (§II-A, Table I).
pub const ALPHA: f64 = 0.75;
/// Receiver averaging weight β (§II-B, Table I).
pub const BETA: f64 = 0.85;
/// Idle multiplier η (§II-A, Table I).
pub const ETA: f64 = 3.0;
/// Adaptive η grows by this much per hop beyond the first (§V-A3: η = 3.0 + 0.5·(h−1)).
pub const ETA_PER_HOP: f64 = 0.5;
/// Rate increase threshold φ (§II-C, Table I).
pub const PHI: f64 = 1.1;
/// Rate increase factor κ (§II-C, Table I).
pub const KAPPA: f64 = 0.2;
/// Aggressive and adaptive κ (§V-A2: "increasing the rate increase factor κ to 0.5").
pub const KAPPA_AGGRESSIVE: f64 = 0.5;
/// SACK blocks per feedback packet (§II-B: "up to 20").
pub const MAX_SACK_BLOCKS: usize = 20;
/// The sender expects feedback every 1.1·E (§III-C).
pub const FEEDBACK_SLACK: f64 = 1.1;
/// Missed feedbacks that restart quick-start (§II-C: "three consecutive").
pub const MISSED_FEEDBACK_RESTART: u32 = 3;
/// Adaptive: consecutive packets above / below the threshold that trigger immediate feedback
/// (§V-A3: "10 consecutive incoming packets").
pub const ADAPTIVE_RUN: u32 = 10;
/// Adaptive: newly detected drops that trigger immediate feedback (§V-A3: "two dropped").
pub const ADAPTIVE_DROPS: u32 = 2;
/// Payload bytes per data packet (same as HxH, HxH paper §4).
pub const PACKET_PAYLOAD_BYTES: usize = 1000;
/// A source's send buffer holds at least this much (not in the paper: its Python sender held
/// the whole 2 MB file, §IV-B).
pub const SEND_BUFFER_BYTES: usize = 256 * 1024;
/// ... and grows to what the flow sends at its current rate in this many feedback intervals
/// (1.1·E, §III-C): a packet is freed only by the feedback that acknowledges it, so a
/// buffer smaller than that caps the rate at buffer / E, whatever the path allows (256 KiB
/// per second is 2.1 Mbit/s). Not in the paper.
pub const SEND_BUFFER_FEEDBACK_INTERVALS: f64 = 2.0;
/// Ceiling of that growth per flow (memory bound; 16 MiB is 2 s at 64 Mbit/s).
pub const SEND_BUFFER_MAX_BYTES: usize = 16 * 1024 * 1024;

/// Which ATP the transport runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AtpVariant {
    /// The original parameters (§II, Table I).
    #[default]
    Default,
    /// E = 0.04 s, κ = 0.5 (§V-A2).
    Aggressive,
    /// Aggressive parameters plus immediate feedback and hop-count-based η (§V-A3).
    Adaptive,
}

/// Configuration of [`AtpTransport`](super::AtpTransport).
#[derive(Debug, Clone, PartialEq)]
pub struct AtpConfig {
    pub variant: AtpVariant,
    pub packet_payload_bytes: usize,
    pub epoch: Duration,
    pub alpha: f64,
    pub beta: f64,
    pub eta: f64,
    pub phi: f64,
    pub kappa: f64,
    pub max_sack_blocks: usize,
    pub feedback_slack: f64,
    pub missed_feedback_restart: u32,
    /// Adaptive immediate-feedback rules (§V-A3).
    pub immediate_feedback: bool,
    pub adaptive_run: u32,
    pub adaptive_drops: u32,
    /// Adaptive: scale the quick-start delay by η(h) = η + 0.5·(h−1) (§V-A3).
    pub hop_scaled_eta: bool,
    pub eta_per_hop: f64,
    /// Idle-channel observations update `T_t` with their zero transmission sample, as every
    /// packet updates the EWMAs (§II-A); `false` leaves `T_t` unchanged on them (the earlier
    /// behaviour, which can hold a flow at the rate of a contention that has ended).
    pub idle_updates_t: bool,
    /// Data packets a node's output queue holds before dropping (drop tail).
    pub queue_limit_packets: usize,
    /// Floor of any delay used as a rate (keeps 1/D finite).
    pub min_delay: Duration,
    /// Ceiling of the sending delay (keeps a minimum rate).
    pub max_delay: Duration,
    /// A flow with no feedback for this long fails (source) or is dropped (destination).
    pub give_up: Duration,
    /// Smallest send buffer of a source flow ([`SEND_BUFFER_BYTES`]).
    pub send_buffer_bytes: usize,
    /// The send buffer grows above `send_buffer_bytes` to the bytes sent at the flow's rate
    /// in `send_buffer_feedback_intervals` feedback intervals, up to `send_buffer_max_bytes`.
    pub send_buffer_feedback_intervals: f64,
    pub send_buffer_max_bytes: usize,
    pub max_flows: usize,
    /// Finished flows remembered by a destination to answer late packets and probes.
    pub finished_memory: usize,
}

impl AtpConfig {
    /// Send buffer of a source flow sending `rate` packets per second: what it sends in
    /// `send_buffer_feedback_intervals` feedback intervals, within
    /// [`send_buffer_bytes`, `send_buffer_max_bytes`].
    pub fn send_buffer_for_rate(&self, rate: f64) -> usize {
        let bytes = rate
            * self.packet_payload_bytes as f64
            * self.feedback_interval().as_secs_f64()
            * self.send_buffer_feedback_intervals;
        let bytes = if bytes.is_finite() && bytes > 0.0 {
            bytes.min(usize::MAX as f64) as usize
        } else {
            0
        };
        bytes.clamp(
            self.send_buffer_bytes,
            self.send_buffer_max_bytes.max(self.send_buffer_bytes),
        )
    }

    /// The parameters of one variant.
    pub fn for_variant(variant: AtpVariant) -> Self {
        let base = AtpConfig {
            variant,
            packet_payload_bytes: PACKET_PAYLOAD_BYTES,
            epoch: EPOCH,
            alpha: ALPHA,
            beta: BETA,
            eta: ETA,
            phi: PHI,
            kappa: KAPPA,
            max_sack_blocks: MAX_SACK_BLOCKS,
            feedback_slack: FEEDBACK_SLACK,
            missed_feedback_restart: MISSED_FEEDBACK_RESTART,
            immediate_feedback: false,
            adaptive_run: ADAPTIVE_RUN,
            adaptive_drops: ADAPTIVE_DROPS,
            hop_scaled_eta: false,
            eta_per_hop: ETA_PER_HOP,
            idle_updates_t: true,
            queue_limit_packets: 50,
            min_delay: Duration::from_micros(100),
            max_delay: Duration::from_secs(1),
            give_up: Duration::from_secs(30),
            send_buffer_bytes: SEND_BUFFER_BYTES,
            send_buffer_feedback_intervals: SEND_BUFFER_FEEDBACK_INTERVALS,
            send_buffer_max_bytes: SEND_BUFFER_MAX_BYTES,
            max_flows: 1024,
            finished_memory: 1024,
        };
        match variant {
            AtpVariant::Default => base,
            AtpVariant::Aggressive => AtpConfig {
                epoch: EPOCH_AGGRESSIVE,
                kappa: KAPPA_AGGRESSIVE,
                ..base
            },
            AtpVariant::Adaptive => AtpConfig {
                epoch: EPOCH_AGGRESSIVE,
                kappa: KAPPA_AGGRESSIVE,
                immediate_feedback: true,
                hop_scaled_eta: true,
                ..base
            },
        }
    }

    /// Time the sender waits for each feedback (1.1·E, §III-C).
    pub fn feedback_interval(&self) -> Duration {
        let x = self.epoch.as_secs_f64() * self.feedback_slack;
        if x.is_finite() && x > 0.0 {
            Duration::try_from_secs_f64(x).unwrap_or(Duration::MAX)
        } else {
            self.epoch
        }
    }
}

impl Default for AtpConfig {
    fn default() -> Self {
        AtpConfig::for_variant(AtpVariant::Default)
    }
}

/// Largest payload that fits the envelope with the ATP data header.
pub const MAX_PACKET_PAYLOAD_BYTES: usize = 60_000;

fn unit_or(x: f64, default: f64) -> f64 {
    if x.is_finite() && (0.0..=1.0).contains(&x) {
        x
    } else {
        default
    }
}

fn at_least_or(x: f64, min: f64, default: f64) -> f64 {
    if x.is_finite() && x >= min {
        x
    } else {
        default
    }
}

impl AtpConfig {
    /// The same configuration with every value forced into its valid range, so that no
    /// configuration can make the transport panic or spin (e.g. a zero epoch). Out-of-range
    /// weights and factors fall back to the paper's values; durations are bounded.
    pub fn sanitized(mut self) -> Self {
        let hour = Duration::from_secs(3600);
        self.packet_payload_bytes = self.packet_payload_bytes.clamp(1, MAX_PACKET_PAYLOAD_BYTES);
        self.epoch = self.epoch.clamp(Duration::from_millis(1), hour);
        self.alpha = unit_or(self.alpha, ALPHA);
        self.beta = unit_or(self.beta, BETA);
        self.eta = at_least_or(self.eta, 1.0, ETA);
        self.phi = at_least_or(self.phi, 1.0, PHI);
        self.kappa = at_least_or(self.kappa, 0.0, KAPPA).min(1.0);
        self.max_sack_blocks = self.max_sack_blocks.min(MAX_SACK_BLOCKS);
        self.feedback_slack = at_least_or(self.feedback_slack, 1.0, FEEDBACK_SLACK).min(100.0);
        self.missed_feedback_restart = self.missed_feedback_restart.max(1);
        self.adaptive_run = self.adaptive_run.max(1);
        self.adaptive_drops = self.adaptive_drops.max(1);
        self.eta_per_hop = at_least_or(self.eta_per_hop, 0.0, ETA_PER_HOP).min(100.0);
        self.queue_limit_packets = self.queue_limit_packets.max(1);
        self.min_delay = self.min_delay.clamp(Duration::from_micros(1), hour);
        self.max_delay = self.max_delay.clamp(self.min_delay, hour);
        self.give_up = self
            .give_up
            .clamp(Duration::from_millis(1), Duration::from_secs(86_400));
        self.send_buffer_bytes = self.send_buffer_bytes.max(1);
        self.send_buffer_feedback_intervals = at_least_or(
            self.send_buffer_feedback_intervals,
            0.0,
            SEND_BUFFER_FEEDBACK_INTERVALS,
        )
        .min(1000.0);
        self.send_buffer_max_bytes = self.send_buffer_max_bytes.max(self.send_buffer_bytes);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_buffer_follows_the_rate_within_its_bounds() {
        let c = AtpConfig::for_variant(AtpVariant::Default);
        // 1000 packets/s of 1000 bytes over 2 × 1.1 s: 2.2 MB.
        assert_eq!(c.send_buffer_for_rate(1000.0), 2_200_000);
        assert_eq!(c.send_buffer_for_rate(1.0), SEND_BUFFER_BYTES);
        assert_eq!(c.send_buffer_for_rate(1e9), SEND_BUFFER_MAX_BYTES);
        for bad in [f64::NAN, f64::INFINITY, -5.0, 0.0] {
            let b = c.send_buffer_for_rate(bad);
            assert!(
                (SEND_BUFFER_BYTES..=SEND_BUFFER_MAX_BYTES).contains(&b),
                "{bad}"
            );
        }
        // A ceiling below the floor is raised to it by `sanitized`.
        let low = AtpConfig {
            send_buffer_max_bytes: 1,
            ..c
        }
        .sanitized();
        assert_eq!(low.send_buffer_for_rate(1e6), SEND_BUFFER_BYTES);
    }
}
