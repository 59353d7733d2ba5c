//! Incoming files: spool writes, resume after a restart, verification, and the inbox the
//! receiving clients are offered files from.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use hop_proto::{FlowKey, TransportId};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::cmd::InboxEntry;
use super::Daemon;
use crate::flowfmt::{self, FlowHeader, HASH_LEN};

/// An incoming flow being spooled (its bytes are in `incoming/`, see [`crate::custody::Spool`]).
pub(super) struct InFlow {
    pub(super) bytes: u64,
}

impl Daemon {
    pub(super) fn deliver(&mut self, flow: FlowKey, offset: u64, data: &[u8]) {
        // Hop's store has written (and fsynced) the bytes already; the others' are written
        // here, at their offset, which makes a repeated delivery harmless.
        if self.transport_id != TransportId::Hop {
            if let Err(e) = self.spool.write(flow, offset, data) {
                warn!(%flow, error = %e, "cannot write spool file");
                self.counters.storage_errors += 1;
                return;
            }
        }
        let f = self.inflows.entry(flow).or_insert(InFlow { bytes: 0 });
        f.bytes = f.bytes.max(offset + data.len() as u64);
        self.counters.delivered_bytes += data.len() as u64;
    }

    /// Incoming flows an earlier run left in the spool: a finished one not yet moved to the
    /// inbox (stopped in between) is verified now; unfinished ones resume (the transport
    /// restored their progress) and show in the status.
    pub(super) fn resume_incoming(&mut self) {
        if self.transport_id != TransportId::Hop {
            return;
        }
        let incoming = self.cfg.storage_dir.join("incoming");
        for (flow, path, _) in crate::custody::state_records(&incoming) {
            let Some(p) = crate::custody::read_state(&path, flow) else {
                continue;
            };
            let part = crate::custody::part_path(&incoming, flow);
            if !part.exists() {
                continue;
            }
            self.inflows.insert(flow, InFlow { bytes: p.bytes });
            if p.finished {
                self.finish_incoming(flow, p.bytes);
            }
        }
    }

    /// Tell the custody store how many bytes the inbox holds (they count against the disk
    /// budget).
    pub(super) fn publish_inbox(&self) {
        let bytes = self
            .inbox
            .values()
            .map(|e| e.size + e.content_offset + HASH_LEN as u64)
            .sum();
        if let Ok(mut u) = self.custody.lock() {
            u.inbox_bytes = bytes;
        }
    }

    /// An incoming flow's last byte is durable: its file is joined to the transfer it
    /// resumes, verified and moved to the inbox by the finisher's thread (reading a large
    /// file for its hash would hold the event loop, and the node's relaying, for seconds on a
    /// router), which reports back through [`Finisher`].
    pub(super) fn finish_incoming(&mut self, flow: FlowKey, bytes: u64) {
        if self.inflows.remove(&flow).is_none() {
            warn!(%flow, "finished flow without data");
            self.counters.integrity_failures += 1;
            return;
        }
        self.spool.close(flow);
        if !self.finisher.finish(flow, bytes) {
            warn!(%flow, "file finisher stopped: the file stays in the spool until a restart");
            self.counters.storage_errors += 1;
        }
    }

    /// Take what the finisher's thread has done: count it, and offer received files.
    pub(super) fn files_finished(&mut self) {
        for done in self.finisher.take() {
            match done {
                Finished::Received(entry) => {
                    self.counters.files_received += 1;
                    self.inbox.insert(entry.flow.clone(), entry.clone());
                    self.event(serde_json::json!({
                        "event": "file", "flow": entry.flow, "from": entry.from, "name": entry.name,
                        "size": entry.size, "blake3": entry.blake3, "service": entry.service,
                    }));
                    self.publish_inbox();
                    if self.transport_id == TransportId::Hop {
                        // Progress records are kept after the finish (a restarted destination
                        // answers late retransmissions with the end-to-end BACK, and a flow
                        // resuming this one is known for a duplicate, resume.rs) as long as a
                        // source may still be trying.
                        let idle = self.cfg.hop.unfinished_flow_idle_timeout();
                        self.spool.prune_finished(idle);
                    }
                    self.offer(entry);
                }
                Finished::Duplicate => self.counters.duplicates_dropped += 1,
                Finished::Rejected => self.counters.integrity_failures += 1,
                Finished::StorageError => self.counters.storage_errors += 1,
                Finished::Kept => {}
            }
        }
    }

    /// Offers an inbox file to the newest client waiting for files, unless a client holds it
    /// already. With no client, or none left, it waits in the inbox for the next one.
    pub(super) fn offer(&mut self, entry: InboxEntry) {
        if self.offered.contains(&entry.flow) {
            return;
        }
        self.subscribers.retain(|(_, s)| !s.is_closed());
        let flow = entry.flow.clone();
        let mut entry = entry;
        // A file goes only to the clients of its service.
        let service = entry.service.clone();
        for (_, s) in self.subscribers.iter().filter(|(sv, _)| *sv == service) {
            match s.send(entry) {
                Ok(()) => {
                    self.offered.insert(flow);
                    return;
                }
                // That client left since the retain above: try the next.
                Err(mpsc::error::SendError(back)) => entry = back,
            }
        }
    }

