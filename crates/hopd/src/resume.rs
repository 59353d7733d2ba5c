//! Resumed transfers at the destination.
//!
//! A source that restarts mid-transfer sends what is left of a kept transfer as a new flow
//! that starts with a resume header ([`ResumeHeader`]: the earlier flow and the byte of the
//! file where this flow's bytes start). The earlier flow's spool file holds the bytes before
//! that point (the source resumes only at bytes the destination acknowledged end to end), so
//! the destination joins the two into the file the earlier flow would have delivered. The
//! file is delivered once:
//! - the earlier flow, if it still finishes (relays held its last blocks in custody), is
//!   *superseded*: its file stays in the spool for the resuming flow and is not delivered;
//! - a resuming flow whose earlier flow was delivered already is a duplicate and is dropped;
//! - a flow that resumes one whose bytes are gone cannot be joined: its delivery is withheld
//!   (the source gives up after `give_up_after` and sends the file again from its start).
//!
//! A resumed flow may itself be resumed (a second restart): the earlier flows form a chain,
//! each holding the file's bytes from where it started.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use hop_proto::FlowKey;

use crate::custody::{part_path, read_state, state_path};
use crate::flowfmt::{ResumeHeader, RESUME_LEN};

/// Longest chain of resumed flows followed (a source restarted that many times during one
/// transfer); longer chains are treated as broken, so no crafted loop is followed for ever.
const MAX_CHAIN: usize = 64;

/// Where the flows that resume `flow` are noted (`<flow>.resumers`, one flow name a line),
/// so that asking whether a flow is resumed reads one small file, not every spool file's
/// header (a destination may hold thousands).
fn resumers_path(incoming: &Path, flow: FlowKey) -> std::path::PathBuf {
    part_path(incoming, flow).with_extension("resumers")
}

/// Note that `by` resumes `flow` (before `by`'s first bytes are written).
pub fn note_resumer(incoming: &Path, flow: FlowKey, by: FlowKey) -> std::io::Result<()> {
    let path = resumers_path(incoming, flow);
    let name = format!("{}-{:08x}", by.src, by.id);
    let known = std::fs::read_to_string(&path).unwrap_or_default();
    if known.lines().any(|l| l == name) {
        return Ok(());
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)?;
    writeln!(f, "{name}")?;
    f.sync_data()
}

/// The flow whose spool file resumes `flow`, if one does: a noted resumer whose spool file
/// is there and names `flow` in its resume header.
pub fn resumed_by(incoming: &Path, flow: FlowKey) -> Option<FlowKey> {
    let noted = std::fs::read_to_string(resumers_path(incoming, flow)).ok()?;
    noted
        .lines()
        .filter_map(crate::custody::parse_flow_name)
        .find(|k| {
            *k != flow
                && ResumeHeader::read(&part_path(incoming, *k)).is_some_and(|r| r.prev == flow)
        })
}

/// Forget the resumers noted for `flow` (its spool file is gone).
pub fn forget_resumers(incoming: &Path, flow: FlowKey) {
    let _ = std::fs::remove_file(resumers_path(incoming, flow));
}

/// `flow` finished and its file left the spool (it was delivered).
pub fn delivered(incoming: &Path, flow: FlowKey) -> bool {
    !part_path(incoming, flow).exists()
        && read_state(&state_path(incoming, flow), flow).is_some_and(|p| p.finished)
}

/// How many of the file's first bytes the spool holds through `flow` (its own bytes after
/// those of the flows it resumes), or `None` if its spool file is gone.
fn held_through(incoming: &Path, flow: FlowKey, depth: usize) -> Option<u64> {
    if depth > MAX_CHAIN {
        return None;
    }
    let part = part_path(incoming, flow);
    let len = std::fs::metadata(&part).ok()?.len();
    match ResumeHeader::read(&part) {
        None => Some(len),
        Some(r) => {
            let before = held_through(incoming, r.prev, depth + 1)?;
            (before >= r.offset).then(|| r.offset + len.saturating_sub(RESUME_LEN as u64))
        }
    }
}

/// A flow starting with resume header `r` can be delivered: it starts the file afresh, or
/// the file's bytes before it are held, or the earlier flow was delivered (a duplicate).
pub fn possible(incoming: &Path, r: &ResumeHeader) -> bool {
    r.offset == 0
        || delivered(incoming, r.prev)
        || held_through(incoming, r.prev, 0).is_some_and(|n| n >= r.offset)
}

/// What finishing a resuming flow gives.
#[derive(Debug)]
pub enum Joined {
    /// The whole file, in a new spool file (`.joined`), `len` bytes long.
    File { path: PathBuf, len: u64 },
    /// The earlier flow delivered the file already.
    Duplicate,
    /// The bytes before the resume point are gone.
    Missing,
}

/// Copy the file's bytes `[0, upto)` as held through `flow` to `out`. False if not held.
fn copy_prefix(
    incoming: &Path,
    flow: FlowKey,
    upto: u64,
    out: &mut File,
    depth: usize,
) -> std::io::Result<bool> {
    if depth > MAX_CHAIN {
        return Ok(false);
    }
    let part = part_path(incoming, flow);
    let Ok(mut f) = File::open(&part) else {
        return Ok(false);
    };
    let len = f.metadata()?.len();
    let (start, skip) = match ResumeHeader::read(&part) {
        None => (0, 0),
        Some(r) => {
            if upto < r.offset || !copy_prefix(incoming, r.prev, r.offset, out, depth + 1)? {
                return Ok(false);
            }
            (r.offset, RESUME_LEN as u64)
        }
    };
    let n = upto - start;
    if skip + n > len {
        return Ok(false);
    }
    f.seek(SeekFrom::Start(skip))?;
    let copied = std::io::copy(&mut (&mut f).take(n), out)?;
    Ok(copied == n)
}

