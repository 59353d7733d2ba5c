//! The mesh's directory: which IP addresses each node has, learned from the nodes
//! themselves, so that kernel routes (a routing daemon's) reach nodes that are not
//! neighbours without `[[hosts]]` in every configuration.
//!
//! With discovery on, every node puts its **record** (node id, a sequence number, its IP
//! addresses) in a directory datagram to each discovery address at every hello, followed by
//! as many other nodes' records as fit, taken in turn; each node keeps the newest record of
//! every node and passes it on, so records cross the mesh hop by hop. A node signs its
//! record with its node key when it has one (and with a members file only members' signed
//! records are taken); without node keys the mesh key's seal is all that vouches for it.
//! The sequence number grows at every hello (it starts from the authentication counter's
//! lease, which grows across restarts), and a record whose number has not grown for
//! [`EXPIRE_HELLOS`] hello intervals (at least [`EXPIRE_MIN`], longer for a directory too
//! large to pass round in that time) is forgotten: a node gone from the mesh drops out of
//! every directory, while copies passed round cannot keep it.
//!
//! Records also list the host's MAC addresses, which map batman-adv's originators to nodes
//! (batman.rs).
//!
//! Body: `"HDIR"` | version 1 | record count (u8) | records. Record: node id (u32) |
//! sequence (u64) | address count (u8) | addresses (family 4 or 6, then 4 or 16 bytes) |
//! MAC count (u8) | MACs (6 bytes each) | signed (u8, 0 or 1) | if signed: Ed25519 public
//! key (32) and signature (64) of `"hop record v1"` and every record byte before the key.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use hop_proto::NodeId;
use hop_wire::{EnvelopeRepr, TransportId};
use tracing::{debug, info};

use super::Daemon;
use crate::identity::{NodeKey, PublicKey, SIGNATURE_LEN};

pub(super) const MAGIC: &[u8; 4] = b"HDIR";
const VERSION: u8 = 1;
const CONTEXT: &[u8] = b"hop record v1";
/// Addresses a record lists at most.
const MAX_ADDRS: usize = 16;
/// Body bytes of one directory datagram at most (fits every MTU hopd supports).
const MAX_BODY: usize = 1100;
/// A record not renewed within this many hello intervals is forgotten ...
pub(super) const EXPIRE_HELLOS: u32 = 30;
/// ... and never sooner than this.
pub(super) const EXPIRE_MIN: Duration = Duration::from_secs(30);

/// A node's record as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    pub(super) id: NodeId,
    pub(super) seq: u64,
    pub(super) addrs: Vec<IpAddr>,
    pub(super) macs: Vec<crate::batman::Mac>,
    /// The signing key and whether the signature verified.
    pub(super) key: Option<(PublicKey, bool)>,
    /// The record's bytes, passed on as they came.
    pub(super) bytes: Vec<u8>,
}

/// How many of a neighbour's last [`QUALITY_WINDOW`] hellos arrived, from the sequence
/// numbers of its own record (one per hello): the link's quality as hellos measure it.
#[derive(Debug, Clone, Default)]
pub(super) struct HelloWindow {
    top: u64,
    first: u64,
    /// Bit i: hello `top - i` arrived.
    bits: u64,
}

/// Hellos a neighbour's link quality counts over.
pub(super) const QUALITY_WINDOW: u64 = 32;

impl HelloWindow {
    pub(super) fn heard(&mut self, seq: u64) {
        if self.bits == 0 {
            *self = HelloWindow {
                top: seq,
                first: seq,
                bits: 1,
            };
        } else if seq > self.top {
            let shift = seq - self.top;
            self.bits = if shift >= 64 { 0 } else { self.bits << shift } | 1;
            self.top = seq;
        } else if self.top - seq < 64 {
            self.bits |= 1 << (self.top - seq);
            self.first = self.first.min(seq);
        }
    }

    /// The share of the last hellos (up to [`QUALITY_WINDOW`], since the first heard) that
    /// arrived.
    pub(super) fn quality(&self) -> f64 {
        let span = (self.top - self.first + 1).min(QUALITY_WINDOW);
        let mask = if span >= 64 {
            u64::MAX
        } else {
            (1u64 << span) - 1
        };
        f64::from((self.bits & mask).count_ones()) / span as f64
    }
}

/// A record kept, and when its sequence number last grew.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) record: Record,
    pub(super) renewed: Instant,
}

