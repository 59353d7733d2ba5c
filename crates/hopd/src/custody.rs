//! Blocks in custody, persisted in the storage directory.
//!
//! Each block is one file `custody/<src>-<flow id>-<block>.blk`: a fixed header then the
//! block's bytes. It is written to a temporary name, fsynced, renamed and the directory
//! fsynced. Without a write delay this happens before the transport acknowledges the block
//! upstream, so a node killed at any moment either still holds the block or never
//! acknowledged it. The writing happens on a
//! writer thread, off the event loop ([`Persist::Later`]): the relay keeps receiving and
//! forwarding while the disk works, and the daemon hands each finished write to the transport
//! ([`CustodyDone`]), which then sends the completing BACK. Writes queued together share one
//! directory fsync. Deleting released blocks happens on the same thread, in order.
//!
//! With a write delay (`[storage] custody_write_delay`, [`DiskCustody::with_write_delay`]) a
//! block is acknowledged at once and written only if it is still held when the delay ends: a
//! relay whose next hop takes its blocks within the delay never writes them (on a fast link
//! the disk was the relay's largest cost; on a router's flash every relayed byte was a
//! write). A block that waits, for a partition or a slow next hop, is on disk after the delay;
//! a clean shutdown writes every block still held. A node killed within the delay of taking a
//! block loses that block; its upstream's cache or the source, which keeps every block until
//! the end-to-end BACK (§3.2), sends it again.
//!
//! The same store makes a destination's deliveries durable ([`Spool`]): each block delivered
//! in order is written at its offset into `incoming/<src>-<flow id>.part`, and the flow's
//! progress (blocks and bytes delivered, finished) into `incoming/<src>-<flow id>.state`,
//! both fsynced before the end-to-end BACK that covers the block is sent. With the writer
//! (`with_writer` after `with_spool`) this happens on a thread of its own (`spool_writer`),
//! and the transport holds the BACK until the write is reported ([`Persist::Later`]). A
//! restarted destination reads the progress back and resumes; the source retransmits the
//! rest.
//!
//! Custody blocks, incoming files and the inbox share one disk budget (`max_disk_bytes`). A
//! block that does not fit is refused: for custody the BACK is withheld, for a delivery the
//! end-to-end BACK and the flow's next blocks are (backpressure), never dropped.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hop_proto::hop::{CustodyStore, Delivery, DestProgress, Persist, StoreFull, StoredBlock};
use hop_proto::FlowKey;

use crate::flowfmt::ResumeHeader;
use tracing::{info, warn};

const MAGIC: &[u8; 4] = b"HOPC";
const HEADER_LEN: usize = 4 + 4 + 4 + 4 + 4 + 8 + 1 + 8;

/// Usage figures shared with the daemon for metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct CustodyUsage {
    pub blocks: u64,
    pub bytes: u64,
    pub limit: u64,
    pub stored_total: u64,
    pub full_events: u64,
    /// Bytes of incoming (not yet finished) flows in the spool.
    pub incoming_bytes: u64,
    /// Bytes of verified files waiting in the inbox (kept up to date by the daemon).
    pub inbox_bytes: u64,
    /// Deliveries refused for lack of room (end-to-end acknowledgement withheld).
    pub spool_full_events: u64,
    /// A delivery is being withheld right now.
    pub spool_full: bool,
    /// The spool's writer is retrying a failed write (e.g. the file system is full): its
    /// deliveries wait unacknowledged.
    pub spool_write_failing: bool,
    /// Custody writes finished (durable or failed) and the time they held their blocks'
    /// completing BACKs: from the hand-over to the store until the write (and its
    /// directory fsync) finished, queueing behind other writes included; microseconds.
    pub writes_timed: u64,
    pub write_wait_us: u64,
    pub write_wait_max_us: u64,
    /// Deliveries written to the spool and the time each took to become durable: from the
    /// hand-over to the store until its bytes and progress were fsynced, queueing included
    /// (the end-to-end BACK follows); microseconds.
    pub deliveries_timed: u64,
    pub deliver_us: u64,
    pub deliver_max_us: u64,
}

