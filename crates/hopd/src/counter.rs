//! The authentication counter survives restarts without a real-time clock.
//!
//! Each datagram's counter must exceed every counter the node used before under the same key,
//! or its neighbours drop its datagrams as replays (and a (node, counter) nonce would repeat).
//! Starting at the wall clock fails on a router without a battery-backed clock that reboots
//! offline: its clock starts behind the previous run. So hopd also keeps a lease on disk
//! (`storage/auth-counter`): the counter may run up to the lease's end, a new end is written
//! and fsynced before it gets there, and a node starts at the larger of its clock and the
//! last lease's end, which no counter it used can have reached.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Counters granted by one lease: at 100,000 datagrams a second, one write every 90 minutes.
pub const LEASE: u64 = 1 << 30;

/// The counter's lease on disk.
#[derive(Debug)]
pub struct CounterLease {
    path: PathBuf,
    /// No counter reaches this before a new lease is written.
    end: u64,
}

impl CounterLease {
    /// Read the last lease (if any), and start a new one at the larger of `clock` and its end.
    /// Returns the lease and the first counter to use.
    pub fn start(dir: &Path, clock: u64) -> std::io::Result<(CounterLease, u64)> {
        let path = dir.join("auth-counter");
        let stored = match std::fs::read(&path) {
            Ok(b) if b.len() == 8 => u64::from_be_bytes(b.try_into().unwrap_or([0; 8])),
            Ok(_) => 0,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        let first = clock.max(stored);
        let mut lease = CounterLease { path, end: 0 };
        lease.write(first.saturating_add(LEASE))?;
        Ok((lease, first))
    }

    /// Renew the lease when `next` (the next counter to use) has gone half-way through it.
    pub fn keep_ahead(&mut self, next: u64) -> std::io::Result<()> {
        if next.saturating_add(LEASE / 2) < self.end {
            return Ok(());
        }
        self.write(next.saturating_add(LEASE))
    }

    pub fn end(&self) -> u64 {
        self.end
    }

    /// Write and fsync a new end (to a temporary file, renamed over the old one), then use it.
    fn write(&mut self, end: u64) -> std::io::Result<()> {
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&end.to_be_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        self.end = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_with_the_clock_behind_starts_past_every_counter_used() {
        let dir = tempfile::tempdir().unwrap();
        let clock = 1_700_000_000_000_000_000u64;
        let (mut lease, first) = CounterLease::start(dir.path(), clock).unwrap();
        assert_eq!(first, clock);
        // The node sends 3/4 of a lease's worth: the lease moves ahead before it runs out.
        let used = first + LEASE * 3 / 4;
        lease.keep_ahead(used).unwrap();
        assert!(lease.end() > used + LEASE / 2);
        // Power loss, then a start with the clock an hour behind.
        drop(lease);
        let behind = clock - 3_600_000_000_000;
        let (_, again) = CounterLease::start(dir.path(), behind).unwrap();
        assert!(again > used, "{again} <= {used}");
        // With the clock ahead, the clock wins.
        let ahead = again + 10 * LEASE;
        let (_, later) = CounterLease::start(dir.path(), ahead).unwrap();
        assert_eq!(later, ahead);
    }

    #[test]
    fn the_lease_is_renewed_only_past_its_middle() {
        let dir = tempfile::tempdir().unwrap();
        let (mut lease, first) = CounterLease::start(dir.path(), 1000).unwrap();
        let end = lease.end();
        lease.keep_ahead(first + LEASE / 4).unwrap();
        assert_eq!(lease.end(), end);
        lease.keep_ahead(first + LEASE / 2 + 1).unwrap();
        assert_eq!(lease.end(), first + LEASE / 2 + 1 + LEASE);
    }
}
