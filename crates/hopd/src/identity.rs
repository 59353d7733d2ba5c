//! Node identities and membership.
//!
//! A node may hold an Ed25519 key pair (`hop keygen`, `[security] node_key_file`). Its node id
//! is then derived from the public key (the first four bytes of its BLAKE3 hash), so two
//! nodes do not share an id by accident, and its hellos carry the public key and a signature
//! that only the key's holder can make. A mesh that lists its members' public keys
//! (`[security] members_file`, one key per line, edited by `hop admit` / `hop revoke`) learns
//! only neighbours whose hellos a member signed and takes datagrams only from members' ids.
//!
//! What this does not do: datagrams are still authenticated with the one mesh key, so a
//! revoked node that kept the mesh key can still forge datagrams under a member's id. After a
//! revocation, change the mesh key (docs/hopd.md, threat model).

use std::path::Path;

use hop_proto::NodeId;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};

/// An Ed25519 public key.
pub type PublicKey = [u8; 32];

/// Length of an Ed25519 signature.
pub const SIGNATURE_LEN: usize = 64;

/// A node's key pair.
#[derive(Debug)]
pub struct NodeKey {
    pair: Ed25519KeyPair,
    public: PublicKey,
}

impl NodeKey {
    /// A new random seed (32 bytes from the system's generator).
    pub fn generate_seed() -> Result<[u8; 32], ring::error::Unspecified> {
        use ring::rand::SecureRandom;
        let mut seed = [0u8; 32];
        ring::rand::SystemRandom::new().fill(&mut seed)?;
        Ok(seed)
    }

    /// The key pair of `seed`.
    pub fn from_seed(seed: &[u8; 32]) -> Result<NodeKey, ring::error::KeyRejected> {
        let pair = Ed25519KeyPair::from_seed_unchecked(seed)?;
        let mut public = [0u8; 32];
        public.copy_from_slice(pair.public_key().as_ref());
        Ok(NodeKey { pair, public })
    }

    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// The node id this key gives.
    pub fn node_id(&self) -> NodeId {
        id_of(&self.public)
    }

    pub fn sign(&self, msg: &[u8]) -> [u8; SIGNATURE_LEN] {
        let mut out = [0u8; SIGNATURE_LEN];
        out.copy_from_slice(self.pair.sign(msg).as_ref());
        out
    }
}

/// The node id of public key `key`: the first four bytes of its BLAKE3 hash, big-endian,
/// moved off the two reserved ids (0 and the broadcast id).
pub fn id_of(key: &PublicKey) -> NodeId {
    let h = blake3::hash(key);
    let b = h.as_bytes();
    match u32::from_be_bytes([b[0], b[1], b[2], b[3]]) {
        0 => 1,
        u32::MAX => u32::MAX - 1,
        id => id,
    }
}

/// Whether `sig` is `key`'s signature of `msg`.
pub fn verify(key: &PublicKey, msg: &[u8], sig: &[u8]) -> bool {
    UnparsedPublicKey::new(&ED25519, key)
        .verify(msg, sig)
        .is_ok()
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A member of the mesh: a public key, the node id it gives, and a name for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub key: PublicKey,
    pub id: NodeId,
    pub name: String,
}

/// A members file: one member per line, `<64 hex digits of the public key> [name]`; blank
/// lines and lines starting with `#` are skipped. Errors name the line.
pub fn parse_members(text: &str) -> Result<Vec<Member>, (usize, String)> {
    let mut out: Vec<Member> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, name) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let key = crate::config::parse_hex_key(k)
            .ok_or_else(|| (i + 1, format!("`{k}` is not a public key (64 hex digits)")))?;
        let id = id_of(&key);
        if let Some(m) = out.iter().find(|m| m.id == id && m.key != key) {
            return Err((
                i + 1,
                format!("two keys give node id {id} (the other: {})", m.name),
            ));
        }
        if out.iter().any(|m| m.key == key) {
            continue;
        }
        out.push(Member {
            key,
            id,
            name: name.trim().to_string(),
        });
    }
    Ok(out)
}

