//! The source: congestion window (RFC 5681 slow start and congestion avoidance, initial
//! window RFC 6928), loss recovery (fast retransmit and NewReno fast recovery, RFC 6582,
//! with the SACK scoreboard choosing what to resend as RFC 6675 does), and the
//! retransmission timer (RFC 6298).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use hop_wire::tcp as wire;
use hop_wire::NodeId;

use super::config::TcpConfig;
use super::TcpTransport;
use crate::stream::sendbuf::SendBuffer;
use crate::time::Instant;
use crate::transport::Ctx;
use crate::{Event, FailReason, FlowKey};

/// A segment chosen for transmission.
pub(super) struct Segment {
    pub(super) seq: u32,
    pub(super) payload: Bytes,
    pub(super) fin: bool,
    pub(super) retransmission: bool,
}

#[derive(Debug)]
pub(super) struct Sender {
    pub(super) dst: NodeId,
    /// Segments from the application; SACKed ones are released from it at once.
    pub(super) buf: SendBuffer,
    /// Congestion window and slow-start threshold, segments.
    pub(super) cwnd: f64,
    ssthresh: f64,
    /// The receiver's window, segments (RFC 793: the right edge is `una + rwnd`).
    rwnd: u32,
    dupacks: u32,
    in_recovery: bool,
    /// `snd_nxt` when the last loss episode began (RFC 6582 "recover"): recovery ends when
    /// it is acknowledged, and no new one starts below it.
    recover: u32,
    /// Segments the receiver holds above the cumulative ACK (the SACK scoreboard).
    sacked: BTreeSet<u32>,
    /// Segments deemed lost and not yet sent again.
    lost: BTreeSet<u32>,
    /// Segments sent again in this loss episode: not deemed lost a second time before an
    /// RTO (RFC 6675 §5 retransmits each hole once).
    resent: BTreeSet<u32>,
    /// First transmission time of segments never retransmitted: only these give RTT
    /// samples (Karn's algorithm, RFC 6298 §3).
    sent_at: BTreeMap<u32, Instant>,
    srtt: Option<Duration>,
    rttvar: Duration,
    rto: Duration,
    backoff: u32,
    /// When the retransmission timer expires (None: stopped, nothing outstanding).
    pub(super) rto_at: Option<Instant>,
    /// Last acknowledgement progress (or the flow's start).
    pub(super) last_progress: Instant,
    pub(super) writable_pending: bool,
}

impl Sender {
    pub(super) fn new(cfg: &TcpConfig, dst: NodeId, buf: SendBuffer, now: Instant) -> Self {
        Sender {
            dst,
            buf,
            cwnd: f64::from(cfg.initial_window_segments),
            // RFC 5681 §3.1: ssthresh starts arbitrarily high.
            ssthresh: f64::INFINITY,
            rwnd: cfg.receive_window_segments,
            dupacks: 0,
            in_recovery: false,
            recover: 0,
            sacked: BTreeSet::new(),
            lost: BTreeSet::new(),
            resent: BTreeSet::new(),
            sent_at: BTreeMap::new(),
            srtt: None,
            rttvar: Duration::ZERO,
            rto: cfg.initial_rto,
            backoff: 0,
            rto_at: None,
            last_progress: now,
            writable_pending: false,
        }
    }

    /// Segments sent and neither cumulatively nor selectively acknowledged.
    fn outstanding(&self) -> usize {
        self.buf.unacked_sent().count()
    }

    /// RFC 6675 "pipe": segments believed to be in the network (outstanding minus those
    /// deemed lost and not yet sent again).
    fn pipe(&self) -> usize {
        self.outstanding().saturating_sub(self.lost.len())
    }

    /// The current timeout, backed off (RFC 6298 §5.5), at most `max_rto`.
    fn current_rto(&self, cfg: &TcpConfig) -> Duration {
        let factor = 1u32 << self.backoff.min(16);
        self.rto.saturating_mul(factor).min(cfg.max_rto)
    }

