//! A destination's durable deliveries ([`Spool`]): each block delivered in order is written at
//! its offset into `incoming/<src>-<flow id>.part`, and the flow's progress into
//! `incoming/<src>-<flow id>.state`, both fsynced before the end-to-end BACK that covers the
//! block (module docs of `custody`).

use super::*;

const STATE_MAGIC: &[u8; 4] = b"HOPS";
/// A progress record: magic, sequence, next block, bytes, finished, BLAKE3 prefix.
const STATE_LEN: usize = 4 + 8 + 4 + 8 + 1 + 8;
/// Two record slots, written alternately, so a torn write leaves the previous record intact.
const STATE_SLOT: u64 = 64;

/// Path of a flow's spool file in `incoming`.
pub fn part_path(incoming: &Path, flow: FlowKey) -> PathBuf {
    incoming.join(format!("{}-{:08x}.part", flow.src, flow.id))
}

/// Path of a flow's progress record in `incoming`.
pub fn state_path(incoming: &Path, flow: FlowKey) -> PathBuf {
    incoming.join(format!("{}-{:08x}.state", flow.src, flow.id))
}

fn encode_state(seq: u64, p: &DestProgress) -> [u8; STATE_LEN] {
    let mut v = [0u8; STATE_LEN];
    v[..4].copy_from_slice(STATE_MAGIC);
    v[4..12].copy_from_slice(&seq.to_be_bytes());
    v[12..16].copy_from_slice(&p.next_block.to_be_bytes());
    v[16..24].copy_from_slice(&p.bytes.to_be_bytes());
    v[24] = u8::from(p.finished);
    let h = blake3::hash(&v[..25]);
    v[25..].copy_from_slice(&h.as_bytes()[..8]);
    v
}

fn decode_state(flow: FlowKey, v: &[u8]) -> Option<(u64, DestProgress)> {
    if v.len() < STATE_LEN || &v[..4] != STATE_MAGIC {
        return None;
    }
    if blake3::hash(&v[..25]).as_bytes()[..8] != v[25..STATE_LEN] {
        return None;
    }
    let seq = u64::from_be_bytes(v[4..12].try_into().ok()?);
    Some((
        seq,
        DestProgress {
            flow,
            next_block: u32::from_be_bytes(v[12..16].try_into().ok()?),
            bytes: u64::from_be_bytes(v[16..24].try_into().ok()?),
            finished: v[24] != 0,
        },
    ))
}

/// The newest valid progress record in a state file.
pub fn read_state(path: &Path, flow: FlowKey) -> Option<DestProgress> {
    let v = std::fs::read(path).ok()?;
    (0..2)
        .filter_map(|slot| {
            let at = slot * STATE_SLOT as usize;
            v.get(at..).and_then(|r| decode_state(flow, r))
        })
        .max_by_key(|(seq, _)| *seq)
        .map(|(_, p)| p)
}

/// The flow a spool file name (`<src>-<flow id hex>.<ext>`) belongs to.
/// The progress records (`<src>-<id>.state`) in the spool directory `incoming`: each with its
/// flow, path and the time since it was last written (zero if unknown).
pub fn state_records(incoming: &Path) -> Vec<(FlowKey, PathBuf, Duration)> {
    let Ok(rd) = std::fs::read_dir(incoming) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let path = e.path();
            if path.extension().and_then(|x| x.to_str()) != Some("state") {
                return None;
            }
            let flow = path
                .file_stem()
                .and_then(|s| s.to_str())
                .and_then(parse_flow_name)?;
            let age = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .unwrap_or_default();
            Some((flow, path, age))
        })
        .collect()
}

pub fn parse_flow_name(stem: &str) -> Option<FlowKey> {
    let (src, id) = stem.split_once('-')?;
    Some(FlowKey {
        src: src.parse().ok()?,
        id: u32::from_str_radix(id, 16).ok()?,
    })
}

struct SpoolFlow {
    part: File,
    /// Opened by the first durable delivery (transports without one have no record).
    state: Option<File>,
    seq: u64,
    /// Bytes delivered durably so far.
    bytes: u64,
}

/// A destination's incoming flows on disk: bytes at their offsets, progress beside them.
pub struct Spool {
    dir: PathBuf,
    open: HashMap<FlowKey, SpoolFlow>,
}

