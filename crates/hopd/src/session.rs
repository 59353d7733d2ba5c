//! Per-neighbour sessions: how nodes with keys and a members file (`[security] sessions`)
//! hand each other the keys their datagrams are sealed with, without a shared mesh key.
//!
//! Each node seals everything it sends (unicast and broadcast, data and control) with its own
//! random **sender key**, made at start and replaced when a member is revoked. Every neighbour
//! that is a member gets that key over a Noise handshake
//! (`Noise_XX_25519_ChaChaPoly_BLAKE2s`, the `snow` crate; prologue `"hop session v1"`), so
//! it can open what the node sends to it and what it overhears (Hop caches overheard blocks,
//! §3.4: a key per pair would hide them). A revoked node is given no new key and its own is
//! forgotten: a revocation takes effect without a new mesh key. A key made at each start
//! also means counters need not survive a reboot.
//!
//! The handshake's static keys are X25519 keys made at each start; each side binds its
//! static key to its node key (Ed25519, identity.rs) with a signature, sent inside the
//! handshake where Noise encrypts it: `cert = node public key (32) | signature (64)` of
//! `"hop session key v1" | node id (u32) | X25519 static public key (32)`. A side refuses a
//! certificate whose key is not a member's, whose node id is not the key's, or whose
//! signature fails.
//!
//! Messages travel in an envelope of transport [`TransportId::Session`], unsealed (Noise
//! protects them), body `kind (u8) | handshake id (u32) | Noise message`:
//! 1. initiator → responder: `-> e`, empty payload;
//! 2. responder → initiator: `<- e, ee, s, es`, payload the responder's cert;
//! 3. initiator → responder: `-> s, se`, payload the initiator's cert and sender key;
//! 4. responder → initiator: the first transport message, payload the responder's sender key.
//!
//! A sender key is sent only to a side already authenticated as a member (message 3 after
//! checking message 2's cert, message 4 after checking message 3's). The initiator repeats
//! from message 1 when message 2 or 4 does not come within [`ANSWER_WAIT`], backing off to
//! [`MAX_BACKOFF`]; the responder keeps half-done handshakes for [`RESPONDER_KEEP`].
//! One handshake gives each side the other's current key; a node starts one with every
//! member neighbour whose key it lacks or who lacks its current key, so two nodes that start
//! at once both complete, harmlessly.
//!
//! Sans-IO: the daemon hands in `now`, received bodies and the list of neighbours, and sends
//! what comes back.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hop_wire::{EnvelopeRepr, NodeId, TransportId};
use ring::rand::SecureRandom;

use crate::identity::{NodeKey, PublicKey, SIGNATURE_LEN};

/// The Noise protocol of the handshake.
pub const NOISE_PARAMS: &str = "Noise_XX_25519_ChaChaPoly_BLAKE2s";
const PROLOGUE: &[u8] = b"hop session v1";
const CERT_CONTEXT: &[u8] = b"hop session key v1";
const CERT_LEN: usize = 32 + SIGNATURE_LEN;
/// Bytes of an encoded sender key: id (u32) and key.
pub const SENDER_KEY_LEN: usize = 4 + 32;
/// How long an initiator waits for each answer before it starts over.
pub const ANSWER_WAIT: Duration = Duration::from_secs(1);
/// The longest wait between two attempts at one neighbour.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a responder keeps a handshake waiting for its third message.
pub const RESPONDER_KEEP: Duration = Duration::from_secs(10);
/// Half-done handshakes a responder keeps at most (a flood of first messages costs memory
/// up to this bound, then is refused).
pub const MAX_RESPONDING: usize = 256;
/// The shortest time between a completed handshake with a neighbour and another one asked
/// for by datagrams that do not open ([`Sessions::suspect_stale`]).
pub const REDO_AFTER: Duration = Duration::from_secs(5);
const KIND_LEN: usize = 1 + 4;
const MAX_MSG: usize = 1024;

/// A node's sender key: what its datagrams are sealed with.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SenderKey {
    /// Random, to tell a new key from the one held.
    pub id: u32,
    pub key: [u8; 32],
}

impl std::fmt::Debug for SenderKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key itself is never printed.
        write!(f, "SenderKey({:08x})", self.id)
    }
}

impl SenderKey {
    /// A new key from the system's generator.
    pub fn generate() -> Result<SenderKey, SessionError> {
        let rng = ring::rand::SystemRandom::new();
        let mut b = [0u8; SENDER_KEY_LEN];
        rng.fill(&mut b).map_err(|_| SessionError::Random)?;
        Ok(SenderKey::decode(&b).expect("length checked"))
    }

