//! What a flow carries end to end: a small header naming the file, the file's bytes, and the
//! BLAKE3 hash of those bytes, checked by the destination before it hands the file over.
//!
//! ```text
//! "HOPF" | version=1 | name length (u16) | name (UTF-8) | size (u64) | bytes... | BLAKE3 (32)
//! "HOPF" | version=2 | name length (u16) | name | size (u64) | service length (u8) | service
//!        | bytes... | BLAKE3 (32)
//! ```
//!
//! Version 2 names the service (endpoint) the file is for at the destination (`hop send
//! --to NODE/SERVICE`, `hop recv --service SERVICE`); a file without one is version 1.
//!
//! A flow that resumes an earlier one (a source restarted mid-transfer) starts with a resume
//! header instead, and carries the earlier flow's bytes from `offset` on:
//!
//! ```text
//! "HOPF" | version=3 | earlier flow's source (u32) | its id (u32) | offset (u64) | bytes...
//! ```
//!
//! The destination joins the earlier flow's first `offset` bytes (which it acknowledged end to
//! end, so holds) and this flow's bytes into the file the earlier flow would have delivered.

/// Magic at the start of every flow.
pub const MAGIC: &[u8; 4] = b"HOPF";
pub const VERSION: u8 = 1;
/// The version of a header that names a service.
pub const VERSION_SERVICE: u8 = 2;
/// Longest service name.
pub const MAX_SERVICE: usize = 64;
pub const HASH_LEN: usize = 32;
/// Longest file name carried.
pub const MAX_NAME: usize = 255;

/// The version of a resume header.
pub const VERSION_RESUME: u8 = 3;
/// Length of a resume header.
pub const RESUME_LEN: usize = 21;

/// The header of a flow that resumes `prev` at byte `offset` of its flow bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumeHeader {
    pub prev: hop_proto::FlowKey,
    pub offset: u64,
}

impl ResumeHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(RESUME_LEN);
        v.extend_from_slice(MAGIC);
        v.push(VERSION_RESUME);
        v.extend_from_slice(&self.prev.src.to_be_bytes());
        v.extend_from_slice(&self.prev.id.to_be_bytes());
        v.extend_from_slice(&self.offset.to_be_bytes());
        v
    }

    /// The resume header at the start of `buf`, if it starts with one.
    pub fn decode(buf: &[u8]) -> Option<ResumeHeader> {
        if buf.len() < RESUME_LEN || &buf[..4] != MAGIC || buf[4] != VERSION_RESUME {
            return None;
        }
        let u32_at = |i: usize| u32::from_be_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        let mut off = [0u8; 8];
        off.copy_from_slice(&buf[13..21]);
        Some(ResumeHeader {
            prev: hop_proto::FlowKey {
                src: u32_at(5),
                id: u32_at(9),
            },
            offset: u64::from_be_bytes(off),
        })
    }

    /// The resume header at the start of the file at `path`, if it starts with one.
    pub fn read(path: &std::path::Path) -> Option<ResumeHeader> {
        use std::io::Read;
        let mut buf = [0u8; RESUME_LEN];
        std::fs::File::open(path).ok()?.read_exact(&mut buf).ok()?;
        ResumeHeader::decode(&buf)
    }
}

/// The header of a flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowHeader {
    pub name: String,
    pub size: u64,
    /// The service (endpoint) at the destination; none: the node's default inbox.
    pub service: Option<String>,
}

