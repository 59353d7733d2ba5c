//! What a flow carries end to end: a small header naming the file, the file's bytes, and the
//! BLAKE3 hash of those bytes, checked by the destination before it hands the file over.
//!
//! ```text
//! "HOPF" | version=1 | name length (u16) | name (UTF-8) | size (u64) | bytes... | BLAKE3 (32)
//! ```

/// Magic at the start of every flow.
pub const MAGIC: &[u8; 4] = b"HOPF";
pub const VERSION: u8 = 1;
pub const HASH_LEN: usize = 32;
/// Longest file name carried.
pub const MAX_NAME: usize = 255;

/// The header of a flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowHeader {
    pub name: String,
    pub size: u64,
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
        v.push(VERSION);
        v.extend_from_slice(&(name.len() as u16).to_be_bytes());
        v.extend_from_slice(name);
        v.extend_from_slice(&self.size.to_be_bytes());
        v
    }

    pub fn encoded_len(&self) -> usize {
        15 + self.name.len()
    }

    /// Parse a header at the start of `buf`; returns it and its length.
    pub fn decode(buf: &[u8]) -> Result<(FlowHeader, usize), FlowFormatError> {
        if buf.len() < 7 {
            return Err(FlowFormatError::Incomplete);
        }
        if &buf[..4] != MAGIC || buf[4] != VERSION {
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
        Ok((
            FlowHeader {
                name,
                size: u64::from_be_bytes(sz),
            },
            15 + n,
        ))
    }
}

/// A safe final path component from a name a peer sent, or `None`.
pub fn sanitize_name(name: &str) -> Option<String> {
    let base = name.rsplit(['/', '\\']).next().unwrap_or("");
    if base.is_empty() || base == "." || base == ".." || base.len() > MAX_NAME {
        return None;
    }
    if base.chars().any(|c| c.is_control()) {
        return None;
    }
    Some(base.to_string())
}

/// Hex of a hash.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = FlowHeader {
            name: "a.bin".into(),
            size: 12345,
        };
        let e = h.encode();
        assert_eq!(e.len(), h.encoded_len());
        assert_eq!(FlowHeader::decode(&e).unwrap(), (h, e.len()));
        assert_eq!(
            FlowHeader::decode(&e[..e.len() - 1]),
            Err(FlowFormatError::Incomplete)
        );
    }

    #[test]
    fn names_are_sanitized() {
        assert_eq!(sanitize_name("../../etc/passwd").as_deref(), Some("passwd"));
        assert_eq!(sanitize_name(".."), None);
        assert_eq!(sanitize_name("a/"), None);
        assert_eq!(sanitize_name("x\ny"), None);
    }
}
