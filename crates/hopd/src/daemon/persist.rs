//! Detached transfers survive a restart of their source: `hop send --detach` hands the file
//! to the node, so the node keeps it on disk (`storage/outgoing/`: the flow's bytes as handed
//! to the transport, and a record of where they go and how far the destination acknowledged
//! them) until the transfer completes, fails, expires or is cancelled.
//!
//! A restarted hopd resumes each kept transfer (with Hop) at the byte the destination had
//! acknowledged end to end: a new flow that starts with a resume header naming the flow it
//! continues, then the rest of the bytes; the destination joins the two (resume.rs). Once the
//! destination has the new flow's header, the earlier flow is aborted along its path, which
//! frees what relays still hold of it. A transfer whose destination has gone without news of
//! it for longer than `give_up_after` (it has given the earlier flow up, and its bytes) is
//! sent again from its first byte, still naming the earlier flow, so that the file is
//! delivered once even if the earlier flow was delivered after all.

use crate::durable::write_durably;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use hop_proto::{FlowKey, NodeId, TransportId};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use super::cmd::Cmd;
use super::outgoing::OutFlow;
use super::Daemon;

/// Where a persisted transfer goes.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    to: NodeId,
    name: String,
    size: u64,
    service: Option<String>,
    /// End of its lifetime, Unix seconds.
    lifetime_until_unix: Option<u64>,
    /// Every byte is on disk (a record without it is a transfer cut off while handed over).
    complete: bool,
    /// The flow this one resumes (source, id) and the byte of the kept bytes where this
    /// flow's own bytes start; none: the flow carries the kept bytes from the first.
    #[serde(default)]
    resumes: Option<(NodeId, u32, u64)>,
    /// Bytes of this flow (its resume header included) acknowledged end to end.
    #[serde(default)]
    acked: u64,
    /// When the destination last acknowledged bytes of the transfer (or it was handed
    /// over), Unix seconds.
    #[serde(default)]
    progress_unix: u64,
    /// Earlier flows of the transfer, aborted along their path once the destination has
    /// this flow's resume header.
    #[serde(default)]
    supersedes: Vec<(NodeId, u32)>,
    #[serde(default)]
    priority: crate::api::Priority,
}

impl Record {
    /// Length of the flow's resume header (0: none).
    fn header_len(&self) -> u64 {
        if self.resumes.is_some() {
            crate::flowfmt::RESUME_LEN as u64
        } else {
            0
        }
    }

    /// Byte of the kept bytes where this flow's own bytes start.
    fn base(&self) -> u64 {
        self.resumes.map_or(0, |(_, _, at)| at)
    }
}

/// What a detached transfer is: where it goes and how.
pub(super) struct Detached {
    pub(super) to: NodeId,
    pub(super) name: String,
    pub(super) size: u64,
    pub(super) service: Option<String>,
    pub(super) lifetime: Option<Duration>,
    pub(super) priority: crate::api::Priority,
}

/// A transfer kept on disk.
#[derive(Debug)]
pub(super) struct Persisted {
    data: PathBuf,
    record: PathBuf,
    file: Option<std::fs::File>,
    rec: Record,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn name_of(flow: FlowKey) -> String {
    format!("{}-{:08x}", flow.src, flow.id)
}

impl Persisted {
    /// Append the flow's next bytes; with `last`, make them durable and mark the record
    /// complete.
    pub(super) fn append(&mut self, data: &[u8], last: bool) -> std::io::Result<()> {
        let f = self
            .file
            .as_mut()
            .ok_or_else(|| std::io::Error::other("the transfer was already complete"))?;
        f.write_all(data)?;
        if last {
            f.sync_all()?;
            self.file = None;
            self.rec.complete = true;
            let json = serde_json::to_vec(&self.rec).map_err(std::io::Error::other)?;
            write_durably(&self.record, &json)?;
        }
        Ok(())
    }

    /// The data file and its length.
    pub(super) fn data_file(&self) -> (PathBuf, u64) {
        let len = std::fs::metadata(&self.data).map(|m| m.len()).unwrap_or(0);
        (self.data.clone(), len)
    }

    /// Still receiving its bytes from the client.
    pub(super) fn writing(&self) -> bool {
        self.file.is_some()
    }

    /// The transfer ended: its files go. Returns the earlier flows still to abort.
    pub(super) fn forget(self) -> Vec<FlowKey> {
        let _ = std::fs::remove_file(&self.record);
        let _ = std::fs::remove_file(&self.data);
        self.rec
            .supersedes
            .iter()
            .map(|&(src, id)| FlowKey { src, id })
            .collect()
    }