    pub(super) fn scan_inbox(&mut self) {
        let dir = self.cfg.storage_dir.join("inbox");
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return;
        };
        for e in rd.flatten() {
            let path = e.path();
            let Some(stem) = path
                .file_stem()
                .and_then(|s| s.to_str())
                .map(str::to_string)
            else {
                continue;
            };
            let Some(from) = stem.split('-').next().and_then(|s| s.parse().ok()) else {
                continue;
            };
            let Ok(mut file) = File::open(&path) else {
                continue;
            };
            let len = file.metadata().map(|m| m.len()).unwrap_or(0);
            if let Ok((header, content_offset, hash)) = verify_spool(&mut file, len) {
                self.inbox.insert(
                    stem.clone(),
                    InboxEntry {
                        flow: stem,
                        from,
                        path,
                        name: header.name,
                        size: header.size,
                        content_offset,
                        blake3: hash,
                        service: header.service,
                    },
                );
            }
        }
    }
}

/// Check a completed spool file of `len` bytes: header, size and BLAKE3 trailer.
pub(super) fn verify_spool(
    file: &mut File,
    len: u64,
) -> Result<(FlowHeader, u64, String), flowfmt::FlowFormatError> {
    use flowfmt::FlowFormatError as E;
    file.seek(SeekFrom::Start(0)).map_err(|_| E::Incomplete)?;
    let mut head = vec![0u8; (len as usize).min(15 + flowfmt::MAX_NAME)];
    file.read_exact(&mut head).map_err(|_| E::Incomplete)?;
    let (header, hlen) = FlowHeader::decode(&head)?;
    // The size is the sender's word: checked, so that no size can overflow the sum.
    let expect = (hlen as u64 + HASH_LEN as u64).checked_add(header.size);
    if expect != Some(len) {
        return Err(E::Length {
            have: len,
            size: header.size,
        });
    }
    file.seek(SeekFrom::Start(hlen as u64))
        .map_err(|_| E::Incomplete)?;
    let mut hasher = blake3::Hasher::new();
    let mut left = header.size;
    let mut buf = vec![0u8; 1 << 16];
    while left > 0 {
        let n = (left as usize).min(buf.len());
        file.read_exact(&mut buf[..n]).map_err(|_| E::Incomplete)?;
        hasher.update(&buf[..n]);
        left -= n as u64;
    }
    let mut trailer = [0u8; HASH_LEN];
    file.read_exact(&mut trailer).map_err(|_| E::Incomplete)?;
    if hasher.finalize().as_bytes() != &trailer {
        return Err(E::HashMismatch);
    }
    Ok((header, hlen as u64, flowfmt::hex(&trailer)))
}

/// What the finisher's thread did with a finished flow's file.
pub(super) enum Finished {
    /// Verified and moved to the inbox.
    Received(InboxEntry),
    /// A resumed transfer delivered already: this copy was dropped.
    Duplicate,
    /// Failed its integrity check, or cannot be joined: moved to `rejected/`.
    Rejected,
    /// Joining, reading or moving it failed: it stays in the spool.
    StorageError,
    /// Another flow resumes it: its bytes stay for that one.
    Kept,
}

/// The thread that joins, verifies and moves finished files, in the order they finish (a
/// resumed transfer's chain of files is touched by one thread only).
pub(super) struct Finisher {
    jobs: Option<std::sync::mpsc::Sender<(FlowKey, u64)>>,
    thread: Option<std::thread::JoinHandle<()>>,
    done: std::sync::Arc<std::sync::Mutex<Vec<Finished>>>,
    /// Woken when the thread has finished a file.
    pub(super) notify: std::sync::Arc<tokio::sync::Notify>,
}

impl Finisher {
    pub(super) fn start(storage: &Path) -> std::io::Result<Finisher> {
        let (tx, rx) = std::sync::mpsc::channel::<(FlowKey, u64)>();
        let done: std::sync::Arc<std::sync::Mutex<Vec<Finished>>> = Default::default();
        let notify: std::sync::Arc<tokio::sync::Notify> = Default::default();
        let (d, n, storage) = (done.clone(), notify.clone(), storage.to_path_buf());
        let thread = std::thread::Builder::new()
            .name("hopd-finish".into())
            .spawn(move || {
                for (flow, bytes) in rx {
                    let f = finish_file(&storage, flow, bytes);
                    if let Ok(mut v) = d.lock() {
                        v.push(f);
                    }
                    n.notify_one();
                }
            })?;
        Ok(Finisher {
            jobs: Some(tx),
            thread: Some(thread),
            done,
            notify,
        })
    }

    /// Queue a finished flow's file; false if the thread is gone.
    fn finish(&self, flow: FlowKey, bytes: u64) -> bool {
        self.jobs
            .as_ref()
            .is_some_and(|j| j.send((flow, bytes)).is_ok())
    }