/// Whether a delivery may go on (resume.rs); kept on the event loop, beside a spool that may
/// be on a writer thread.
pub(super) struct ResumeGate {
    dir: PathBuf,
    /// Resuming flows whose delivery is withheld (logged once each).
    unjoinable: HashSet<FlowKey>,
}

impl ResumeGate {
    pub(super) fn new(dir: &Path) -> ResumeGate {
        ResumeGate {
            dir: dir.to_path_buf(),
            unjoinable: HashSet::new(),
        }
    }

    /// A delivery may go on: anything but the first block of a flow that resumes one whose
    /// bytes are gone (resume.rs), which is withheld (and logged once).
    pub(super) fn resume_possible(&mut self, d: &Delivery) -> bool {
        if d.offset != 0 {
            return true;
        }
        let Some(r) = ResumeHeader::decode(&d.data) else {
            return true;
        };
        if crate::resume::possible(&self.dir, &r) {
            self.unjoinable.remove(&d.flow);
            if let Err(e) = crate::resume::note_resumer(&self.dir, r.prev, d.flow) {
                warn!(flow = %d.flow, error = %e, "cannot note a resuming flow; its delivery waits");
                return false;
            }
            return true;
        }
        if self.unjoinable.insert(d.flow) {
            warn!(
                flow = %d.flow,
                resumes = %r.prev,
                offset = r.offset,
                "a flow resumes one whose bytes this node no longer holds: its delivery is \
                 withheld, and its source sends the file again from the start once it gives up"
            );
        }
        false
    }
}

impl Spool {
    pub fn new(dir: &Path) -> std::io::Result<Spool> {
        std::fs::create_dir_all(dir)?;
        Ok(Spool {
            dir: dir.to_path_buf(),
            open: HashMap::new(),
        })
    }