    /// The destination acknowledged `bytes` of the flow end to end. Returns the earlier flows
    /// to abort now (the destination has this flow's resume header), and the bytes of the
    /// kept transfer it holds.
    pub(super) fn acknowledged(&mut self, bytes: u64) -> (Vec<FlowKey>, u64) {
        if bytes <= self.rec.acked {
            return (Vec::new(), self.held());
        }
        self.rec.acked = bytes;
        self.rec.progress_unix = unix_now();
        let h = self.rec.header_len();
        let abort = if bytes >= h && !self.rec.supersedes.is_empty() {
            std::mem::take(&mut self.rec.supersedes)
        } else {
            Vec::new()
        };
        // Not synced: a record lost in a crash resumes at an earlier byte, which is as good.
        if let Ok(json) = serde_json::to_vec(&self.rec) {
            let tmp = self.record.with_extension("tmp");
            if std::fs::write(&tmp, json).is_ok() {
                let _ = std::fs::rename(&tmp, &self.record);
            }
        }
        let abort = abort
            .into_iter()
            .map(|(src, id)| FlowKey { src, id })
            .collect();
        (abort, self.held())
    }

    /// Bytes of the kept transfer the destination acknowledged.
    fn held(&self) -> u64 {
        let h = self.rec.header_len();
        if self.rec.acked >= h {
            self.rec.base() + self.rec.acked - h
        } else {
            self.rec.base()
        }
    }
}

impl Daemon {
    fn outgoing_dir(&self) -> PathBuf {
        self.cfg.storage_dir.join("outgoing")
    }

    /// Start keeping a detached transfer on disk.
    pub(super) fn persist_open(&self, flow: FlowKey, t: Detached) -> std::io::Result<Persisted> {
        let Detached {
            to,
            name,
            size,
            service,
            lifetime,
            priority,
        } = t;
        let dir = self.outgoing_dir();
        std::fs::create_dir_all(&dir)?;
        let base = dir.join(name_of(flow));
        let rec = Record {
            to,
            name,
            size,
            service,
            lifetime_until_unix: lifetime.map(|l| unix_now() + l.as_secs()),
            complete: false,
            resumes: None,
            acked: 0,
            progress_unix: unix_now(),
            supersedes: Vec::new(),
            priority,
        };
        let record = base.with_extension("json");
        write_durably(
            &record,
            &serde_json::to_vec(&rec).map_err(std::io::Error::other)?,
        )?;
        let data = base.with_extension("data");
        let file = std::fs::File::create(&data)?;
        Ok(Persisted {
            data,
            record,
            file: Some(file),
            rec,
        })
    }

    /// Hand a kept transfer's bytes from disk to the transport.
    pub(super) fn feed_persisted(&self, flow: FlowKey, path: PathBuf, len: u64) {
        self.feed_kept(flow, path, Vec::new(), 0, len);
    }

    /// Hand `header`, then the kept bytes `[start, len)` of the file at `path`, to the
    /// transport.
    fn feed_kept(&self, flow: FlowKey, path: PathBuf, header: Vec<u8>, start: u64, len: u64) {
        let Some(cmds) = self.cmds.clone() else {
            warn!(%flow, "no command channel to feed a kept transfer");
            return;
        };
        let first = self.first_bytes.max(crate::api::DATA_CHUNK);
        let src = Source {
            path,
            header,
            start,
            len,
        };
        tokio::spawn(feed_from_disk(cmds, flow, src, first));
    }