/// The record of node `id`, signed with `key` when given.
pub(super) fn encode_record(
    id: NodeId,
    seq: u64,
    addrs: &[IpAddr],
    macs: &[crate::batman::Mac],
    key: Option<&NodeKey>,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&id.to_be_bytes());
    b.extend_from_slice(&seq.to_be_bytes());
    let addrs = &addrs[..addrs.len().min(MAX_ADDRS)];
    b.push(addrs.len() as u8);
    for a in addrs {
        match a {
            IpAddr::V4(v4) => {
                b.push(4);
                b.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                b.push(6);
                b.extend_from_slice(&v6.octets());
            }
        }
    }
    let macs = &macs[..macs.len().min(MAX_ADDRS)];
    b.push(macs.len() as u8);
    for m in macs {
        b.extend_from_slice(m);
    }
    match key {
        Some(k) => {
            b.push(1);
            let mut m = CONTEXT.to_vec();
            m.extend_from_slice(&b);
            let sig = k.sign(&m);
            b.extend_from_slice(k.public());
            b.extend_from_slice(&sig);
        }
        None => b.push(0),
    }
    b
}

/// One record from the front of `b`; returns it and the bytes it took.
pub(super) fn decode_record(b: &[u8]) -> Option<(Record, usize)> {
    let id = u32::from_be_bytes(b.get(..4)?.try_into().ok()?);
    let seq = u64::from_be_bytes(b.get(4..12)?.try_into().ok()?);
    let n = *b.get(12)? as usize;
    if n > MAX_ADDRS {
        return None;
    }
    let mut at = 13;
    let mut addrs = Vec::with_capacity(n);
    for _ in 0..n {
        match *b.get(at)? {
            4 => {
                let o: [u8; 4] = b.get(at + 1..at + 5)?.try_into().ok()?;
                addrs.push(IpAddr::from(o));
                at += 5;
            }
            6 => {
                let o: [u8; 16] = b.get(at + 1..at + 17)?.try_into().ok()?;
                addrs.push(IpAddr::from(o));
                at += 17;
            }
            _ => return None,
        }
    }
    let m = *b.get(at)? as usize;
    if m > MAX_ADDRS {
        return None;
    }
    at += 1;
    let mut macs = Vec::with_capacity(m);
    for _ in 0..m {
        macs.push(b.get(at..at + 6)?.try_into().ok()?);
        at += 6;
    }
    let key = match *b.get(at)? {
        0 => {
            at += 1;
            None
        }
        1 => {
            let signed_end = at + 1;
            let key: PublicKey = b.get(signed_end..signed_end + 32)?.try_into().ok()?;
            let sig = b.get(signed_end + 32..signed_end + 32 + SIGNATURE_LEN)?;
            let mut m = CONTEXT.to_vec();
            m.extend_from_slice(&b[..signed_end]);
            let ok = crate::identity::verify(&key, &m, sig);
            at = signed_end + 32 + SIGNATURE_LEN;
            Some((key, ok))
        }
        _ => return None,
    };
    Some((
        Record {
            id,
            seq,
            addrs,
            macs,
            key,
            bytes: b[..at].to_vec(),
        },
        at,
    ))
}

/// The records of a directory body (none if it is not one).
pub(super) fn decode(body: &[u8]) -> Option<Vec<Record>> {
    if body.len() < 6 || &body[..4] != MAGIC || body[4] != VERSION {
        return None;
    }
    let count = body[5] as usize;
    let mut at = 6;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let (r, n) = decode_record(&body[at..])?;
        out.push(r);
        at += n;
    }
    (at == body.len()).then_some(out)
}

impl Daemon {
    /// Whether a record may be kept: signed by its node's key (a member's, with a members
    /// file), or unsigned where no members file is set.
    fn record_acceptable(&self, r: &Record) -> bool {
        match r.key {
            Some((k, true)) => {
                crate::identity::id_of(&k) == r.id
                    && self
                        .cfg
                        .members
                        .as_ref()
                        .is_none_or(|m| m.iter().any(|m| m.key == k))
            }
            Some((_, false)) => false,
            None => self.cfg.members.is_none(),
        }
    }

