//! Blocks in custody, persisted in the storage directory.
//!
//! Each block is one file `custody/<src>-<flow id>-<block>.blk`: a fixed header then the
//! block's bytes. It is written to a temporary name, fsynced, renamed and the directory
//! fsynced before the transport acknowledges the block upstream, so a node killed at any
//! moment either still holds the block or never acknowledged it.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use hop_proto::hop::{CustodyStore, StoreFull, StoredBlock};
use hop_proto::FlowKey;
use tracing::warn;

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
}

/// A [`CustodyStore`] on disk, bounded to `limit` bytes.
pub struct DiskCustody {
    dir: PathBuf,
    limit: u64,
    held: HashMap<(FlowKey, u32), (PathBuf, u64)>,
    usage: std::sync::Arc<std::sync::Mutex<CustodyUsage>>,
}

fn file_name(flow: FlowKey, block: u32) -> String {
    format!("{}-{:08x}-{block}.blk", flow.src, flow.id)
}

fn encode(b: &StoredBlock) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN + b.data.len());
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&b.flow.src.to_be_bytes());
    v.extend_from_slice(&b.flow.id.to_be_bytes());
    v.extend_from_slice(&b.dst.to_be_bytes());
    v.extend_from_slice(&b.block_num.to_be_bytes());
    v.extend_from_slice(&b.offset.to_be_bytes());
    v.push(u8::from(b.fin));
    v.extend_from_slice(&(b.data.len() as u64).to_be_bytes());
    v.extend_from_slice(&b.data);
    v
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
        };
        store.publish(0, 0);
        Ok((store, blocks))
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

    fn write(&self, path: &Path, data: &[u8]) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        sync_dir(&self.dir);
        Ok(())
    }
}

impl CustodyStore for DiskCustody {
    fn persist(&mut self, block: &StoredBlock) -> Result<(), StoreFull> {
        let key = (block.flow, block.block_num);
        if self.held.contains_key(&key) {
            return Ok(());
        }
        let size = block.data.len() as u64;
        if self.bytes() + size > self.limit {
            warn!(flow = %block.flow, block = block.block_num, "custody storage full: acknowledgement withheld");
            self.publish(0, 1);
            return Err(StoreFull);
        }
        let path = self.dir.join(file_name(block.flow, block.block_num));
        if let Err(e) = self.write(&path, &encode(block)) {
            warn!(error = %e, "custody write failed: acknowledgement withheld");
            let _ = std::fs::remove_file(path.with_extension("tmp"));
            self.publish(0, 1);
            return Err(StoreFull);
        }
        self.held.insert(key, (path, size));
        self.publish(1, 0);
        Ok(())
    }

    fn release(&mut self, flow: FlowKey, block_num: u32) {
        if let Some((path, _)) = self.held.remove(&(flow, block_num)) {
            let _ = std::fs::remove_file(path);
            self.publish(0, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(n: u32, len: usize) -> StoredBlock {
        StoredBlock {
            flow: FlowKey { src: 1, id: 0xabc },
            dst: 4,
            block_num: n,
            offset: u64::from(n) * 1000,
            fin: n == 2,
            data: Bytes::from(vec![n as u8; len]),
        }
    }

    #[test]
    fn persist_restore_release_and_limit() {
        let dir = tempfile::tempdir().unwrap();
        let usage = std::sync::Arc::default();
        let (mut s, restored) = DiskCustody::open(dir.path(), 2500, usage).unwrap();
        assert!(restored.is_empty());
        s.persist(&block(0, 1000)).unwrap();
        s.persist(&block(1, 1000)).unwrap();
        assert_eq!(s.persist(&block(2, 1000)), Err(StoreFull));
        drop(s);
        let usage = std::sync::Arc::default();
        let (mut s, restored) = DiskCustody::open(dir.path(), 2500, usage).unwrap();
        assert_eq!(restored, vec![block(0, 1000), block(1, 1000)]);
        s.release(FlowKey { src: 1, id: 0xabc }, 0);
        s.persist(&block(2, 1000)).unwrap();
        drop(s);
        let usage = std::sync::Arc::default();
        let (_, restored) = DiskCustody::open(dir.path(), 2500, usage).unwrap();
        assert_eq!(restored, vec![block(1, 1000), block(2, 1000)]);
    }
}