    /// Progress of every flow in the spool (at start-up). An unfinished flow's record and
    /// spool file not touched for `max_age` are deleted (the transport gave such a flow up
    /// while the node was down); a finished flow whose file is still here is kept, whatever
    /// its age, to be verified and moved to the inbox (it stopped in between).
    pub fn load(&self, max_age: Duration) -> Vec<DestProgress> {
        let mut out = Vec::new();
        for (flow, path, age) in state_records(&self.dir) {
            let part = part_path(&self.dir, flow);
            match read_state(&path, flow) {
                Some(p) if age < max_age || (p.finished && part.exists()) => out.push(p),
                _ => {
                    let _ = std::fs::remove_file(&path);
                    if age >= max_age {
                        let _ = std::fs::remove_file(part);
                    }
                }
            }
        }
        // Spool files without a progress record are kept only for a flow that resumes them;
        // notes of resumers only beside a spool file.
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                let path = e.path();
                let flow = path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .and_then(parse_flow_name);
                let Some(flow) = flow else {
                    continue;
                };
                if path.extension().is_some_and(|x| x == "resumers") {
                    if !part_path(&self.dir, flow).exists() {
                        let _ = std::fs::remove_file(path);
                    }
                    continue;
                }
                if path.extension().is_none_or(|x| x != "part") {
                    continue;
                }
                if !state_path(&self.dir, flow).exists()
                    && crate::resume::resumed_by(&self.dir, flow).is_none()
                {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        out
    }

    /// Delete the progress records of finished flows whose files have left the spool and
    /// that are older than `max_age` (kept until then so that a restarted destination can
    /// answer late retransmissions). Unfinished flows are left alone: they end through
    /// [`abandon`](Self::abandon).
    pub fn prune_finished(&self, max_age: Duration) {
        for (flow, path, age) in state_records(&self.dir) {
            if age < max_age || part_path(&self.dir, flow).exists() {
                continue;
            }
            if read_state(&path, flow).is_some_and(|p| p.finished) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    /// An incoming flow ended unfinished: close and delete its files. Returns the bytes it
    /// had delivered (counted in the disk budget until now). A flow that another resumes
    /// keeps its spool file for that one (resume.rs); the flows it resumed lose theirs once
    /// nothing needs them.
    pub fn abandon(&mut self, flow: FlowKey) -> u64 {
        let state = state_path(&self.dir, flow);
        let bytes = match self.open.remove(&flow) {
            Some(f) => f.bytes,
            None => read_state(&state, flow)
                .filter(|p| !p.finished)
                .map_or(0, |p| p.bytes),
        };
        let part = part_path(&self.dir, flow);
        let earlier = ResumeHeader::read(&part).map(|r| r.prev);
        let _ = std::fs::remove_file(state);
        if let Some(by) = crate::resume::resumed_by(&self.dir, flow) {
            info!(%flow, resumed_by = %by, "abandoned flow's bytes kept for the flow that resumes it");
        } else {
            let _ = std::fs::remove_file(part);
            crate::resume::forget_resumers(&self.dir, flow);
        }
        if let Some(prev) = earlier {
            crate::resume::release_chain(&self.dir, prev);
        }
        sync_dir(&self.dir);
        bytes
    }

    fn flow(&mut self, flow: FlowKey) -> std::io::Result<&mut SpoolFlow> {
        if !self.open.contains_key(&flow) {
            let f = SpoolFlow {
                part: open_rw(&part_path(&self.dir, flow))?,
                state: None,
                seq: 0,
                bytes: 0,
            };
            sync_dir(&self.dir);
            self.open.insert(flow, f);
        }
        self.open
            .get_mut(&flow)
            .ok_or_else(|| std::io::Error::other("spool flow vanished"))
    }

    /// Write bytes at their offset (no fsync): for transports without durable delivery.
    pub fn write(&mut self, flow: FlowKey, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.flow(flow)?.part.write_all_at(data, offset)
    }

    /// Write a block delivered in order and its progress, both fsynced.
    pub fn deliver(&mut self, d: &Delivery) -> std::io::Result<()> {
        self.write_block(d)?;
        self.commit(&progress_after(d))
    }

    /// Write a delivered block's bytes at their offset, not yet fsynced: [`commit`](Self::commit)
    /// makes them durable, with the flow's progress.
    pub fn write_block(&mut self, d: &Delivery) -> std::io::Result<()> {
        let f = self.flow(d.flow)?;
        f.part.write_all_at(&d.data, d.offset)?;
        f.bytes = f.bytes.max(d.offset + d.data.len() as u64);
        Ok(())
    }

    /// Make a flow's written blocks durable and record `p` as its progress (a new record
    /// slot, fsynced after the bytes it describes).
    pub fn commit(&mut self, p: &DestProgress) -> std::io::Result<()> {
        let dir = self.dir.clone();
        let f = self.flow(p.flow)?;
        f.part.sync_data()?;
        if f.state.is_none() {
            let spath = state_path(&dir, p.flow);
            f.seq = read_state_seq(&spath);
            f.state = Some(open_rw(&spath)?);
            sync_dir(&dir);
        }
        let Some(state) = f.state.as_ref() else {
            return Err(std::io::Error::other("progress record not open"));
        };
        let seq = f.seq + 1;
        let rec = encode_state(seq, p);
        state.write_all_at(&rec, (seq % 2) * STATE_SLOT)?;
        state.sync_data()?;
        f.seq = seq;
        if p.finished {
            self.open.remove(&p.flow);
        }
        Ok(())
    }

    /// Close a flow's files (it finished or was abandoned).
    pub fn close(&mut self, flow: FlowKey) {
        self.open.remove(&flow);
    }

    /// Flush every open spool file (at shutdown).
    pub fn sync_all(&self) {
        for f in self.open.values() {
            let _ = f.part.sync_all();
        }
    }
}

/// The progress a flow has once `d` is delivered.
pub(super) fn progress_after(d: &Delivery) -> DestProgress {
    DestProgress {
        flow: d.flow,
        next_block: d.block_num.wrapping_add(1),
        bytes: d.offset + d.data.len() as u64,
        finished: d.fin,
    }
}

fn open_rw(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
}

fn read_state_seq(path: &Path) -> u64 {
    let Ok(v) = std::fs::read(path) else {
        return 0;
    };
    (0..2)
        .filter_map(|slot| v.get(slot * STATE_SLOT as usize..))
        .filter_map(|r| decode_state(FlowKey { src: 0, id: 0 }, r))
        .map(|(seq, _)| seq)
        .max()
        .unwrap_or(0)
}