impl CustodyUsage {
    fn time_write(&mut self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.writes_timed += 1;
        self.write_wait_us = self.write_wait_us.saturating_add(us);
        self.write_wait_max_us = self.write_wait_max_us.max(us);
    }

    fn time_delivery(&mut self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.deliveries_timed += 1;
        self.deliver_us = self.deliver_us.saturating_add(us);
        self.deliver_max_us = self.deliver_max_us.max(us);
    }
}

impl CustodyUsage {
    /// Bytes counted against the disk budget.
    pub fn disk_bytes(&self) -> u64 {
        self.bytes + self.incoming_bytes + self.inbox_bytes
    }
}

/// Custody writes the writer thread has finished, for the daemon to hand to the transport
/// (`ok`: the block is durable).
#[derive(Default)]
pub struct CustodyDone {
    done: Mutex<Vec<(FlowKey, u32, bool)>>,
    /// Deliveries the spool writer made durable (flow, block, true), in order, or whose
    /// write failed and is being retried (false).
    delivered: Mutex<Vec<(FlowKey, u32, bool)>>,
    /// Woken after each batch of writes.
    pub notify: tokio::sync::Notify,
}

impl CustodyDone {
    /// Take the finished writes.
    pub fn take(&self) -> Vec<(FlowKey, u32, bool)> {
        self.done
            .lock()
            .map(|mut d| std::mem::take(&mut *d))
            .unwrap_or_default()
    }

    /// Take the deliveries made durable since the last call (for
    /// `Transport::delivery_persisted`).
    pub fn take_delivered(&self) -> Vec<(FlowKey, u32, bool)> {
        self.delivered
            .lock()
            .map(|mut d| std::mem::take(&mut *d))
            .unwrap_or_default()
    }
}

enum Job {
    Write {
        flow: FlowKey,
        block: u32,
        path: PathBuf,
        header: [u8; HEADER_LEN],
        data: Bytes,
        /// When the store took the block (for `CustodyUsage::write_wait_us`).
        queued: std::time::Instant,
    },
    /// A block to write once `due` passes, unless a [`Job::Remove`] of it comes first; nobody
    /// waits for it (its BACK went when the store took it).
    Hold((FlowKey, u32), Held),
    Remove {
        key: (FlowKey, u32),
        path: PathBuf,
    },
}

/// A block the writer holds back until its write delay ends.
struct Held {
    path: PathBuf,
    header: [u8; HEADER_LEN],
    data: Bytes,
    due: std::time::Instant,
}

/// The writer thread and what it shares with the store.
struct Writer {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Blocks queued or being written.
    writing: Arc<Mutex<HashSet<(FlowKey, u32)>>>,
}