/// Read a node key file (the seed as 64 hex digits, as `hop keygen` writes it).
pub fn read_node_key(path: &Path) -> Result<NodeKey, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let seed = crate::config::parse_hex_key(&text).ok_or_else(|| {
        format!(
            "{} does not hold a node key (64 hex digits)",
            path.display()
        )
    })?;
    NodeKey::from_seed(&seed).map_err(|e| format!("{}: {e}", path.display()))
}

/// Write a new node key to `path` (mode 0600, never over an existing file) and return it.
pub fn write_new_node_key(path: &Path) -> Result<NodeKey, String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let seed =
        NodeKey::generate_seed().map_err(|_| "the system's random generator failed".to_string())?;
    let key = NodeKey::from_seed(&seed).map_err(|e| e.to_string())?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    writeln!(f, "{}", hex(&seed)).map_err(|e| format!("writing {}: {e}", path.display()))?;
    f.sync_all()
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(key)
}

/// `text` (a members file) with `key` added under `name`, unless it is there already.
pub fn admit(text: &str, key: &PublicKey, name: &str) -> String {
    let h = hex(key);
    if text
        .lines()
        .any(|l| l.split_whitespace().next() == Some(h.as_str()))
    {
        return text.to_string();
    }
    let mut out = text.to_string();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&h);
    if !name.is_empty() {
        out.push(' ');
        out.push_str(name);
    }
    out.push('\n');
    out
}

/// `text` (a members file) without `key`'s line; also whether there was one.
pub fn revoke(text: &str, key: &PublicKey) -> (String, bool) {
    let h = hex(key);
    let mut found = false;
    let mut out = String::new();
    for l in text.lines() {
        if l.split_whitespace().next() == Some(h.as_str()) {
            found = true;
            continue;
        }
        out.push_str(l);
        out.push('\n');
    }
    (out, found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_signs_and_gives_a_stable_node_id() {
        let k = NodeKey::from_seed(&[7; 32]).unwrap();
        let again = NodeKey::from_seed(&[7; 32]).unwrap();
        assert_eq!(k.public(), again.public());
        assert_eq!(k.node_id(), again.node_id());
        assert_ne!(k.node_id(), NodeKey::from_seed(&[8; 32]).unwrap().node_id());
        let sig = k.sign(b"hello");
        assert!(verify(k.public(), b"hello", &sig));
        assert!(!verify(k.public(), b"hellO", &sig));
        let other = NodeKey::from_seed(&[9; 32]).unwrap();
        assert!(!verify(other.public(), b"hello", &sig));
    }

    #[test]
    fn members_files_are_read_admitted_to_and_revoked_from() {
        let a = NodeKey::from_seed(&[1; 32]).unwrap();
        let b = NodeKey::from_seed(&[2; 32]).unwrap();
        let text = admit("# the mesh\n", a.public(), "roof-1");
        let text = admit(&text, b.public(), "");
        assert_eq!(admit(&text, b.public(), "again"), text, "admitted once");
        let m = parse_members(&text).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].id, m[0].name.as_str()), (a.node_id(), "roof-1"));
        let (text, found) = revoke(&text, a.public());
        assert!(found);
        let m = parse_members(&text).unwrap();
        assert_eq!(
            m.iter().map(|m| m.key).collect::<Vec<_>>(),
            vec![*b.public()]
        );
        assert!(!revoke(&text, a.public()).1);
        let e = parse_members("# x\nabc roof\n").unwrap_err();
        assert_eq!(e.0, 2, "{e:?}");
    }

    #[test]
    fn a_new_key_file_is_private_and_never_overwritten() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("node.key");
        let k = write_new_node_key(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(read_node_key(&p).unwrap().public(), k.public());
        assert!(write_new_node_key(&p).is_err(), "an existing key is kept");
    }
}