/// Join the resuming flow `flow` (`len` bytes in its spool file, resume header `r`) with the
/// bytes before it into a new spool file.
pub fn join(incoming: &Path, flow: FlowKey, r: &ResumeHeader, len: u64) -> std::io::Result<Joined> {
    let part = part_path(incoming, flow);
    let joined = part.with_extension("joined");
    let mut out = File::create(&joined)?;
    if r.offset > 0 && !copy_prefix(incoming, r.prev, r.offset, &mut out, 0)? {
        drop(out);
        let _ = std::fs::remove_file(&joined);
        return Ok(if delivered(incoming, r.prev) {
            Joined::Duplicate
        } else {
            Joined::Missing
        });
    }
    if r.offset == 0 && delivered(incoming, r.prev) {
        drop(out);
        let _ = std::fs::remove_file(&joined);
        return Ok(Joined::Duplicate);
    }
    let mut f = File::open(&part)?;
    f.seek(SeekFrom::Start(RESUME_LEN as u64))?;
    let tail = len.saturating_sub(RESUME_LEN as u64);
    std::io::copy(&mut f.take(tail), &mut out)?;
    out.flush()?;
    out.sync_all()?;
    let total = out.metadata()?.len();
    Ok(Joined::File {
        path: joined,
        len: total,
    })
}

/// Delete the spool files of the flows `flow` resumed that nothing needs any more: not
/// resumed by another flow, and not still being received (no unfinished progress record).
pub fn release_chain(incoming: &Path, flow: FlowKey) {
    let mut next = Some(flow);
    let mut depth = 0;
    while let Some(prev) = next.take() {
        depth += 1;
        if depth > MAX_CHAIN {
            return;
        }
        let part = part_path(incoming, prev);
        let state = state_path(incoming, prev);
        let receiving = read_state(&state, prev).is_some_and(|p| !p.finished);
        if !part.exists() || receiving || resumed_by(incoming, prev).is_some() {
            return;
        }
        next = ResumeHeader::read(&part).map(|r| r.prev);
        let _ = std::fs::remove_file(&part);
        forget_resumers(incoming, prev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: u32) -> FlowKey {
        FlowKey { src: 1, id }
    }

    fn resuming(dir: &Path, id: u32, prev: u32, offset: u64, bytes: &[u8]) {
        let mut v = ResumeHeader {
            prev: key(prev),
            offset,
        }
        .encode();
        v.extend_from_slice(bytes);
        note_resumer(dir, key(prev), key(id)).unwrap();
        std::fs::write(part_path(dir, key(id)), v).unwrap();
    }

    #[test]
    fn a_chain_of_resumed_flows_joins_into_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let file: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        // Flow 1 got 400 bytes (and 100 more the source never heard acknowledged); flow 2
        // resumed at 300 and got to 700; flow 3 resumed flow 2 at 600 and has the rest.
        std::fs::write(part_path(d, key(1)), &file[..500]).unwrap();
        resuming(d, 2, 1, 300, &file[300..700]);
        resuming(d, 3, 2, 600, &file[600..]);
        let r = ResumeHeader::read(&part_path(d, key(3))).unwrap();
        assert!(possible(d, &r));
        assert_eq!(resumed_by(d, key(1)), Some(key(2)));
        assert_eq!(resumed_by(d, key(2)), Some(key(3)));
        let len = std::fs::metadata(part_path(d, key(3))).unwrap().len();
        let Joined::File { path, len } = join(d, key(3), &r, len).unwrap() else {
            panic!("not joined");
        };
        assert_eq!(len, 1000);
        assert_eq!(std::fs::read(&path).unwrap(), file);
        // Once flow 3's own file has gone, nothing needs flows 1 and 2.
        std::fs::remove_file(part_path(d, key(3))).unwrap();
        release_chain(d, key(2));
        assert!(!part_path(d, key(2)).exists());
        assert!(!part_path(d, key(1)).exists());
    }

    #[test]
    fn bytes_that_are_gone_are_not_joined_and_a_delivered_file_is_a_duplicate() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(part_path(d, key(1)), [0u8; 100]).unwrap();
        resuming(d, 2, 1, 300, &[1u8; 50]);
        let r = ResumeHeader::read(&part_path(d, key(2))).unwrap();
        assert!(!possible(d, &r), "only 100 of the 300 bytes are held");
        assert!(matches!(join(d, key(2), &r, 71).unwrap(), Joined::Missing));
        assert!(!part_path(d, key(2)).with_extension("joined").exists());
        // A flow resuming at its start is the whole file.
        resuming(d, 3, 9, 0, b"whole");
        let r = ResumeHeader::read(&part_path(d, key(3))).unwrap();
        assert!(possible(d, &r));
        let Joined::File { path, .. } = join(d, key(3), &r, 26).unwrap() else {
            panic!("not joined");
        };
        assert_eq!(std::fs::read(path).unwrap(), b"whole");
    }

    #[test]
    fn a_flow_still_being_received_keeps_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(part_path(d, key(1)), [0u8; 100]).unwrap();
        resuming(d, 2, 1, 50, &[1u8; 50]);
        // Flow 2 still resumes flow 1: kept.
        release_chain(d, key(1));
        assert!(part_path(d, key(1)).exists());
    }
}