impl Writer {
    fn start(
        dir: PathBuf,
        done: Arc<CustodyDone>,
        usage: Arc<Mutex<CustodyUsage>>,
    ) -> std::io::Result<Writer> {
        let (tx, rx) = mpsc::channel::<Job>();
        let writing: Arc<Mutex<HashSet<(FlowKey, u32)>>> = Arc::default();
        let w = writing.clone();
        let thread = std::thread::Builder::new()
            .name("hopd-custody".into())
            .spawn(move || writer_loop(&dir, &rx, &w, &done, &usage))?;
        Ok(Writer {
            jobs: Some(tx),
            thread: Some(thread),
            writing,
        })
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Finish what is queued (a clean shutdown leaves every accepted write on disk).
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Write `header` then `data` to `path` through a temporary file, fsynced; the directory is
/// synced by the caller.
fn write_file(path: &Path, header: &[u8], data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let r = (|| {
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&tmp)?;
        f.write_all(header)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

fn writer_loop(
    dir: &Path,
    rx: &mpsc::Receiver<Job>,
    writing: &Mutex<HashSet<(FlowKey, u32)>>,
    done: &CustodyDone,
    usage: &Mutex<CustodyUsage>,
) {
    // Blocks waiting for their write delay, and their order (the delay is one for all, so
    // arrival order is due order); a key whose block was released is skipped.
    let mut held: HashMap<(FlowKey, u32), Held> = HashMap::new();
    let mut order: std::collections::VecDeque<(FlowKey, u32)> = Default::default();
    let mut closed = false;
    while !closed {
        // Released blocks leave their keys behind: drop them from the front, so that the
        // queue holds no more than the blocks taken within one delay.
        while order.front().is_some_and(|k| !held.contains_key(k)) {
            order.pop_front();
        }
        let next_due = order.front().and_then(|k| held.get(k)).map(|h| h.due);
        let first = match next_due {
            None => rx.recv().ok(),
            Some(due) => {
                let wait = due.saturating_duration_since(std::time::Instant::now());
                match rx.recv_timeout(wait) {
                    Ok(job) => Some(job),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        closed = true;
                        None
                    }
                }
            }
        };
        if first.is_none() && next_due.is_none() {
            // The store is gone and nothing waits.
            closed = true;
        }
        // Everything queued meanwhile forms one batch with one directory fsync.
        let mut batch: Vec<Job> = first.into_iter().collect();
        batch.extend(rx.try_iter());
        let mut finished = Vec::new();
        let mut queued_at = Vec::new();
        let mut renamed = false;
        for job in batch {
            match job {
                Job::Write {
                    flow,
                    block,
                    path,
                    header,
                    data,
                    queued,
                } => {
                    queued_at.push(queued);
                    let ok = match write_file(&path, &header, &data) {
                        Ok(()) => true,
                        Err(e) => {
                            warn!(error = %e, path = %path.display(), "custody write failed: acknowledgement withheld");
                            false
                        }
                    };
                    renamed |= ok;
                    finished.push((flow, block, ok));
                }
                Job::Hold(key, h) => {
                    held.insert(key, h);
                    order.push_back(key);
                }
                Job::Remove { key, path } => {
                    // Released before its delay ended: it never touches the disk.
                    if held.remove(&key).is_none() {
                        let _ = std::fs::remove_file(path);
                    }
                }
            }
        }
        // Write the blocks whose delay ended (all of them when the store closes: a clean
        // shutdown leaves every block it acknowledged on disk).
        let now = std::time::Instant::now();
        while let Some(key) = order.front().copied() {
            let Some(h) = held.get(&key) else {
                order.pop_front();
                continue;
            };
            if h.due > now && !closed {
                break;
            }
            order.pop_front();
            if let Some(h) = held.remove(&key) {
                match write_file(&h.path, &h.header, &h.data) {
                    Ok(()) => renamed = true,
                    Err(e) => {
                        warn!(error = %e, path = %h.path.display(), "custody write failed: the block stays in memory only")
                    }
                }
            }
        }
        if renamed {
            sync_dir(dir);
        }
        if let Ok(mut u) = usage.lock() {
            let now = std::time::Instant::now();
            for q in queued_at {
                u.time_write(now.saturating_duration_since(q));
            }
        }
        if let Ok(mut w) = writing.lock() {
            for (flow, block, _) in &finished {
                w.remove(&(*flow, *block));
            }
        }
        if finished.is_empty() {
            continue;
        }
        if let Ok(mut d) = done.done.lock() {
            d.extend(finished);
        }
        done.notify.notify_one();
    }
}

/// A [`CustodyStore`] on disk, bounded to `limit` bytes.
pub struct DiskCustody {
    dir: PathBuf,
    limit: u64,
    held: HashMap<(FlowKey, u32), (PathBuf, u64)>,
    usage: std::sync::Arc<std::sync::Mutex<CustodyUsage>>,
    spool: Option<Spool>,
    /// Whether a flow's first delivery may go on (a resumed transfer's bytes still here).
    gate: Option<spool::ResumeGate>,
    /// Writes off the event loop (`with_writer`); without it writes are synchronous.
    writer: Option<Writer>,
    /// Deliveries written off the event loop (`with_writer` after `with_spool`).
    spool_writer: Option<SpoolWriter>,
    /// With the writer: acknowledge at once and write a block only if still held after this
    /// long (`with_write_delay`); zero writes before the acknowledgement.
    write_delay: Duration,
}

fn file_name(flow: FlowKey, block: u32) -> String {
    format!("{}-{:08x}-{block}.blk", flow.src, flow.id)
}

/// The file header of a block; its bytes follow it (written as they are, not copied).
fn encode_header(b: &StoredBlock) -> [u8; HEADER_LEN] {
    let mut v = Vec::with_capacity(HEADER_LEN);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&b.flow.src.to_be_bytes());
    v.extend_from_slice(&b.flow.id.to_be_bytes());
    v.extend_from_slice(&b.dst.to_be_bytes());
    v.extend_from_slice(&b.block_num.to_be_bytes());
    v.extend_from_slice(&b.offset.to_be_bytes());
    v.push(u8::from(b.fin));
    v.extend_from_slice(&(b.data.len() as u64).to_be_bytes());
    let mut h = [0u8; HEADER_LEN];
    h.copy_from_slice(&v);
    h
}

fn decode(v: &[u8]) -> Option<StoredBlock> {
    if v.len() < HEADER_LEN || &v[..4] != MAGIC {
        return None;
    }
    let u32_at = |o: usize| u32::from_be_bytes(v[o..o + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |o: usize| u64::from_be_bytes(v[o..o + 8].try_into().unwrap_or([0; 8]));
    let len = u64_at(29) as usize;
    if v.len() != HEADER_LEN + len {
        return None;
    }
    Some(StoredBlock {
        flow: FlowKey {
            src: u32_at(4),
            id: u32_at(8),
        },
        dst: u32_at(12),
        block_num: u32_at(16),
        offset: u64_at(20),
        fin: v[28] != 0,
        data: Bytes::copy_from_slice(&v[HEADER_LEN..]),
    })
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

impl DiskCustody {
    /// Open the store in `dir` and read back every block it holds.
    pub fn open(
        dir: &Path,
        limit: u64,
        usage: std::sync::Arc<std::sync::Mutex<CustodyUsage>>,
    ) -> std::io::Result<(DiskCustody, Vec<StoredBlock>)> {
        std::fs::create_dir_all(dir)?;
        let mut held = HashMap::new();
        let mut blocks = Vec::new();
        for e in std::fs::read_dir(dir)?.flatten() {
            let path = e.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            if !name.ends_with(".blk") {
                continue;
            }
            match std::fs::read(&path).ok().and_then(|v| decode(&v)) {
                Some(b) => {
                    let size = b.data.len() as u64;
                    held.insert((b.flow, b.block_num), (path, size));
                    blocks.push(b);
                }
                None => {
                    warn!(path = %path.display(), "unreadable custody file removed");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        blocks.sort_by_key(|b| (b.flow, b.block_num));
        let store = DiskCustody {
            dir: dir.to_path_buf(),
            limit,
            held,
            usage,
            spool: None,
            gate: None,
            writer: None,
            spool_writer: None,
            write_delay: Duration::ZERO,
        };
        store.publish(0, 0);
        Ok((store, blocks))
    }

    /// Write custody blocks on a writer thread, and with `spool_thread` and a spool
    /// (`with_spool` first) the destination's deliveries on another; finished writes are
    /// reported through the returned [`CustodyDone`], which the runtime must hand to the
    /// transport (`Transport::custody_persisted`, `Transport::delivery_persisted`).
    pub fn with_writer(
        mut self,
        spool_thread: bool,
    ) -> std::io::Result<(DiskCustody, Arc<CustodyDone>)> {
        let done = Arc::new(CustodyDone::default());
        self.writer = Some(Writer::start(
            self.dir.clone(),
            done.clone(),
            self.usage.clone(),
        )?);
        if let Some(spool) = self.spool.take_if(|_| spool_thread) {
            self.spool_writer = Some(SpoolWriter::start(spool, done.clone(), self.usage.clone())?);
        }
        Ok((self, done))
    }

    /// With a writer thread: acknowledge each block at once and write it only if it is still
    /// held after `delay` (module docs). Zero (the default) writes it before the
    /// acknowledgement.
    pub fn with_write_delay(mut self, delay: Duration) -> DiskCustody {
        self.write_delay = delay;
        self
    }

    /// Also make the destination's deliveries durable in `incoming`; returns the progress of
    /// the flows found there (progress older than `max_age` is deleted).
    pub fn with_spool(
        mut self,
        incoming: &Path,
        max_age: Duration,
    ) -> std::io::Result<(DiskCustody, Vec<DestProgress>)> {
        let spool = Spool::new(incoming)?;
        let progress = spool.load(max_age);
        self.gate = Some(spool::ResumeGate::new(incoming));
        if let Ok(mut u) = self.usage.lock() {
            u.incoming_bytes = progress
                .iter()
                .filter(|p| !p.finished)
                .map(|p| p.bytes)
                .sum();
        }
        self.spool = Some(spool);
        Ok((self, progress))
    }

    /// Bytes on disk counted against the limit: custody, incoming and inbox.
    fn disk_bytes(&self) -> u64 {
        let shared = self
            .usage
            .lock()
            .map(|u| u.incoming_bytes + u.inbox_bytes)
            .unwrap_or(0);
        self.bytes() + shared
    }

    fn bytes(&self) -> u64 {
        self.held.values().map(|(_, s)| *s).sum()
    }

    fn publish(&self, stored: u64, full: u64) {
        if let Ok(mut u) = self.usage.lock() {
            u.blocks = self.held.len() as u64;
            u.bytes = self.bytes();
            u.limit = self.limit;
            u.stored_total += stored;
            u.full_events += full;
        }
    }

    fn write(&self, path: &Path, block: &StoredBlock) -> std::io::Result<()> {
        write_file(path, &encode_header(block), &block.data)?;
        sync_dir(&self.dir);
        Ok(())
    }
}

impl CustodyStore for DiskCustody {
    fn persist(&mut self, block: &StoredBlock) -> Result<Persist, StoreFull> {
        let key = (block.flow, block.block_num);
        if let Some(w) = &self.writer {
            if w.writing.lock().is_ok_and(|s| s.contains(&key)) {
                return Ok(Persist::Later);
            }
        }
        if self.held.contains_key(&key) {
            return Ok(Persist::Done);
        }
        let size = block.data.len() as u64;
        if self.disk_bytes() + size > self.limit {
            warn!(flow = %block.flow, block = block.block_num, "custody storage full: acknowledgement withheld");
            self.publish(0, 1);
            return Err(StoreFull);
        }
        let path = self.dir.join(file_name(block.flow, block.block_num));
        if let Some(jobs) = self
            .writer
            .as_ref()
            .and_then(|w| w.jobs.as_ref())
            .filter(|_| !self.write_delay.is_zero())
        {
            let job = Job::Hold(
                key,
                Held {
                    path: path.clone(),
                    header: encode_header(block),
                    data: block.data.clone(),
                    due: std::time::Instant::now() + self.write_delay,
                },
            );
            if jobs.send(job).is_ok() {
                self.held.insert(key, (path, size));
                self.publish(1, 0);
                return Ok(Persist::Done);
            }
        }
        if let Some(w) = &self.writer {
            if let Ok(mut s) = w.writing.lock() {
                s.insert(key);
            }
            let job = Job::Write {
                flow: block.flow,
                block: block.block_num,
                path: path.clone(),
                header: encode_header(block),
                data: block.data.clone(),
                queued: std::time::Instant::now(),
            };
            if w.jobs.as_ref().is_some_and(|j| j.send(job).is_ok()) {
                self.held.insert(key, (path, size));
                self.publish(1, 0);
                return Ok(Persist::Later);
            }
            if let Ok(mut s) = w.writing.lock() {
                s.remove(&key);
            }
            warn!("custody writer stopped: writing on the event loop");
        }
        let started = std::time::Instant::now();
        let written = self.write(&path, block);
        if let Ok(mut u) = self.usage.lock() {
            u.time_write(started.elapsed());
        }
        if let Err(e) = written {
            warn!(error = %e, "custody write failed: acknowledgement withheld");
            let _ = std::fs::remove_file(path.with_extension("tmp"));
            self.publish(0, 1);
            return Err(StoreFull);
        }
        self.held.insert(key, (path, size));
        self.publish(1, 0);
        Ok(Persist::Done)
    }

    fn release(&mut self, flow: FlowKey, block_num: u32) {
        if let Some((path, _)) = self.held.remove(&(flow, block_num)) {
            // Queued behind the block's write, if it is still being written or waits for its
            // delay (then it is never written).
            let queued = self
                .writer
                .as_ref()
                .and_then(|w| w.jobs.as_ref())
                .is_some_and(|j| {
                    j.send(Job::Remove {
                        key: (flow, block_num),
                        path: path.clone(),
                    })
                    .is_ok()
                });
            if !queued {
                let _ = std::fs::remove_file(path);
            }
            self.publish(0, 0);
        }
    }

    fn deliver(&mut self, d: &Delivery) -> Result<Persist, StoreFull> {
        let Some(gate) = self.gate.as_mut() else {
            return Ok(Persist::Done);
        };
        if !gate.resume_possible(d) {
            return Err(StoreFull);
        }
        let size = d.data.len() as u64;
        let over = self.disk_bytes() + size > self.limit;
        let started = std::time::Instant::now();
        let result = if over {
            Err(None)
        } else if let Some(w) = &self.spool_writer {
            // Written and fsynced off the event loop; the end-to-end BACK waits for it.
            w.send(SpoolJob::Deliver {
                d: d.clone(),
                queued: started,
            })
            .map(|()| Persist::Later)
            .map_err(Some)
        } else {
            self.spool
                .as_mut()
                .map(|s| s.deliver(d).map(|()| Persist::Done).map_err(Some))
                .unwrap_or(Ok(Persist::Done))
        };
        let Ok(mut u) = self.usage.lock() else {
            return result.map_err(|_| StoreFull);
        };
        if matches!(result, Ok(Persist::Done)) {
            u.time_delivery(started.elapsed());
        }
        match result {
            Ok(p) => {
                if u.spool_full {
                    info!(flow = %d.flow, "spool has room again: deliveries resume");
                }
                u.spool_full = false;
                u.incoming_bytes += size;
                if d.fin {
                    // The finished file moves to the inbox (counted there by the daemon).
                    let total = d.offset + size;
                    u.incoming_bytes = u.incoming_bytes.saturating_sub(total);
                }
                Ok(p)
            }
            Err(e) => {
                if !u.spool_full {
                    match e {
                        None => warn!(
                            flow = %d.flow,
                            block = d.block_num,
                            used = self.bytes() + u.incoming_bytes + u.inbox_bytes,
                            limit = self.limit,
                            "spool full: end-to-end acknowledgement withheld until room is freed"
                        ),
                        Some(e) => warn!(
                            flow = %d.flow,
                            block = d.block_num,
                            error = %e,
                            "spool write failed: end-to-end acknowledgement withheld"
                        ),
                    }
                }
                u.spool_full = true;
                u.spool_full_events += 1;
                Err(StoreFull)
            }
        }
    }

    fn abandon(&mut self, flow: FlowKey) {
        if let Some(w) = &self.spool_writer {
            // In order behind the flow's queued deliveries; the writer frees the budget.
            if w.send(SpoolJob::Abandon(flow)).is_ok() {
                return;
            }
        }
        let Some(spool) = self.spool.as_mut() else {
            return;
        };
        let bytes = spool.abandon(flow);
        info!(%flow, bytes, "incoming flow abandoned: its spool files are deleted");
        if let Ok(mut u) = self.usage.lock() {
            u.incoming_bytes = u.incoming_bytes.saturating_sub(bytes);
        }
    }
}

mod spool;
mod spool_writer;
pub use spool::{parse_flow_name, part_path, read_state, state_path, state_records, Spool};
use spool_writer::{SpoolJob, SpoolWriter};

#[cfg(test)]
mod tests;