    /// The next segment the windows allow: a segment deemed lost first, then new data
    /// within `min(cwnd, rwnd)` (RFC 6675 §5 NextSeg, rules 1 and 2).
    pub(super) fn next_segment(&mut self, now: Instant, cfg: &TcpConfig) -> Option<Segment> {
        if self.pipe() as f64 >= self.cwnd.floor().max(1.0) {
            return None;
        }
        let seg = loop {
            if let Some(seq) = self.lost.pop_first() {
                let Some((payload, fin)) = self.buf.get(seq) else {
                    continue; // acknowledged meanwhile
                };
                self.resent.insert(seq);
                self.sent_at.remove(&seq);
                break Segment {
                    seq,
                    payload,
                    fin,
                    retransmission: true,
                };
            }
            let right_edge = self.buf.acked().saturating_add(self.rwnd);
            if self.buf.next_new() >= right_edge {
                return None;
            }
            let (seq, payload, fin) = self.buf.take_new()?;
            self.sent_at.insert(seq, now);
            break Segment {
                seq,
                payload,
                fin,
                retransmission: false,
            };
        };
        // RFC 6298 §5.1: start the timer when a segment leaves and it is not running.
        if self.rto_at.is_none() {
            self.rto_at = Some(now + self.current_rto(cfg));
        }
        Some(seg)
    }

    /// RFC 6298 §2: fold an RTT sample into SRTT and RTTVAR; RTO = SRTT + max(G, 4·RTTVAR)
    /// with the clock granularity G taken as `min_rto`, which is how Linux's 200 ms floor
    /// enters its RTO, and at least `min_rto` (§2.4).
    fn rtt_sample(&mut self, r: Duration, cfg: &TcpConfig) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(srtt) => {
                let diff = srtt.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((srtt * 7 + r) / 8);
            }
        }
        let srtt = self.srtt.unwrap_or(r);
        self.rto = (srtt + cfg.min_rto.max(self.rttvar * 4)).clamp(cfg.min_rto, cfg.max_rto);
    }

    /// Mark as lost the holes below SACKed data with at least DupThresh SACKed segments
    /// above them (RFC 6675 §4 IsLost, counting segments), each once per episode.
    fn mark_sack_losses(&mut self, cfg: &TcpConfig) -> bool {
        let sacked: Vec<u32> = self.sacked.iter().copied().collect();
        let Some(&highest) = sacked.last() else {
            return false;
        };
        let holes: Vec<u32> = self
            .buf
            .unacked_sent()
            .take_while(|&q| q < highest)
            .collect();
        let mut any = false;
        for h in holes {
            let above = sacked.len() - sacked.partition_point(|&x| x <= h);
            if above >= cfg.dup_ack_threshold as usize
                && !self.resent.contains(&h)
                && self.lost.insert(h)
            {
                any = true;
            }
        }
        any
    }

    /// Mark the first unacknowledged segment lost unless it was already sent again: the
    /// fast retransmit (RFC 5681 §3.2) and the NewReno partial-ACK rule (RFC 6582 §3.2,
    /// step 5).
    fn mark_head_lost(&mut self) {
        let una = self.buf.acked();
        if self.buf.unacked_sent().next() == Some(una) && !self.resent.contains(&una) {
            self.lost.insert(una);
        }
    }
}