/// A valid service name: 1-64 of `a-z`, `0-9`, `.`, `_`, `-`, not starting with `.`.
pub fn valid_service(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_SERVICE
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlowFormatError {
    #[error("flow header is incomplete")]
    Incomplete,
    #[error("not a hop file flow (bad magic or version)")]
    BadMagic,
    #[error("file name is not valid")]
    BadName,
    #[error("flow length {have} does not match header size {size}")]
    Length { have: u64, size: u64 },
    #[error("BLAKE3 hash mismatch")]
    HashMismatch,
}

impl FlowHeader {
    pub fn encode(&self) -> Vec<u8> {
        let name = self.name.as_bytes();
        let mut v = Vec::with_capacity(15 + name.len());
        v.extend_from_slice(MAGIC);
        v.push(if self.service.is_some() {
            VERSION_SERVICE
        } else {
            VERSION
        });
        v.extend_from_slice(&(name.len() as u16).to_be_bytes());
        v.extend_from_slice(name);
        v.extend_from_slice(&self.size.to_be_bytes());
        if let Some(s) = &self.service {
            v.push(s.len() as u8);
            v.extend_from_slice(s.as_bytes());
        }
        v
    }

    pub fn encoded_len(&self) -> usize {
        15 + self.name.len() + self.service.as_ref().map_or(0, |s| 1 + s.len())
    }

    /// Parse a header at the start of `buf`; returns it and its length.
    pub fn decode(buf: &[u8]) -> Result<(FlowHeader, usize), FlowFormatError> {
        if buf.len() < 7 {
            return Err(FlowFormatError::Incomplete);
        }
        if &buf[..4] != MAGIC || !(buf[4] == VERSION || buf[4] == VERSION_SERVICE) {
            return Err(FlowFormatError::BadMagic);
        }
        let n = usize::from(u16::from_be_bytes([buf[5], buf[6]]));
        if n > MAX_NAME {
            return Err(FlowFormatError::BadName);
        }
        if buf.len() < 15 + n {
            return Err(FlowFormatError::Incomplete);
        }
        let name = std::str::from_utf8(&buf[7..7 + n]).map_err(|_| FlowFormatError::BadName)?;
        let name = sanitize_name(name).ok_or(FlowFormatError::BadName)?;
        let mut sz = [0u8; 8];
        sz.copy_from_slice(&buf[7 + n..15 + n]);
        let mut len = 15 + n;
        let mut service = None;
        if buf[4] == VERSION_SERVICE {
            let Some(&k) = buf.get(len) else {
                return Err(FlowFormatError::Incomplete);
            };
            let k = usize::from(k);
            let Some(s) = buf.get(len + 1..len + 1 + k) else {
                return Err(FlowFormatError::Incomplete);
            };
            let s = std::str::from_utf8(s).map_err(|_| FlowFormatError::BadName)?;
            if !valid_service(s) {
                return Err(FlowFormatError::BadName);
            }
            service = Some(s.to_string());
            len += 1 + k;
        }
        Ok((
            FlowHeader {
                name,
                size: u64::from_be_bytes(sz),
                service,
            },
            len,
        ))
    }
}

/// A safe relative path (plain components joined by `/`) from a name a peer sent, or `None`.
pub fn sanitize_name(name: &str) -> Option<String> {
    // A relative path of plain components: a file sent from a directory keeps its place
    // in it (`photos/2026/a.jpg`), and nothing can name a place outside the receiving
    // directory (no root, no `..`).
    if name.ends_with(['/', '\\']) || name.chars().any(|c| c.is_control()) {
        return None;
    }
    let parts: Vec<&str> = name
        .split(['/', '\\'])
        .filter(|c| !c.is_empty() && *c != "." && *c != "..")
        .collect();
    let path = parts.join("/");
    if path.is_empty() || path.len() > MAX_NAME {
        return None;
    }
    Some(path)
}

/// Hex of a hash.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Move a received file from `tmp` to `dir/name` without replacing a file already there
/// (another receiver's, or the user's); if the name is taken, `dir/name.flow`. Several
/// receivers may share `dir`, so the name is claimed atomically (a hard link, which fails if
/// the name exists), not checked first. Returns where the file went.
pub fn place_received(
    tmp: &std::path::Path,
    dir: &std::path::Path,
    name: &str,
    flow: &str,
) -> std::io::Result<std::path::PathBuf> {
    use std::io::ErrorKind;
    for dest in [dir.join(name), dir.join(format!("{name}.{flow}"))] {
        match std::fs::hard_link(tmp, &dest) {
            Ok(()) => {
                std::fs::remove_file(tmp)?;
                return Ok(dest);
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            // A file system without hard links: claim the name by a check, then rename.
            Err(_) if !dest.exists() => {
                std::fs::rename(tmp, &dest)?;
                return Ok(dest);
            }
            Err(_) => continue,
        }
    }
    // The same flow was received into this directory before: the copy is the same file.
    let dest = dir.join(format!("{name}.{flow}"));
    std::fs::rename(tmp, &dest)?;
    Ok(dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_received_file_never_replaces_one_already_there() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let tmp = |n: u8| {
            let t = d.join(format!(".tmp{n}"));
            std::fs::write(&t, [n]).unwrap();
            t
        };
        assert_eq!(
            place_received(&tmp(1), d, "a.bin", "1-1").unwrap(),
            d.join("a.bin")
        );
        assert_eq!(
            place_received(&tmp(2), d, "a.bin", "1-2").unwrap(),
            d.join("a.bin.1-2")
        );
        assert_eq!(std::fs::read(d.join("a.bin")).unwrap(), [1]);
        assert_eq!(std::fs::read(d.join("a.bin.1-2")).unwrap(), [2]);
        // The same flow again: its own earlier copy is replaced, nobody else's.
        assert_eq!(
            place_received(&tmp(3), d, "a.bin", "1-2").unwrap(),
            d.join("a.bin.1-2")
        );
        assert_eq!(std::fs::read(d.join("a.bin")).unwrap(), [1]);
        assert!(
            !d.join(".tmp1").exists() && !d.join(".tmp2").exists() && !d.join(".tmp3").exists()
        );
    }

    #[test]
    fn header_round_trip() {
        for service in [None, Some("photos".to_string())] {
            let h = FlowHeader {
                name: "a.bin".into(),
                size: 12345,
                service,
            };
            let e = h.encode();
            assert_eq!(e.len(), h.encoded_len());
            assert_eq!(FlowHeader::decode(&e).unwrap(), (h, e.len()));
            assert_eq!(
                FlowHeader::decode(&e[..e.len() - 1]),
                Err(FlowFormatError::Incomplete)
            );
        }
        assert!(valid_service("bundle-in.v7_x"));
        assert!(!valid_service("") && !valid_service(".x") && !valid_service("A/b"));
    }

    #[test]
    fn names_are_sanitized() {
        assert_eq!(
            sanitize_name("../../etc/passwd").as_deref(),
            Some("etc/passwd")
        );
        assert_eq!(sanitize_name("/abs/a.txt").as_deref(), Some("abs/a.txt"));
        assert_eq!(
            sanitize_name("photos/./2026//a.jpg").as_deref(),
            Some("photos/2026/a.jpg")
        );
        assert_eq!(sanitize_name("a\\b").as_deref(), Some("a/b"));
        assert_eq!(sanitize_name(".."), None);
        assert_eq!(sanitize_name("a/"), None);
        assert_eq!(sanitize_name("x\ny"), None);
    }
}
