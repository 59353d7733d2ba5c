//! Transmit status from the link: how many frames the interface still holds.
//!
//! hopd polls its transport only while the link can take more (the pull model of
//! `daemon/datapath.rs`): on a real wireless interface a datagram stays charged to its socket until
//! the driver has sent it, so a small send buffer fills when the driver's queue does. A tap
//! device frees every frame as it takes it, so behind one (the lab's emulated medium) the
//! socket never fills while the emulated MAC queue does. With `link_status_socket` set, the
//! link reports its backlog on a Unix datagram socket and hopd keeps at most
//! `link_queue_frames` frames queued there.
//!
//! A report is 16 bytes, big-endian: the magic `HLQ1`, the frames the interface holds
//! (queued or in flight, every access category) when it was sent (u32), and the frames the
//! link has taken from this node so far (u64, for diagnosis). The link sends one whenever its
//! backlog falls. Between reports hopd adds the datagrams it sends to the last backlog
//! reported. If no report comes for [`STALE_AFTER`] while hopd waits, it assumes the
//! reports were lost and the backlog drained.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::net::UnixDatagram;

/// First bytes of a report.
pub const MAGIC: [u8; 4] = *b"HLQ1";
/// Length of a report.
pub const REPORT_LEN: usize = 16;
/// Default bound on frames queued at the link: enough to keep the MAC busy (a frame of
/// 1.5 kB takes 1.2 ms at 11 Mbit/s, and hopd answers a report in well under that) while the
/// backlog, and with it the wait ATP measures, stays at the transport (ATP paper §II-A
/// measures queueing and transmission delay at the node).
pub const DEFAULT_QUEUE_FRAMES: u32 = 4;
/// How long hopd waits for a report, with the link full by its count, before it assumes the
/// reports were lost and the backlog drained. A frame can legitimately wait longer than
/// 200 ms: a contended relay with the retry limit and four frames queued took that long in the
/// lab's three-flow stack. The emulated MAC drops a frame it could not send in 500 ms
/// (ns-3's `WifiMacQueue` `MaxDelay`), and that drop is reported; 1 s is past both.
pub const STALE_AFTER: Duration = Duration::from_secs(1);

/// A report that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    #[error("link status report of {0} bytes; expected {REPORT_LEN}")]
    Length(usize),
    #[error("link status report without the HLQ1 magic")]
    Magic,
}

/// One report from the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// Frames the interface holds.
    pub backlog: u32,
    /// Frames the link has taken from this node so far.
    pub taken: u64,
}

impl Report {
    pub fn parse(b: &[u8]) -> Result<Report, ReportError> {
        if b.len() != REPORT_LEN {
            return Err(ReportError::Length(b.len()));
        }
        if b[..4] != MAGIC {
            return Err(ReportError::Magic);
        }
        Ok(Report {
            backlog: u32::from_be_bytes(b[4..8].try_into().expect("4 bytes")),
            taken: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
        })
    }

    pub fn encode(&self) -> [u8; REPORT_LEN] {
        let mut b = [0u8; REPORT_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4..8].copy_from_slice(&self.backlog.to_be_bytes());
        b[8..16].copy_from_slice(&self.taken.to_be_bytes());
        b
    }
}

/// Counters of the link status socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LinkStatusCounters {
    /// Reports received.
    pub reports: u64,
    /// Datagrams on the socket that were not reports.
    pub bad_reports: u64,
    /// Times hopd stopped polling its transport because the link was full.
    pub full: u64,
    /// Times no report came while the link was full and hopd assumed it drained.
    pub stale: u64,
}

/// hopd's view of the link's backlog (no I/O: see [`LinkStatus`]).
#[derive(Debug, Clone)]
pub struct Backlog {
    limit: u32,
    reported: u32,
    sent_since: u32,
    full_since: Option<Instant>,
    pub counters: LinkStatusCounters,
}

impl Backlog {
    pub fn new(limit: u32) -> Backlog {
        Backlog {
            limit: limit.max(1),
            reported: 0,
            sent_since: 0,
            full_since: None,
            counters: LinkStatusCounters::default(),
        }
    }

    /// Frames the link holds by hopd's count.
    pub fn estimate(&self) -> u32 {
        self.reported.saturating_add(self.sent_since)
    }

    /// Whether the link holds as many frames as hopd lets it, by hopd's count.
    pub fn full(&self) -> bool {
        self.estimate() >= self.limit
    }

    /// Whether the link can take another datagram now; counts a transition to full.
    pub fn room(&mut self, now: Instant) -> bool {
        if !self.full() {
            self.full_since = None;
            return true;
        }
        if self.full_since.is_none() {
            self.full_since = Some(now);
            self.counters.full += 1;
        }
        false
    }

    /// A datagram went to the link.
    pub fn sent(&mut self) {
        self.sent_since = self.sent_since.saturating_add(1);
    }

    /// A report arrived at `now`. If hopd is waiting for room, the wait for the next report
    /// starts again: reports are coming, so the link is busy rather than silent.
    pub fn report(&mut self, r: Report, now: Instant) {
        self.counters.reports += 1;
        self.reported = r.backlog;
        self.sent_since = 0;
        if self.full_since.is_some() {
            self.full_since = Some(now);
        }
    }