impl TcpTransport {
    pub(super) fn on_ack(&mut self, ctx: &mut Ctx<'_>, a: wire::Ack) {
        let key = FlowKey {
            src: a.src,
            id: a.id,
        };
        let now = ctx.now;
        let cfg = &self.cfg;
        let Some(s) = self.senders.get_mut(&key) else {
            return;
        };
        s.rwnd = a.wnd.max(1);
        let old_una = s.buf.acked();
        let advanced = s.buf.ack(a.ack);
        let una = s.buf.acked();
        let mut newly_sacked = 0u32;
        for &(start, end) in &a.blocks {
            for seq in start.max(una)..end.min(s.buf.next_new()) {
                if s.sacked.insert(seq) {
                    s.buf.sack(seq);
                    s.lost.remove(&seq);
                    newly_sacked += 1;
                }
            }
        }
        // Forget the scoreboard below the cumulative point.
        s.sacked = s.sacked.split_off(&una);
        s.lost = s.lost.split_off(&una);
        s.resent = s.resent.split_off(&una);
        let sample = s.sent_at.range(old_una..una).next_back().map(|(_, &t)| t);
        s.sent_at = s.sent_at.split_off(&una);
        let mut fast_retransmits = 0;
        if advanced {
            let acked = f64::from(una - old_una);
            if let Some(t) = sample {
                s.rtt_sample(now - t, cfg);
            }
            // RFC 6298 §5.3, §5.7: new data acknowledged restarts the timer unbacked-off.
            s.backoff = 0;
            s.rto_at = (s.outstanding() > 0).then(|| now + s.current_rto(cfg));
            s.last_progress = now;
            s.dupacks = 0;
            if s.in_recovery {
                if una >= s.recover {
                    // RFC 6582 §3.2 step 3: full acknowledgement ends recovery.
                    s.in_recovery = false;
                    s.cwnd = s.ssthresh;
                    s.resent.clear();
                } else {
                    s.mark_head_lost();
                }
            } else if s.cwnd < s.ssthresh {
                // Slow start: one segment per segment acknowledged (RFC 5681 §3.1; Linux
                // counts every segment an ACK covers).
                s.cwnd += acked;
            } else {
                // Congestion avoidance: about one segment per window (RFC 5681 eq. 3).
                s.cwnd += acked / s.cwnd;
            }
            // Growing past what the receiver allows adds nothing (RFC 7661's concern).
            s.cwnd = s
                .cwnd
                .min(f64::from(cfg.receive_window_segments.max(s.rwnd)));
        } else if s.outstanding() > 0 {
            s.dupacks += 1;
        }
        if newly_sacked > 0 {
            s.last_progress = now;
        }
        if s.in_recovery {
            s.mark_sack_losses(cfg);
        } else if una >= s.recover
            && s.outstanding() > 0
            && (s.dupacks >= cfg.dup_ack_threshold || s.mark_sack_losses(cfg))
        {
            // RFC 6582 §3.2 step 2 / RFC 6675 §5 step 4: enter fast recovery, halve the
            // window (RFC 5681 eq. 4) and resend the first hole now.
            let flight = s.pipe() as f64;
            s.ssthresh = (flight / 2.0).max(2.0);
            s.cwnd = s.ssthresh;
            s.in_recovery = true;
            s.recover = s.buf.next_new();
            s.mark_head_lost();
            s.mark_sack_losses(cfg);
            fast_retransmits = 1;
        }
        if s.writable_pending && s.buf.has_room() {
            s.writable_pending = false;
            self.events.push_back(Event::Writable { flow: key });
        }
        let done = s.buf.complete().then(|| s.buf.total());
        self.bump("fast_recoveries", fast_retransmits);
        if let Some(bytes) = done {
            self.senders.remove(&key);
            self.events
                .push_back(Event::SendComplete { flow: key, bytes });
        }
    }

    /// Expired retransmission timers and flows that made no progress for too long.
    pub(super) fn sender_timeouts(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        let cfg = self.cfg.clone();
        let mut failed = Vec::new();
        let mut timeouts = 0;
        for (&k, s) in self.senders.iter_mut() {
            if s.outstanding() == 0 && !s.buf.has_pending_new() {
                // Waiting for the application, not for the network.
                s.last_progress = now;
            }
            if now >= s.last_progress + cfg.give_up_after {
                let reason = if ctx.routing.next_hop(s.dst).is_none() {
                    FailReason::NoRoute
                } else {
                    FailReason::Timeout
                };
                failed.push((k, reason));
                continue;
            }
            let Some(at) = s.rto_at else { continue };
            if now < at {
                continue;
            }
            if s.outstanding() == 0 {
                s.rto_at = None;
                continue;
            }
            timeouts += 1;
            // RFC 5681 §3.1 eq. 4 on the first timeout of an episode, then a loss window
            // of one segment; RFC 6298 §5.5-5.6: back off and restart the timer.
            if s.backoff == 0 {
                s.ssthresh = (s.pipe() as f64 / 2.0).max(2.0);
            }
            s.cwnd = 1.0;
            s.backoff = s.backoff.saturating_add(1);
            s.rto_at = Some(now + s.current_rto(&cfg));
            s.in_recovery = false;
            s.dupacks = 0;
            s.recover = s.buf.next_new();
            // Every unacknowledged segment not SACKed is resent (as Linux's loss state
            // does), in order, as the window opens again; none gives an RTT sample.
            s.resent.clear();
            s.lost = s.buf.unacked_sent().collect();
            s.sent_at.clear();
        }
        self.bump("rto_expirations", timeouts);
        for (k, reason) in failed {
            self.senders.remove(&k);
            self.events.push_back(Event::SendFailed { flow: k, reason });
        }
    }
}