    /// Send again the detached transfers a previous run kept, and feed later ones from disk
    /// through `cmds` (called once, before the event loop starts). Records cut off while
    /// being handed over are deleted.
    pub fn restore_outgoing(&mut self, cmds: mpsc::Sender<Cmd>) {
        self.cmds = Some(cmds);
        let dir = self.outgoing_dir();
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return;
        };
        let mut records: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        records.sort();
        for record in records {
            let data = record.with_extension("data");
            let rec: Option<Record> = std::fs::read(&record)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            let Some(rec) = rec.filter(|r| r.complete) else {
                warn!(file = %record.display(), "dropping a transfer cut off while it was handed over");
                let _ = std::fs::remove_file(&record);
                let _ = std::fs::remove_file(&data);
                continue;
            };
            let left = rec
                .lifetime_until_unix
                .map(|u| Duration::from_secs(u.saturating_sub(unix_now())));
            if left.is_some_and(|l| l.is_zero()) {
                warn!(name = %rec.name, to = rec.to, "detached transfer expired while hopd was down");
                self.counters.flows_failed += 1;
                let _ = std::fs::remove_file(&record);
                let _ = std::fs::remove_file(&data);
                continue;
            }
            let mut rec = rec;
            let earlier = record
                .file_stem()
                .and_then(|s| s.to_str())
                .and_then(crate::custody::parse_flow_name);
            // Where the new flow starts (resume.rs): at the byte the destination
            // acknowledged, or at the first if it will have given the earlier flow up.
            let resume = earlier
                .filter(|_| self.transport_id == TransportId::Hop)
                .map(|old| {
                    let give_up = self.cfg.hop.unfinished_flow_idle_timeout();
                    let stale = unix_now().saturating_sub(rec.progress_unix) > give_up.as_secs();
                    let h = rec.header_len();
                    let at = if stale {
                        (old, 0)
                    } else if rec.acked >= h {
                        (old, rec.base() + rec.acked - h)
                    } else {
                        // Not even the resume header arrived: resume what the earlier one did.
                        let (src, id, at) = rec.resumes.expect("a header means a resume");
                        (FlowKey { src, id }, at)
                    };
                    rec.supersedes.push((old.src, old.id));
                    at
                });
            let now = self.now();
            let flow = match self.node.open(now, self.transport_id, rec.to) {
                Ok(f) => f,
                Err(e) => {
                    warn!(name = %rec.name, to = rec.to, error = %e, "cannot send a kept transfer again; it stays for the next start");
                    continue;
                }
            };
            if let Some(l) = left {
                let _ = self.node.set_lifetime(now, flow, now + l);
            }
            let priority = rec.priority;
            if priority != crate::api::Priority::Normal {
                let _ = self.node.set_priority(now, flow, priority.wire());
            }
            // The files take the new flow's name.
            let base = self.outgoing_dir().join(name_of(flow));
            let (new_record, new_data) = (base.with_extension("json"), base.with_extension("data"));
            if std::fs::rename(&data, &new_data).is_err()
                || std::fs::rename(&record, &new_record).is_err()
            {
                warn!(name = %rec.name, "cannot rename a kept transfer's files");
                let _ = self.node.abort(now, flow);
                continue;
            }
            let len = std::fs::metadata(&new_data).map(|m| m.len()).unwrap_or(0);
            let (header, start) = match resume {
                Some((prev, at)) => {
                    rec.resumes = Some((prev.src, prev.id, at));
                    rec.acked = 0;
                    let h = crate::flowfmt::ResumeHeader { prev, offset: at };
                    info!(%flow, to = rec.to, name = %rec.name, size = rec.size, resumes = %prev, at, left = len.saturating_sub(at), "resuming a kept (detached) transfer");
                    if at > 0 {
                        self.counters.transfers_resumed += 1;
                    }
                    (h.encode(), at.min(len))
                }
                None => {
                    info!(%flow, to = rec.to, name = %rec.name, size = rec.size, "sending a kept (detached) transfer again");
                    (Vec::new(), 0)
                }
            };
            if let Ok(json) = serde_json::to_vec(&rec) {
                if let Err(e) = write_durably(&new_record, &json) {
                    warn!(name = %rec.name, error = %e, "cannot update a kept transfer's record");
                }
            }
            let (updates, _) = mpsc::unbounded_channel();
            self.out.insert(
                flow,
                OutFlow {
                    updates,
                    pending: Default::default(),
                    bytes_accepted: 0,
                    to: rec.to,
                    finish: false,
                    name: rec.name.clone(),
                    size: rec.size,
                    opened: std::time::Instant::now(),
                    detached: true,
                    expires: left.map(|l| std::time::Instant::now() + l),
                    bytes_acked: 0,
                    persisted: Some(Persisted {
                        data: new_data.clone(),
                        record: new_record,
                        file: None,
                        rec,
                    }),
                    dest_full: false,
                    priority,
                },
            );
            self.feed_kept(flow, new_data, header, start, len);
        }
    }
}

/// What a kept transfer's flow carries: `header`, then the file's bytes `[start, len)`.
struct Source {
    path: PathBuf,
    header: Vec<u8>,
    start: u64,
    len: u64,
}

/// Hand a kept transfer's bytes to the core as a sending client would: the first `first`
/// bytes together, then chunk by chunk, at most four chunks queued.
async fn feed_from_disk(cmds: mpsc::Sender<Cmd>, flow: FlowKey, src: Source, first: usize) {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let Source {
        path,
        header,
        start,
        len,
    } = src;
    let opened = match tokio::fs::File::open(&path).await {
        Ok(mut f) => f.seek(std::io::SeekFrom::Start(start)).await.map(|_| f),
        Err(e) => Err(e),
    };
    let Ok(mut f) = opened else {
        let _ = cmds.send(Cmd::Abort { flow }).await;
        return;
    };
    let mut sent = start;
    let mut head = header;
    let mut window: std::collections::VecDeque<oneshot::Receiver<()>> = Default::default();
    let mut chunk = first;
    while sent < len || !head.is_empty() {
        let n = (len - sent).min(chunk.saturating_sub(head.len()) as u64) as usize;
        chunk = crate::api::DATA_CHUNK;
        let mut buf = std::mem::take(&mut head);
        let at = buf.len();
        buf.resize(at + n, 0);
        if f.read_exact(&mut buf[at..]).await.is_err() {
            warn!(%flow, file = %path.display(), "a kept transfer's file is shorter than it was");
            let _ = cmds.send(Cmd::Abort { flow }).await;
            return;
        }
        sent += n as u64;
        let (tx, rx) = oneshot::channel();
        let data = Cmd::Data {
            flow,
            data: Bytes::from(buf),
            done: tx,
            last: sent >= len,
        };
        if cmds.send(data).await.is_err() {
            return;
        }
        window.push_back(rx);
        while window.len() >= 4 {
            if window.pop_front().expect("not empty").await.is_err() {
                return;
            }
        }
    }
}