    /// When hopd stops waiting for a report, if it is waiting.
    pub fn stale_at(&self) -> Option<Instant> {
        self.full_since.map(|t| t + STALE_AFTER)
    }

    /// No report came in time: assume the backlog drained.
    pub fn expire(&mut self, now: Instant) {
        if self.stale_at().is_some_and(|t| now >= t) {
            self.counters.stale += 1;
            self.reported = 0;
            self.sent_since = 0;
            self.full_since = None;
        }
    }
}

/// The socket the link reports on, and the backlog.
#[derive(Debug)]
pub struct LinkStatus {
    sock: UnixDatagram,
    path: PathBuf,
    pub backlog: Backlog,
}

impl LinkStatus {
    /// Bind the socket at `path` (a stale socket file there is replaced).
    pub fn bind(path: &Path, limit: u32) -> io::Result<LinkStatus> {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let sock = UnixDatagram::bind(path)?;
        Ok(LinkStatus {
            sock,
            path: path.to_path_buf(),
            backlog: Backlog::new(limit),
        })
    }

    pub async fn readable(&self) -> io::Result<()> {
        self.sock.readable().await
    }

    /// Read every report waiting; the newest counts.
    pub fn drain(&mut self) {
        let mut buf = [0u8; 64];
        loop {
            match self.sock.try_recv(&mut buf) {
                Ok(n) => match Report::parse(&buf[..n]) {
                    Ok(r) => self.backlog.report(r, Instant::now()),
                    Err(e) => {
                        self.backlog.counters.bad_reports += 1;
                        tracing::debug!(error = %e, "link status datagram dropped");
                    }
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!(error = %e, "link status socket failed");
                    return;
                }
            }
        }
    }
}

impl Drop for LinkStatus {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip_and_bad_ones_are_named() {
        let r = Report {
            backlog: 7,
            taken: 1 << 40,
        };
        assert_eq!(Report::parse(&r.encode()), Ok(r));
        assert_eq!(
            Report::parse(&r.encode()[..15]),
            Err(ReportError::Length(15))
        );
        let mut b = r.encode();
        b[0] = b'X';
        assert_eq!(Report::parse(&b), Err(ReportError::Magic));
    }

    #[test]
    fn the_link_takes_datagrams_up_to_the_limit_and_reports_free_room() {
        let t0 = Instant::now();
        let mut b = Backlog::new(4);
        for _ in 0..4 {
            assert!(b.room(t0));
            b.sent();
        }
        assert!(!b.room(t0), "four frames queued: full");
        assert_eq!(b.counters.full, 1);
        // The link sent one of them: three left.
        b.report(
            Report {
                backlog: 3,
                taken: 4,
            },
            t0,
        );
        assert!(b.room(t0));
        b.sent();
        assert!(!b.room(t0));
        assert_eq!(b.counters.full, 2);
        // Frames of other programs count too.
        b.report(
            Report {
                backlog: 5,
                taken: 9,
            },
            t0,
        );
        assert!(!b.room(t0));
    }

    #[test]
    fn a_full_link_without_reports_is_assumed_drained_after_a_while() {
        let t0 = Instant::now();
        let mut b = Backlog::new(2);
        b.sent();
        b.sent();
        assert!(!b.room(t0));
        assert_eq!(b.stale_at(), Some(t0 + STALE_AFTER));
        b.expire(t0 + STALE_AFTER / 2);
        assert!(!b.room(t0 + STALE_AFTER / 2), "not yet");
        b.expire(t0 + STALE_AFTER);
        assert!(b.room(t0 + STALE_AFTER));
        assert_eq!(b.counters.stale, 1);
        assert_eq!(b.stale_at(), None);
    }

    #[test]
    fn reports_of_a_link_that_stays_full_restart_the_wait() {
        let t0 = Instant::now();
        let mut b = Backlog::new(2);
        b.sent();
        b.sent();
        assert!(!b.room(t0));
        // The link sent a frame but holds as many again (frames of other programs).
        let half = t0 + STALE_AFTER / 2;
        b.report(
            Report {
                backlog: 2,
                taken: 3,
            },
            half,
        );
        b.expire(t0 + STALE_AFTER);
        assert!(
            !b.room(t0 + STALE_AFTER),
            "a report came half-way: still full"
        );
        assert_eq!(b.stale_at(), Some(half + STALE_AFTER));
        b.expire(half + STALE_AFTER);
        assert!(b.room(half + STALE_AFTER));
        assert_eq!((b.counters.stale, b.counters.full), (1, 1));
    }

    #[tokio::test]
    async fn reports_on_the_socket_set_the_backlog() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("link.sock");
        std::fs::write(&path, b"stale").unwrap();
        let mut ls = LinkStatus::bind(&path, 4).unwrap();
        let tx = std::os::unix::net::UnixDatagram::unbound().unwrap();
        tx.send_to(b"junk", &path).unwrap();
        let r = Report {
            backlog: 2,
            taken: 10,
        };
        tx.send_to(&r.encode(), &path).unwrap();
        ls.readable().await.unwrap();
        ls.drain();
        assert_eq!(ls.backlog.estimate(), 2);
        assert_eq!(ls.backlog.counters.reports, 1);
        assert_eq!(ls.backlog.counters.bad_reports, 1);
        drop(ls);
        assert!(!path.exists(), "the socket file goes with the daemon");
    }
}