    /// Records learned from a directory datagram of a neighbour.
    pub(super) fn on_directory(&mut self, from: NodeId, body: &[u8]) {
        let Some(records) = decode(body) else {
            self.counters.auth_malformed += 1;
            return;
        };
        let now = Instant::now();
        let mut changed = false;
        for r in records {
            if r.id == self.cfg.node_id {
                continue;
            }
            if r.id == from && self.record_acceptable(&r) {
                // The neighbour's own record: one per hello it sent.
                self.hello_windows.entry(from).or_default().heard(r.seq);
            }
            if !self.record_acceptable(&r) {
                self.counters.auth_bad_hello += 1;
                debug!(node = r.id, via = from, "directory record refused");
                continue;
            }
            match self.directory.get_mut(&r.id) {
                Some(e) if e.record.seq >= r.seq => {}
                Some(e) => {
                    if e.record.addrs != r.addrs || e.record.macs != r.macs {
                        info!(node = r.id, addresses = ?r.addrs, "directory: node's addresses changed");
                        changed = true;
                    }
                    e.record = r;
                    e.renewed = now;
                }
                None => {
                    info!(node = r.id, addresses = ?r.addrs, via = from, "directory: node learned");
                    self.directory.insert(
                        r.id,
                        Entry {
                            record: r,
                            renewed: now,
                        },
                    );
                    changed = true;
                }
            }
        }
        if changed && self.cfg.kernel_routes {
            self.refresh_kernel_routes();
        }
        if changed {
            self.refresh_batman_routes();
        }
    }

    /// Forget records not renewed in time: [`EXPIRE_HELLOS`] hello intervals, or four
    /// rounds of the whole directory where it is larger than that (about six signed records
    /// fit a datagram, so a node passes each record on once in `n / 6 + 1` hellos).
    pub(super) fn expire_directory(&mut self) {
        let rounds = 4 * (self.directory.len() as u32 / 6 + 1);
        let limit = (self.cfg.hello_interval * EXPIRE_HELLOS.max(rounds)).max(EXPIRE_MIN);
        let now = Instant::now();
        let before = self.directory.len();
        self.directory.retain(|id, e| {
            let keep = now.duration_since(e.renewed) <= limit;
            if !keep {
                info!(
                    node = id,
                    "directory: node forgotten: its record was not renewed"
                );
            }
            keep
        });
        if self.directory.len() != before {
            if self.cfg.kernel_routes {
                self.refresh_kernel_routes();
            }
            self.refresh_batman_routes();
        }
    }

    /// Next hops from batman-adv's originator table as last read (batman.rs), with the
    /// nodes' MACs from the directory; the routing table is rebuilt if they changed.
    pub(super) fn refresh_batman_routes(&mut self) {
        if self.cfg.batman_interface.is_none() {
            return;
        }
        let mut nodes: Vec<(NodeId, Vec<crate::batman::Mac>)> = self
            .directory
            .values()
            .map(|e| (e.record.id, e.record.macs.clone()))
            .collect();
        nodes.push((self.cfg.node_id, crate::ifaddr::macs()));
        let routes = crate::batman::next_hops(&self.batman_raw, &nodes, self.cfg.node_id);
        if routes != self.batman_routes {
            info!(routes = routes.len(), "batman-adv next hops changed");
            self.batman_routes = routes;
            self.apply_routes();
        }
    }

    /// The (node, address) pairs the directory knows.
    pub(super) fn directory_hosts(&self) -> Vec<(NodeId, IpAddr)> {
        let mut v: Vec<(NodeId, IpAddr)> = self
            .directory
            .values()
            .flat_map(|e| e.record.addrs.iter().map(|a| (e.record.id, *a)))
            .collect();
        v.sort();
        v
    }

    /// The directory datagram of this hello: this node's record, then others in turn.
    pub(super) fn directory_datagram(&mut self) -> Vec<u8> {
        self.directory_seq += 1;
        let own = encode_record(
            self.cfg.node_id,
            self.directory_seq,
            &crate::ifaddr::routable(),
            &crate::ifaddr::macs(),
            self.cfg.node_key.as_deref(),
        );
        let mut records = vec![own];
        let mut size = 6 + records[0].len();
        let mut ids: Vec<NodeId> = self.directory.keys().copied().collect();
        ids.sort_unstable();
        // Start after the last record sent, so the whole directory goes round.
        let start = ids.partition_point(|id| *id <= self.directory_cursor);
        for id in ids[start..].iter().chain(ids[..start].iter()) {
            let b = &self.directory[id].record.bytes;
            if size + b.len() > MAX_BODY || records.len() == 255 {
                break;
            }
            size += b.len();
            records.push(b.clone());
            self.directory_cursor = *id;
        }
        let mut body = Vec::with_capacity(size);
        body.extend_from_slice(MAGIC);
        body.push(VERSION);
        body.push(records.len() as u8);
        for r in &records {
            body.extend_from_slice(r);
        }
        let mut out = Vec::new();
        let _ = EnvelopeRepr {
            transport: TransportId::Hello,
            flags: 0,
            link_src: self.cfg.node_id,
            link_dst: hop_wire::envelope::BROADCAST_NODE,
        }
        .emit(&body, &mut out);
        out
    }