    fn encode(&self) -> [u8; SENDER_KEY_LEN] {
        let mut b = [0u8; SENDER_KEY_LEN];
        b[..4].copy_from_slice(&self.id.to_be_bytes());
        b[4..].copy_from_slice(&self.key);
        b
    }

    fn decode(b: &[u8]) -> Option<SenderKey> {
        if b.len() != SENDER_KEY_LEN {
            return None;
        }
        Some(SenderKey {
            id: u32::from_be_bytes(b[..4].try_into().ok()?),
            key: b[4..].try_into().ok()?,
        })
    }
}

/// Why a handshake message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("malformed handshake message")]
    Malformed,
    #[error("handshake message for no handshake in progress")]
    Unexpected,
    #[error("handshake failed: {0}")]
    Noise(String),
    #[error("node key {} is not a member", crate::identity::hex(.0))]
    NotMember(PublicKey),
    #[error("node id {claimed} is not its key's ({of_key})")]
    WrongId { claimed: NodeId, of_key: NodeId },
    #[error("the node key's signature of the session key does not verify")]
    BadCertificate,
    #[error("too many handshakes in progress")]
    Busy,
    #[error("the system's random generator failed")]
    Random,
}

impl From<snow::Error> for SessionError {
    fn from(e: snow::Error) -> Self {
        SessionError::Noise(e.to_string())
    }
}

/// What a received handshake message gave.
#[derive(Debug, Default)]
pub struct Received {
    /// The answer, to send back to where the message came from.
    pub reply: Option<Vec<u8>>,
    /// The neighbour's sender key, once it is authenticated as a member.
    pub key: Option<SenderKey>,
    /// The neighbour's node key, with `key`.
    pub node_key: Option<PublicKey>,
}

enum Stage {
    AwaitResponder(Box<snow::HandshakeState>),
    AwaitKey(Box<snow::TransportState>),
}

struct Initiating {
    hid: u32,
    stage: Stage,
    deadline: Instant,
    /// Id of the own key sent in message 3.
    sent: Option<u32>,
}

#[derive(Debug, Default, Clone)]
struct Peer {
    /// Failed attempts since the last success.
    failures: u32,
    /// No new attempt before this.
    next_try: Option<Instant>,
    /// Id of the own key this neighbour was given.
    delivered: Option<u32>,
    /// When the last handshake with it completed.
    done_at: Option<Instant>,
}

/// Counts for metrics.
#[derive(Debug, Default, Clone, Copy)]
pub struct SessionStats {
    /// Handshakes completed (either role).
    pub completed: u64,
    /// Handshakes started as initiator.
    pub started: u64,
    /// Attempts that got no answer in time.
    pub timed_out: u64,
}

/// The node's sessions with its neighbours.
pub struct Sessions {
    local: NodeId,
    static_private: Vec<u8>,
    cert: [u8; CERT_LEN],
    own: SenderKey,
    initiating: HashMap<NodeId, Initiating>,
    responding: HashMap<(NodeId, u32), (Box<snow::HandshakeState>, Instant)>,
    peers: HashMap<NodeId, Peer>,
    rng: ring::rand::SystemRandom,
    pub stats: SessionStats,
}

fn params() -> snow::params::NoiseParams {
    NOISE_PARAMS.parse().expect("a valid Noise pattern")
}

fn cert_message(id: NodeId, static_public: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(CERT_CONTEXT.len() + 4 + 32);
    m.extend_from_slice(CERT_CONTEXT);
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(static_public);
    m
}

/// Check the certificate `cert` that node `src` sent for the handshake's remote static key.
fn check_cert(
    cert: &[u8],
    remote_static: Option<&[u8]>,
    src: NodeId,
    is_member: &dyn Fn(&PublicKey) -> bool,
) -> Result<PublicKey, SessionError> {
    if cert.len() != CERT_LEN {
        return Err(SessionError::Malformed);
    }
    let key: PublicKey = cert[..32].try_into().map_err(|_| SessionError::Malformed)?;
    let of_key = crate::identity::id_of(&key);
    if of_key != src {
        return Err(SessionError::WrongId {
            claimed: src,
            of_key,
        });
    }
    if !is_member(&key) {
        return Err(SessionError::NotMember(key));
    }
    let remote = remote_static.ok_or(SessionError::BadCertificate)?;
    if !crate::identity::verify(&key, &cert_message(src, remote), &cert[32..]) {
        return Err(SessionError::BadCertificate);
    }
    Ok(key)
}

