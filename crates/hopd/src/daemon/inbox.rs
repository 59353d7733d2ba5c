//! Incoming files: spool writes, resume after a restart, verification, and the inbox the
//! receiving clients are offered files from.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

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

    pub(super) fn finish_incoming(&mut self, flow: FlowKey, bytes: u64) {
        let name = format!("{}-{:08x}", flow.src, flow.id);
        if self.inflows.remove(&flow).is_none() {
            warn!(%flow, "finished flow without data");
            self.counters.integrity_failures += 1;
            return;
        }
        self.spool.close(flow);
        let incoming = self.cfg.storage_dir.join("incoming");
        let mut part = crate::custody::part_path(&incoming, flow);
        let mut bytes = bytes;
        // Resumed transfers (resume.rs): the file is delivered once, by the last flow.
        if let Some(by) = crate::resume::resumed_by(&incoming, flow) {
            info!(%flow, resumed_by = %by, "flow finished after another resumed it: its bytes stay for that one");
            return;
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
                    self.counters.duplicates_dropped += 1;
                    let _ = std::fs::remove_file(&part);
                    crate::resume::release_chain(&incoming, r.prev);
                    return;
                }
                Ok(crate::resume::Joined::Missing) => {
                    warn!(%flow, resumes = %r.prev, offset = r.offset, "resumed transfer cannot be joined: the bytes before it are gone");
                    self.reject(&part, &name);
                    return;
                }
                Err(e) => {
                    warn!(%flow, error = %e, "cannot join a resumed transfer");
                    self.counters.storage_errors += 1;
                    return;
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
                let dst = self
                    .cfg
                    .storage_dir
                    .join("inbox")
                    .join(format!("{name}.flow"));
                if let Err(e) = std::fs::rename(&part, &dst) {
                    warn!(%flow, error = %e, "cannot move file to inbox");
                    self.counters.storage_errors += 1;
                    return;
                }
                info!(%flow, name = %header.name, size = header.size, "file received and verified");
                self.counters.files_received += 1;
                let entry = InboxEntry {
                    flow: name.clone(),
                    from: flow.src,
                    path: dst,
                    name: header.name,
                    size: header.size,
                    content_offset,
                    blake3: hash,
                    service: header.service,
                };
                self.inbox.insert(name, entry.clone());
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
                    let idle =
                        crate::transport::hop_config(&self.cfg).unfinished_flow_idle_timeout();
                    self.spool.prune_finished(idle);
                }
                self.offer(entry);
            }
            Err(e) => {
                warn!(%flow, error = %e, "received file failed its integrity check");
                self.reject(&part, &name);
            }
        }
    }

    /// A received file that cannot be delivered goes to `rejected/` for the operator, counted.
    fn reject(&mut self, part: &std::path::Path, name: &str) {
        self.counters.integrity_failures += 1;
        let to = self
            .cfg
            .storage_dir
            .join("rejected")
            .join(format!("{name}.flow"));
        let _ = std::fs::rename(part, to);
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