    /// Send the directory datagram to every discovery address (sealed as hellos are).
    pub(super) fn say_directory(&mut self) {
        if self.cfg.discovery_addresses.is_empty() {
            return;
        }
        let mut dg = self.directory_datagram();
        if self.sessions.is_none()
            && self
                .auth
                .seal(&mut dg, crate::auth::Stream::Control)
                .is_err()
        {
            return;
        }
        for to in self.cfg.discovery_addresses.clone() {
            if self.ctrl.try_send_to(&dg, to).is_ok() {
                self.counters.tx_datagrams += 1;
                self.counters.tx_bytes += dg.len() as u64;
            }
        }
    }

    /// The directory for `hop status --json`.
    pub(super) fn directory_status(&self) -> Vec<serde_json::Value> {
        let now = Instant::now();
        let mut v: Vec<&Entry> = self.directory.values().collect();
        v.sort_by_key(|e| e.record.id);
        v.into_iter()
            .map(|e| {
                serde_json::json!({
                    "id": e.record.id,
                    "addresses": e.record.addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
                    "macs": e.record.macs.iter().map(|m| m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")).collect::<Vec<_>>(),
                    "renewed_ms": now.duration_since(e.renewed).as_millis() as u64,
                })
            })
            .collect()
    }
}

/// Not a hello but a directory datagram.
pub(super) fn is_directory(body: &[u8]) -> bool {
    body.len() >= 4 && &body[..4] == MAGIC
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_quality_counts_the_gaps_in_a_neighbours_sequence() {
        let mut w = HelloWindow::default();
        for seq in 100..110 {
            w.heard(seq);
        }
        assert_eq!(w.quality(), 1.0);
        // Every other hello lost from then on: the window fills with halves.
        for seq in (110..200).step_by(2) {
            w.heard(seq);
        }
        assert!((w.quality() - 0.5).abs() < 0.05, "{}", w.quality());
        // A late one counts; one from before the window does not.
        w.heard(197);
        w.heard(50);
        assert!(w.quality() > 0.5 && w.quality() < 0.6, "{}", w.quality());
        // After a long silence one of the last 32 hellos was heard.
        w.heard(1000);
        assert_eq!(w.quality(), 1.0 / 32.0);
    }

    #[test]
    fn records_round_trip_signed_and_not() {
        let k = NodeKey::from_seed(&[3; 32]).unwrap();
        let addrs: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()];
        let macs = [[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]];
        for key in [None, Some(&k)] {
            let b = encode_record(k.node_id(), 7, &addrs, &macs, key);
            let (r, n) = decode_record(&b).unwrap();
            assert_eq!(n, b.len());
            assert_eq!((r.id, r.seq, &r.addrs), (k.node_id(), 7, &addrs));
            assert_eq!(r.macs, macs);
            assert_eq!(r.key, key.map(|k| (*k.public(), true)));
        }
        // A changed byte breaks the signature.
        let mut b = encode_record(k.node_id(), 7, &addrs, &macs, Some(&k));
        b[10] ^= 1;
        assert_eq!(decode_record(&b).unwrap().0.key.map(|k| k.1), Some(false));
        // Truncated or padded bodies are refused.
        let one = encode_record(1, 1, &addrs, &[], None);
        let mut body = MAGIC.to_vec();
        body.extend_from_slice(&[VERSION, 1]);
        body.extend_from_slice(&one);
        assert_eq!(decode(&body).unwrap().len(), 1);
        assert!(decode(&body[..body.len() - 1]).is_none());
        body.push(0);
        assert!(decode(&body).is_none());
        for n in 0..body.len() {
            let _ = decode(&body[..n]);
        }
    }
}