impl Sessions {
    /// Sessions of node `local` (its id must be `node_key`'s), with a new sender key.
    pub fn new(local: NodeId, node_key: &Arc<NodeKey>) -> Result<Sessions, SessionError> {
        let kp = snow::Builder::new(params()).generate_keypair()?;
        let sig = node_key.sign(&cert_message(local, &kp.public));
        let mut cert = [0u8; CERT_LEN];
        cert[..32].copy_from_slice(node_key.public());
        cert[32..].copy_from_slice(&sig);
        Ok(Sessions {
            local,
            static_private: kp.private,
            cert,
            own: SenderKey::generate()?,
            initiating: HashMap::new(),
            responding: HashMap::new(),
            peers: HashMap::new(),
            rng: ring::rand::SystemRandom::new(),
            stats: SessionStats::default(),
        })
    }

    /// The key this node seals with.
    pub fn own(&self) -> SenderKey {
        self.own
    }

    /// Replace the own key (after a revocation): every neighbour is given the new one by a
    /// new handshake ([`Sessions::poll`]).
    pub fn rotate(&mut self) -> Result<SenderKey, SessionError> {
        self.own = SenderKey::generate()?;
        for p in self.peers.values_mut() {
            p.next_try = None;
            p.failures = 0;
        }
        Ok(self.own)
    }

    /// Forget a neighbour (revoked): no handshake with it goes on.
    pub fn forget(&mut self, peer: NodeId) {
        self.peers.remove(&peer);
        self.initiating.remove(&peer);
        self.responding.retain(|(p, _), _| *p != peer);
    }

    /// Whether a handshake is under way with `peer` as initiator.
    pub fn in_progress(&self, peer: NodeId) -> bool {
        self.initiating.contains_key(&peer)
    }

    /// `peer`'s datagrams came under a key this node does not hold (it restarted or made a
    /// new key and the handshake that carried it was lost): let the next
    /// [`Sessions::poll`] redo the handshake, at most once per [`REDO_AFTER`] after the
    /// last one completed (a forger of `peer`'s id cannot make this node spin).
    pub fn suspect_stale(&mut self, peer: NodeId, now: Instant) {
        let p = self.peers.entry(peer).or_default();
        if p.done_at.is_some_and(|t| now < t + REDO_AFTER) {
            return;
        }
        p.delivered = None;
        if p.next_try.is_some_and(|t| t > now + ANSWER_WAIT) {
            p.next_try = Some(now + ANSWER_WAIT);
        }
    }

    fn random_u32(&self) -> u32 {
        let mut b = [0u8; 4];
        let _ = self.rng.fill(&mut b);
        u32::from_be_bytes(b)
    }

    fn envelope(&self, to: NodeId, kind: u8, hid: u32, msg: &[u8]) -> Vec<u8> {
        let mut body = Vec::with_capacity(KIND_LEN + msg.len());
        body.push(kind);
        body.extend_from_slice(&hid.to_be_bytes());
        body.extend_from_slice(msg);
        let mut out = Vec::new();
        let _ = EnvelopeRepr {
            transport: TransportId::Session,
            flags: 0,
            link_src: self.local,
            link_dst: to,
        }
        .emit(&body, &mut out);
        out
    }

    fn backoff(failures: u32) -> Duration {
        ANSWER_WAIT
            .saturating_mul(1u32 << failures.min(5))
            .min(MAX_BACKOFF)
    }

    /// Start handshakes that are due and give up on those unanswered. `neighbours`: the
    /// member neighbours and their addresses; `have_key(id)`: whether this node holds that
    /// neighbour's current key. Returns the messages to send.
    pub fn poll(
        &mut self,
        now: Instant,
        neighbours: &[(NodeId, SocketAddr)],
        have_key: &dyn Fn(NodeId) -> bool,
    ) -> Vec<(SocketAddr, Vec<u8>)> {
        self.responding.retain(|_, (_, t)| *t > now);
        let timed_out: Vec<NodeId> = self
            .initiating
            .iter()
            .filter(|(_, i)| i.deadline <= now)
            .map(|(p, _)| *p)
            .collect();
        for p in timed_out {
            self.initiating.remove(&p);
            self.stats.timed_out += 1;
            let peer = self.peers.entry(p).or_default();
            peer.failures = peer.failures.saturating_add(1);
            peer.next_try = Some(now + Self::backoff(peer.failures));
        }
        let mut out = Vec::new();
        for &(id, addr) in neighbours {
            if id == self.local || self.initiating.contains_key(&id) {
                continue;
            }
            let peer = self.peers.entry(id).or_default();
            let needed = !have_key(id) || peer.delivered != Some(self.own.id);
            if !needed || peer.next_try.is_some_and(|t| t > now) {
                continue;
            }
            match self.start(id, now) {
                Ok(dg) => out.push((addr, dg)),
                Err(e) => {
                    tracing::warn!(neighbour = id, error = %e, "cannot start a session handshake")
                }
            }
        }
        out
    }