    fn take(&self) -> Vec<Finished> {
        self.done
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

impl Drop for Finisher {
    fn drop(&mut self) {
        // Finish the files queued (a file not yet moved is verified again at the next start).
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Join a finished flow's file to the transfer it resumes, verify it, and move it to the
/// inbox (`storage` is the storage directory).
fn finish_file(storage: &Path, flow: FlowKey, bytes: u64) -> Finished {
    let name = format!("{}-{:08x}", flow.src, flow.id);
    let incoming = storage.join("incoming");
    let mut part = crate::custody::part_path(&incoming, flow);
    let mut bytes = bytes;
    // Resumed transfers (resume.rs): the file is delivered once, by the last flow.
    if let Some(by) = crate::resume::resumed_by(&incoming, flow) {
        info!(%flow, resumed_by = %by, "flow finished after another resumed it: its bytes stay for that one");
        return Finished::Kept;
    }
    let resumes = flowfmt::ResumeHeader::read(&part);
    if let Some(r) = resumes {
        match crate::resume::join(&incoming, flow, &r, bytes) {
            Ok(crate::resume::Joined::File { path, len }) => {
                info!(%flow, resumes = %r.prev, offset = r.offset, "resumed transfer joined");
                let _ = std::fs::remove_file(&part);
                part = path;
                bytes = len;
            }
            Ok(crate::resume::Joined::Duplicate) => {
                info!(%flow, resumes = %r.prev, "resumed transfer was delivered already: this copy is dropped");
                let _ = std::fs::remove_file(&part);
                crate::resume::release_chain(&incoming, r.prev);
                return Finished::Duplicate;
            }
            Ok(crate::resume::Joined::Missing) => {
                warn!(%flow, resumes = %r.prev, offset = r.offset, "resumed transfer cannot be joined: the bytes before it are gone");
                reject(storage, &part, &name);
                return Finished::Rejected;
            }
            Err(e) => {
                warn!(%flow, error = %e, "cannot join a resumed transfer");
                return Finished::StorageError;
            }
        }
    }
    let checked = match File::open(&part) {
        Ok(mut file) => {
            let r = verify_spool(&mut file, bytes);
            let _ = file.sync_all();
            r
        }
        Err(_) => Err(flowfmt::FlowFormatError::Incomplete),
    };
    if let Some(r) = resumes {
        crate::resume::release_chain(&incoming, r.prev);
    }
    match checked {
        Ok((header, content_offset, hash)) => {
            let dst = storage.join("inbox").join(format!("{name}.flow"));
            if let Err(e) = std::fs::rename(&part, &dst) {
                warn!(%flow, error = %e, "cannot move file to inbox");
                return Finished::StorageError;
            }
            info!(%flow, name = %header.name, size = header.size, "file received and verified");
            Finished::Received(InboxEntry {
                flow: name,
                from: flow.src,
                path: dst,
                name: header.name,
                size: header.size,
                content_offset,
                blake3: hash,
                service: header.service,
            })
        }
        Err(e) => {
            warn!(%flow, error = %e, "received file failed its integrity check");
            reject(storage, &part, &name);
            Finished::Rejected
        }
    }
}

/// A received file that cannot be delivered goes to `rejected/` for the operator.
fn reject(storage: &Path, part: &Path, name: &str) {
    let to = storage.join("rejected").join(format!("{name}.flow"));
    let _ = std::fs::rename(part, to);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spool file as a source sends it: header, content, BLAKE3 trailer.
    fn spool_file(content: &[u8]) -> Vec<u8> {
        let header = FlowHeader {
            name: "a.bin".into(),
            size: content.len() as u64,
            service: None,
        };
        let mut v = header.encode();
        v.extend_from_slice(content);
        v.extend_from_slice(blake3::hash(content).as_bytes());
        v
    }

    /// The finisher's thread moves an intact file to the inbox and a corrupt one to
    /// `rejected/`, and reports each, in order.
    #[test]
    fn finished_files_are_verified_and_moved_off_the_event_loop() {
        let dir = tempfile::tempdir().unwrap();
        for d in ["incoming", "inbox", "rejected"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let (good, bad) = (FlowKey { src: 1, id: 1 }, FlowKey { src: 1, id: 2 });
        let file = spool_file(&[7u8; 5000]);
        let incoming = dir.path().join("incoming");
        std::fs::write(crate::custody::part_path(&incoming, good), &file).unwrap();
        let mut corrupt = file.clone();
        corrupt[100] ^= 1;
        std::fs::write(crate::custody::part_path(&incoming, bad), &corrupt).unwrap();
        let f = Finisher::start(dir.path()).unwrap();
        assert!(f.finish(good, file.len() as u64));
        assert!(f.finish(bad, file.len() as u64));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut got = Vec::new();
        while got.len() < 2 && std::time::Instant::now() < deadline {
            got.extend(f.take());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            matches!(&got[..], [Finished::Received(e), Finished::Rejected]
                if e.name == "a.bin" && e.size == 5000 && e.path.exists()),
            "{}",
            got.len()
        );
        assert!(dir.path().join("rejected/1-00000002.flow").exists());
        assert!(!crate::custody::part_path(&incoming, good).exists());
    }
}