    fn start(&mut self, peer: NodeId, now: Instant) -> Result<Vec<u8>, SessionError> {
        let mut hs = snow::Builder::new(params())
            .local_private_key(&self.static_private)?
            .prologue(PROLOGUE)?
            .build_initiator()?;
        let mut buf = [0u8; MAX_MSG];
        let n = hs.write_message(&[], &mut buf)?;
        let hid = self.random_u32();
        let dg = self.envelope(peer, 1, hid, &buf[..n]);
        self.initiating.insert(
            peer,
            Initiating {
                hid,
                stage: Stage::AwaitResponder(Box::new(hs)),
                deadline: now + ANSWER_WAIT,
                sent: None,
            },
        );
        self.stats.started += 1;
        Ok(dg)
    }

    /// A handshake message (the envelope's body) from node `src`. `is_member`: whether a
    /// node key belongs to the mesh.
    pub fn handle(
        &mut self,
        now: Instant,
        src: NodeId,
        body: &[u8],
        is_member: &dyn Fn(&PublicKey) -> bool,
    ) -> Result<Received, SessionError> {
        if body.len() < KIND_LEN || src == self.local {
            return Err(SessionError::Malformed);
        }
        let kind = body[0];
        let hid = u32::from_be_bytes(body[1..5].try_into().map_err(|_| SessionError::Malformed)?);
        let msg = &body[KIND_LEN..];
        let mut buf = [0u8; MAX_MSG];
        let mut payload = [0u8; MAX_MSG];
        match kind {
            1 => {
                if !self.responding.contains_key(&(src, hid))
                    && self.responding.len() >= MAX_RESPONDING
                {
                    return Err(SessionError::Busy);
                }
                let mut hs = snow::Builder::new(params())
                    .local_private_key(&self.static_private)?
                    .prologue(PROLOGUE)?
                    .build_responder()?;
                hs.read_message(msg, &mut payload)?;
                let n = hs.write_message(&self.cert, &mut buf)?;
                self.responding
                    .insert((src, hid), (Box::new(hs), now + RESPONDER_KEEP));
                Ok(Received {
                    reply: Some(self.envelope(src, 2, hid, &buf[..n])),
                    ..Default::default()
                })
            }
            2 => {
                let Some(init) = self.initiating.get_mut(&src) else {
                    return Err(SessionError::Unexpected);
                };
                if init.hid != hid || !matches!(init.stage, Stage::AwaitResponder(_)) {
                    return Err(SessionError::Unexpected);
                }
                let Some(Initiating {
                    stage: Stage::AwaitResponder(mut hs),
                    ..
                }) = self.initiating.remove(&src)
                else {
                    return Err(SessionError::Unexpected);
                };
                let n = hs.read_message(msg, &mut payload)?;
                check_cert(&payload[..n], hs.get_remote_static(), src, is_member)?;
                let mut p3 = [0u8; CERT_LEN + SENDER_KEY_LEN];
                p3[..CERT_LEN].copy_from_slice(&self.cert);
                p3[CERT_LEN..].copy_from_slice(&self.own.encode());
                let n = hs.write_message(&p3, &mut buf)?;
                let ts = hs.into_transport_mode()?;
                self.initiating.insert(
                    src,
                    Initiating {
                        hid,
                        stage: Stage::AwaitKey(Box::new(ts)),
                        deadline: now + ANSWER_WAIT,
                        sent: Some(self.own.id),
                    },
                );
                Ok(Received {
                    reply: Some(self.envelope(src, 3, hid, &buf[..n])),
                    ..Default::default()
                })
            }
            3 => {
                let Some((mut hs, _)) = self.responding.remove(&(src, hid)) else {
                    return Err(SessionError::Unexpected);
                };
                let n = hs.read_message(msg, &mut payload)?;
                if n != CERT_LEN + SENDER_KEY_LEN {
                    return Err(SessionError::Malformed);
                }
                let node_key =
                    check_cert(&payload[..CERT_LEN], hs.get_remote_static(), src, is_member)?;
                let key =
                    SenderKey::decode(&payload[CERT_LEN..n]).ok_or(SessionError::Malformed)?;
                let mut ts = hs.into_transport_mode()?;
                let n = ts.write_message(&self.own.encode(), &mut buf)?;
                let peer = self.peers.entry(src).or_default();
                // Optimistic: if message 4 is lost the initiator starts over and gets it then.
                peer.delivered = Some(self.own.id);
                peer.failures = 0;
                peer.next_try = None;
                peer.done_at = Some(now);
                self.stats.completed += 1;
                Ok(Received {
                    reply: Some(self.envelope(src, 4, hid, &buf[..n])),
                    key: Some(key),
                    node_key: Some(node_key),
                })
            }
            4 => {
                let Some(init) = self.initiating.get_mut(&src) else {
                    return Err(SessionError::Unexpected);
                };
                if init.hid != hid {
                    return Err(SessionError::Unexpected);
                }
                let Stage::AwaitKey(ts) = &mut init.stage else {
                    return Err(SessionError::Unexpected);
                };
                let n = ts.read_message(msg, &mut payload)?;
                let key = SenderKey::decode(&payload[..n]).ok_or(SessionError::Malformed)?;
                let sent = init.sent;
                self.initiating.remove(&src);
                let peer = self.peers.entry(src).or_default();
                peer.delivered = sent;
                peer.failures = 0;
                peer.next_try = None;
                peer.done_at = Some(now);
                self.stats.completed += 1;
                Ok(Received {
                    key: Some(key),
                    ..Default::default()
                })
            }
            _ => Err(SessionError::Malformed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hop_wire::Envelope;

    struct Side {
        s: Sessions,
        id: NodeId,
        key: PublicKey,
        addr: SocketAddr,
        /// Sender keys learned, per neighbour.
        learned: HashMap<NodeId, SenderKey>,
    }

    fn side(port: u16) -> Side {
        let k = Arc::new(NodeKey::from_seed(&NodeKey::generate_seed().unwrap()).unwrap());
        let id = k.node_id();
        Side {
            s: Sessions::new(id, &k).unwrap(),
            id,
            key: *k.public(),
            addr: format!("127.0.0.1:{port}").parse().unwrap(),
            learned: HashMap::new(),
        }
    }

    /// Deliver `dg` (an envelope) to `to`; returns its reply envelope if any.
    fn deliver(
        to: &mut Side,
        dg: &[u8],
        now: Instant,
        members: &[PublicKey],
    ) -> Result<Option<Vec<u8>>, SessionError> {
        let env = Envelope::parse(dg).unwrap();
        assert_eq!(env.repr.transport, TransportId::Session);
        assert_eq!(env.repr.link_dst, to.id);
        let r =
            to.s.handle(now, env.repr.link_src, env.body, &|k| members.contains(k))?;
        if let Some(k) = r.key {
            to.learned.insert(env.repr.link_src, k);
        }
        Ok(r.reply)
    }

    /// Run one poll of `a` towards `b` and carry the messages back and forth, dropping the
    /// message numbers in `drop` (1-4).
    fn exchange(
        a: &mut Side,
        b: &mut Side,
        now: Instant,
        members: &[PublicKey],
        drop: &[usize],
    ) -> Result<(), SessionError> {
        let learned = a.learned.clone();
        let out =
            a.s.poll(now, &[(b.id, b.addr)], &|id| learned.contains_key(&id));
        let Some((to, mut dg)) = out.into_iter().next() else {
            return Ok(());
        };
        assert_eq!(to, b.addr);
        for n in 1..=4 {
            if drop.contains(&n) {
                return Ok(());
            }
            let (rx, other) = if n % 2 == 1 {
                (&mut *b, &mut *a)
            } else {
                (&mut *a, &mut *b)
            };
            let _ = other;
            match deliver(rx, &dg, now, members)? {
                Some(r) => dg = r,
                None => return Ok(()),
            }
        }
        Ok(())
    }

    #[test]
    fn a_handshake_gives_each_member_the_other_ones_key() {
        let (mut a, mut b) = (side(1), side(2));
        let members = [a.key, b.key];
        let now = Instant::now();
        exchange(&mut a, &mut b, now, &members, &[]).unwrap();
        assert_eq!(a.learned.get(&b.id), Some(&b.s.own()));
        assert_eq!(b.learned.get(&a.id), Some(&a.s.own()));
        // Nothing more is due on either side.
        let learned = a.learned.clone();
        assert!(a
            .s
            .poll(now, &[(b.id, b.addr)], &|id| learned.contains_key(&id))
            .is_empty());
        let learned = b.learned.clone();
        assert!(b
            .s
            .poll(now, &[(a.id, a.addr)], &|id| learned.contains_key(&id))
            .is_empty());
    }

    #[test]
    fn neither_side_gives_its_key_to_a_node_that_is_not_a_member() {
        let (mut a, mut b) = (side(1), side(2));
        let now = Instant::now();
        // b is not a member for a: a refuses message 2 and sends no key.
        let only = [a.key];
        let r = exchange(&mut a, &mut b, now, &only, &[]);
        assert_eq!(r, Err(SessionError::NotMember(b.key)));
        assert!(b.learned.is_empty() && a.learned.is_empty());
        // a is not a member for b: b refuses message 3 and answers nothing.
        let (mut a, mut b) = (side(3), side(4));
        let only = [b.key];
        let r = exchange(&mut a, &mut b, now, &only, &[]);
        assert_eq!(r, Err(SessionError::NotMember(a.key)));
        assert!(b.learned.is_empty() && a.learned.is_empty());
    }

    #[test]
    fn a_lost_answer_is_repeated_after_a_wait_that_backs_off() {
        let (mut a, mut b) = (side(1), side(2));
        let members = [a.key, b.key];
        let t0 = Instant::now();
        exchange(&mut a, &mut b, t0, &members, &[4]).unwrap();
        // b has a's key; a waits for message 4.
        assert!(b.learned.contains_key(&a.id) && !a.learned.contains_key(&b.id));
        assert!(a.s.in_progress(b.id));
        // Before the wait ends nothing new; after it, a is in back-off for one more wait.
        exchange(&mut a, &mut b, t0 + ANSWER_WAIT / 2, &members, &[]).unwrap();
        assert!(!a.learned.contains_key(&b.id));
        exchange(&mut a, &mut b, t0 + ANSWER_WAIT, &members, &[]).unwrap();
        assert!(!a.learned.contains_key(&b.id));
        assert_eq!(a.s.stats.timed_out, 1);
        exchange(&mut a, &mut b, t0 + ANSWER_WAIT * 3, &members, &[]).unwrap();
        assert_eq!(a.learned.get(&b.id), Some(&b.s.own()));
    }

    #[test]
    fn a_new_own_key_goes_to_every_neighbour() {
        let (mut a, mut b) = (side(1), side(2));
        let members = [a.key, b.key];
        let now = Instant::now();
        exchange(&mut a, &mut b, now, &members, &[]).unwrap();
        let old = a.s.own();
        let new = a.s.rotate().unwrap();
        assert_ne!(old, new);
        exchange(&mut a, &mut b, now, &members, &[]).unwrap();
        assert_eq!(b.learned.get(&a.id), Some(&new));
    }

    #[test]
    fn a_certificate_for_another_id_or_static_key_is_refused() {
        let (mut a, mut b) = (side(1), side(2));
        let members = [a.key, b.key];
        let now = Instant::now();
        let out = a.s.poll(now, &[(b.id, b.addr)], &|_| false);
        let m1 = &out[0].1;
        // b's answer, relabelled as if it came from another node id.
        let m2 = deliver(&mut b, m1, now, &members).unwrap().unwrap();
        let env = Envelope::parse(&m2).unwrap();
        let r =
            a.s.handle(now, b.id ^ 1, env.body, &|k| members.contains(k));
        assert_eq!(r.err(), Some(SessionError::Unexpected));
        // A certificate signed for another static key.
        assert_eq!(
            check_cert(&b.s.cert, Some(&[9u8; 32]), b.id, &|_| true),
            Err(SessionError::BadCertificate)
        );
        assert!(matches!(
            check_cert(&b.s.cert, Some(&[9u8; 32]), b.id ^ 1, &|_| true),
            Err(SessionError::WrongId { .. })
        ));
    }

    #[test]
    fn garbage_is_refused_without_panicking() {
        let mut a = side(1);
        let now = Instant::now();
        let rng = ring::rand::SystemRandom::new();
        for len in 0..300 {
            let mut b = vec![0u8; len];
            rng.fill(&mut b).unwrap();
            for kind in 0..6u8 {
                if !b.is_empty() {
                    b[0] = kind;
                }
                assert!(a.s.handle(now, 7, &b, &|_| true).is_err() || kind == 1);
            }
        }
    }
}
