//! Hop-by-hop authentication of envelopes with a pre-shared mesh key.
//!
//! A sealed envelope has `FLAG_AUTH` set (covered by its crc32c) and carries a 24-byte trailer
//! after the crc: an 8-byte big-endian send counter and a 16-byte ChaCha20-Poly1305 tag
//! (RFC 8439, computed with `ring`). The tag authenticates every byte before the trailer (as
//! associated data, empty plaintext) under the nonce `link source node id (4 bytes) || counter
//! (8 bytes)`, so each (sender, counter) pair is used once. Receivers keep, per sender, the
//! highest counter seen and a sliding window of the [`REPLAY_WINDOW`] counters below it, and
//! drop anything seen before.
//!
//! With encryption on (`[security] encrypt`, the default) the sender also sets
//! `FLAG_ENCRYPTED` and the body travels encrypted: ChaCha20-Poly1305 under the same key and
//! nonce, plaintext the body, associated data the 16-byte header (flags included) and the
//! counter; the crc32c covers the encrypted bytes and the tag is the trailer's. A receiver
//! takes both forms, whatever its own setting: it decrypts an encrypted body into a buffer and
//! clears the flag, so the node sees the plaintext envelope (its crc field is the
//! ciphertext's: the tag has covered every byte, and a node on a sealed link does not
//! compare it).
//!
//! With per-neighbour sessions (`[security] sessions`, session.rs) there is no mesh key: each
//! node seals with its own sender key and opens a neighbour's datagrams with the key that
//! neighbour gave it, kept with its own replay windows; a neighbour's previous key is taken
//! for a short grace after a new one arrives (datagrams already on their way). A datagram
//! from a node whose key is not held is refused as [`AuthError::NoKey`].
//!
//! The AEAD is ChaCha20-Poly1305 unless the sender seals with AES-256-GCM (`[security]
//! cipher`), which it marks with `FLAG_AES_GCM`; receivers open both, whatever their own
//! setting. The AES key is derived from the datagram key (HKDF-SHA256, [`AES_KEY_INFO`]), so
//! that no key serves two algorithms. ChaCha20 is the fast cipher on routers without AES
//! instructions (MIPS, most ARMv7); on CPUs with them (x86-64 with AES-NI, ARMv8 with the
//! crypto extension) AES-256-GCM costs about a third of its CPU per datagram.
//!
//! A sender keeps one counter [`Stream`] per datagram class, told apart by the counter's top
//! bit, and receivers keep one window per sender and stream. Control datagrams travel in the
//! top 802.11e access category and data in the lowest, so a control datagram regularly
//! overtakes hundreds of queued data datagrams on the air; with a single counter the receiver
//! would take those data datagrams for replays.

use std::collections::HashMap;

use hop_wire::envelope::{CRC_LEN, FLAG_AES_GCM, FLAG_AUTH, FLAG_ENCRYPTED, HEADER_LEN, MAGIC};
use hop_wire::{Envelope, NodeId};
use ring::aead::{
    Aad, Algorithm, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM, CHACHA20_POLY1305,
};
use ring::hkdf;

/// Bytes of the authentication trailer: counter + tag.
pub const TRAILER_LEN: usize = 8 + 16;
/// Width of the replay window (counters below the highest seen that are still accepted once).
pub const REPLAY_WINDOW: u64 = 1024;
const WORDS: usize = (REPLAY_WINDOW / 64) as usize;
/// HKDF-SHA256 info under which the AES-256-GCM key is derived from a datagram key (salt
/// empty).
pub const AES_KEY_INFO: &[u8] = b"hop datagram key aes-256-gcm";

/// The AEAD a sender seals with (`[security] cipher`). Receivers open both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
pub enum Cipher {
    /// ChaCha20-Poly1305 (RFC 8439) under the datagram key; the faster one without AES
    /// instructions.
    #[default]
    #[serde(rename = "chacha20-poly1305")]
    ChaCha20Poly1305,
    /// AES-256-GCM under a key derived from the datagram key; flagged `FLAG_AES_GCM`.
    #[serde(rename = "aes-256-gcm")]
    Aes256Gcm,
}

/// `[security] cipher` as written: one AEAD, or `auto`, which picks by the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
pub enum CipherSetting {
    /// AES-256-GCM where the CPU has AES and carry-less multiply instructions (x86-64 with
    /// AES-NI and PCLMULQDQ, ARMv8 with the crypto extension), ChaCha20-Poly1305 elsewhere:
    /// each is the cheaper of the two there (AES-GCM in software is slower than ChaCha20
    /// and not constant-time).
    #[default]
    #[serde(rename = "auto")]
    Auto,
    /// Always ChaCha20-Poly1305.
    #[serde(rename = "chacha20-poly1305")]
    ChaCha20Poly1305,
    /// Always AES-256-GCM.
    #[serde(rename = "aes-256-gcm")]
    Aes256Gcm,
}

impl CipherSetting {
    /// The cipher this node seals with under this setting.
    pub fn resolve(self) -> Cipher {
        match self {
            CipherSetting::Auto if hardware_aes() => Cipher::Aes256Gcm,
            CipherSetting::Auto | CipherSetting::ChaCha20Poly1305 => Cipher::ChaCha20Poly1305,
            CipherSetting::Aes256Gcm => Cipher::Aes256Gcm,
        }
    }
}

/// Whether this CPU runs AES-GCM in hardware.
pub fn hardware_aes() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
            && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

impl Cipher {
    /// The name `[security] cipher` gives it.
    pub fn name(self) -> &'static str {
        match self {
            Cipher::ChaCha20Poly1305 => "chacha20-poly1305",
            Cipher::Aes256Gcm => "aes-256-gcm",
        }
    }

    fn of_flags(flags: u8) -> Cipher {
        if flags & FLAG_AES_GCM != 0 {
            Cipher::Aes256Gcm
        } else {
            Cipher::ChaCha20Poly1305
        }
    }
}

/// The counter bit that names the stream.
const STREAM_BIT: u64 = 1 << 63;

/// A sender's counter stream: one per class of datagram, because the classes are queued
/// separately on the way and reorder against each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Data = 0,
    Control = 1,
}

impl Stream {
    fn of(counter: u64) -> Stream {
        if counter & STREAM_BIT == 0 {
            Stream::Data
        } else {
            Stream::Control
        }
    }
}

/// Why a datagram failed authentication.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("malformed envelope: {0}")]
    Malformed(#[from] hop_wire::Error),
    #[error("no authentication trailer")]
    Unauthenticated,
    #[error("authentication tag does not verify")]
    BadTag,
    #[error("replayed or too old (counter {0})")]
    Replay(u64),
    #[error("sender {0} refused: per-peer state is full")]
    TooManyPeers(NodeId),
    #[error("no key of sender {0} is held (no session with it yet)")]
    NoKey(NodeId),
}

#[derive(Debug, Clone)]
struct Window {
    top: u64,
    /// Bit i of the window: counter `top - i` was seen.
    bits: [u64; WORDS],
}

impl Window {
    fn new(first: u64) -> Self {
        let mut bits = [0u64; WORDS];
        bits[0] = 1;
        Window { top: first, bits }
    }

    fn check(&self, c: u64) -> bool {
        if c > self.top {
            return true;
        }
        let age = self.top - c;
        if age >= REPLAY_WINDOW {
            return false;
        }
        self.bits[(age / 64) as usize] & (1 << (age % 64)) == 0
    }

    fn mark(&mut self, c: u64) {
        if c > self.top {
            let shift = c - self.top;
            if shift >= REPLAY_WINDOW {
                self.bits = [0; WORDS];
            } else {
                let words = (shift / 64) as usize;
                let bitsh = (shift % 64) as u32;
                for i in (0..WORDS).rev() {
                    let src = i.checked_sub(words);
                    let hi = src.map_or(0, |s| self.bits[s]);
                    let lo = src
                        .and_then(|s| s.checked_sub(1))
                        .map_or(0, |s| self.bits[s]);
                    self.bits[i] = if bitsh == 0 {
                        hi
                    } else {
                        (hi << bitsh) | (lo >> (64 - bitsh))
                    };
                }
            }
            self.top = c;
            self.bits[0] |= 1;
        } else {
            let age = self.top - c;
            self.bits[(age / 64) as usize] |= 1 << (age % 64);
        }
    }
}

/// A neighbour's sender key and the replay windows of what came under it.
struct Keyed {
    id: u32,
    aead: DatagramKey,
    windows: [Option<Window>; 2],
}

impl Keyed {
    fn new(id: u32, key: &[u8; 32]) -> Keyed {
        Keyed {
            id,
            aead: aead_key(key),
            windows: [None, None],
        }
    }
}

/// A neighbour's current key and the one before it, taken until the instant given.
struct PeerKeys {
    current: Keyed,
    previous: Option<(Keyed, std::time::Instant)>,
}

/// A datagram key as each cipher uses it: as given for ChaCha20-Poly1305, derived for
/// AES-256-GCM.
struct DatagramKey {
    chacha: LessSafeKey,
    aes: LessSafeKey,
}

impl DatagramKey {
    fn get(&self, cipher: Cipher) -> &LessSafeKey {
        match cipher {
            Cipher::ChaCha20Poly1305 => &self.chacha,
            Cipher::Aes256Gcm => &self.aes,
        }
    }
}

/// HKDF's output length, as `ring` asks for it: the AEAD key's.
struct KeyLen(&'static Algorithm);

impl hkdf::KeyType for KeyLen {
    fn len(&self) -> usize {
        self.0.key_len()
    }
}

fn aead_key(key: &[u8; 32]) -> DatagramKey {
    let mut aes = [0u8; 32];
    hkdf::Salt::new(hkdf::HKDF_SHA256, &[])
        .extract(key)
        .expand(&[AES_KEY_INFO], KeyLen(&AES_256_GCM))
        .and_then(|okm| okm.fill(&mut aes))
        .expect("HKDF-SHA256 gives 32 bytes");
    DatagramKey {
        chacha: LessSafeKey::new(
            UnboundKey::new(&CHACHA20_POLY1305, key).expect("a 32-byte ChaCha20-Poly1305 key"),
        ),
        aes: LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &aes).expect("a 32-byte AES key")),
    }
}

/// Seals outgoing and opens incoming envelopes.
pub struct Authenticator {
    /// The mesh key (none with sessions).
    aead: Option<DatagramKey>,
    /// With sessions: the id and key this node seals with.
    own: Option<(u32, DatagramKey)>,
    /// With sessions: each neighbour's sender keys.
    peer_keys: HashMap<NodeId, PeerKeys>,
    /// The key before the last rotation, still taken until the instant given (neighbours
    /// not yet given the new key keep sealing with it).
    previous: Option<(DatagramKey, std::time::Instant)>,
    /// Datagrams opened with the previous key since the rotation.
    pub opened_with_previous: u64,
    local: NodeId,
    /// Next counter of each stream (index `Stream as usize`), the stream bit included.
    counters: [u64; 2],
    /// Per sender, one window per stream.
    windows: HashMap<NodeId, [Option<Window>; 2]>,
    max_peers: usize,
    /// Seal with the body encrypted.
    encrypt: bool,
    /// The AEAD `seal` uses.
    cipher: Cipher,
}

impl Authenticator {
    /// `first_counter` must exceed every counter this node used before (e.g. the wall clock in
    /// nanoseconds at start), or neighbours drop its datagrams as replays. Its top bit is
    /// ignored: that bit names the stream.
    pub fn new(key: &[u8; 32], local: NodeId, first_counter: u64, max_peers: usize) -> Self {
        let first = first_counter & !STREAM_BIT;
        Authenticator {
            aead: Some(aead_key(key)),
            own: None,
            peer_keys: HashMap::new(),
            previous: None,
            opened_with_previous: 0,
            local,
            counters: [first, first | STREAM_BIT],
            windows: HashMap::new(),
            max_peers,
            encrypt: true,
            cipher: Cipher::default(),
        }
    }

    /// An authenticator without a mesh key: it seals with its own sender key (`own_id`,
    /// `own_key`) and opens only datagrams of neighbours whose keys it was given
    /// ([`Authenticator::set_peer_key`]).
    pub fn with_sessions(
        local: NodeId,
        first_counter: u64,
        max_peers: usize,
        own_id: u32,
        own_key: &[u8; 32],
    ) -> Self {
        let mut a = Authenticator::new(&[0; 32], local, first_counter, max_peers);
        a.aead = None;
        a.own = Some((own_id, aead_key(own_key)));
        a
    }

    /// Seal with this sender key from now on (sessions). Counters go on: a (sender,
    /// counter) pair is never used twice under one key, nor across keys.
    pub fn set_own(&mut self, id: u32, key: &[u8; 32]) {
        self.own = Some((id, aead_key(key)));
    }

    /// Take neighbour `peer`'s datagrams under key `id` from now on; its key before, if
    /// another, is still taken for `grace`. False if `id` is the key already held.
    pub fn set_peer_key(
        &mut self,
        peer: NodeId,
        id: u32,
        key: &[u8; 32],
        grace: std::time::Duration,
    ) -> bool {
        match self.peer_keys.get_mut(&peer) {
            Some(p) if p.current.id == id => false,
            Some(p) => {
                let old = std::mem::replace(&mut p.current, Keyed::new(id, key));
                p.previous = Some((old, std::time::Instant::now() + grace));
                true
            }
            None => {
                self.peer_keys.insert(
                    peer,
                    PeerKeys {
                        current: Keyed::new(id, key),
                        previous: None,
                    },
                );
                true
            }
        }
    }

    /// Whether a key of `peer` is held (sessions).
    pub fn has_peer_key(&self, peer: NodeId) -> bool {
        self.peer_keys.contains_key(&peer)
    }

    /// Neighbours whose keys are held (sessions).
    pub fn keyed_peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.peer_keys.keys().copied()
    }

    /// Drop every key of `peer` (revoked): its datagrams are refused from now on.
    pub fn forget_peer(&mut self, peer: NodeId) {
        self.peer_keys.remove(&peer);
        self.windows.remove(&peer);
    }

    /// Whether this authenticator works with sessions (no mesh key).
    pub fn sessions(&self) -> bool {
        self.own.is_some()
    }

    /// Seal with `key` from now on and keep opening datagrams sealed with the key used so far
    /// for `grace`: a mesh changes its key node by node (`hop reload` on each), and until
    /// the last node has it the others keep sealing with the old one. Counters continue: a
    /// (sender, counter) nonce is never used twice under one key.
    pub fn rotate(&mut self, key: &[u8; 32], grace: std::time::Duration) {
        let Some(old) = self.aead.replace(aead_key(key)) else {
            return;
        };
        self.previous = Some((old, std::time::Instant::now() + grace));
        self.opened_with_previous = 0;
    }

    /// The cipher `seal` uses.
    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    /// Whether `seal` encrypts bodies (receiving takes both forms either way).
    pub fn set_encrypt(&mut self, on: bool) {
        self.encrypt = on;
    }

    /// The AEAD `seal` uses from now on (opening takes both either way).
    pub fn set_cipher(&mut self, cipher: Cipher) {
        self.cipher = cipher;
    }

    /// The next counter either stream will use, without the stream bit.
    pub fn next_counter(&self) -> u64 {
        (self.counters[0] & !STREAM_BIT).max(self.counters[1] & !STREAM_BIT)
    }

    pub fn peers(&self) -> usize {
        self.windows.len().max(self.peer_keys.len())
    }

    fn nonce(src: NodeId, counter: u64) -> Nonce {
        let mut n = [0u8; 12];
        n[..4].copy_from_slice(&src.to_be_bytes());
        n[4..].copy_from_slice(&counter.to_be_bytes());
        Nonce::assume_unique_for_key(n)
    }

    /// Offset of the crc32c of a datagram emitted by the local node (header and body length
    /// checked, checksum not verified). An already sealed datagram yields its crc offset too.
    fn unsealed_end(datagram: &[u8]) -> Result<usize, AuthError> {
        let min = HEADER_LEN + CRC_LEN;
        if datagram.len() < min {
            return Err(hop_wire::Error::Truncated {
                needed: min,
                have: datagram.len(),
            }
            .into());
        }
        let magic = u16::from_be_bytes([datagram[0], datagram[1]]);
        if magic != MAGIC {
            return Err(hop_wire::Error::BadMagic(magic).into());
        }
        let end = HEADER_LEN + usize::from(u16::from_be_bytes([datagram[6], datagram[7]]));
        let sealed = datagram[4] & FLAG_AUTH != 0;
        let expected = end + CRC_LEN + if sealed { TRAILER_LEN } else { 0 };
        if datagram.len() != expected {
            return Err(hop_wire::Error::LengthMismatch {
                declared: expected,
                actual: datagram.len(),
            }
            .into());
        }
        Ok(end)
    }

    /// Turn an unauthenticated envelope (as produced by the node) into a sealed one in place,
    /// numbered in the counter stream of its class.
    pub fn seal(&mut self, datagram: &mut Vec<u8>, stream: Stream) -> Result<(), AuthError> {
        // The datagram comes from the local node, which has just emitted it with a valid
        // crc32c: only its framing is checked here, not its checksum, so that the checksum is
        // computed once on this path (after the flag is set) rather than verified first.
        let end = Self::unsealed_end(datagram)?;
        if datagram[4] & FLAG_AUTH != 0 {
            return Ok(());
        }
        let aead = match (&self.own, &self.aead) {
            (Some((_, k)), _) | (None, Some(k)) => k.get(self.cipher),
            (None, None) => return Err(AuthError::NoKey(self.local)),
        };
        datagram[4] |= FLAG_AUTH;
        if self.cipher == Cipher::Aes256Gcm {
            datagram[4] |= FLAG_AES_GCM;
        }
        let slot = &mut self.counters[stream as usize];
        let counter = *slot;
        // Stays inside its stream: 2^63 datagrams are never reached.
        *slot = (counter.wrapping_add(1) & !STREAM_BIT) | (counter & STREAM_BIT);
        let nonce = Self::nonce(self.local, counter);
        if self.encrypt {
            datagram[4] |= FLAG_ENCRYPTED;
            let aad = Self::body_aad(&datagram[..HEADER_LEN], counter);
            let tag = aead
                .seal_in_place_separate_tag(
                    nonce,
                    Aad::from(&aad[..]),
                    &mut datagram[HEADER_LEN..end],
                )
                .map_err(|_| AuthError::BadTag)?;
            let crc = crc32c::crc32c(&datagram[..end]);
            datagram[end..].copy_from_slice(&crc.to_be_bytes());
            datagram.extend_from_slice(&counter.to_be_bytes());
            datagram.extend_from_slice(tag.as_ref());
            return Ok(());
        }
        let crc = crc32c::crc32c(&datagram[..end]);
        datagram[end..].copy_from_slice(&crc.to_be_bytes());
        let mut aad = std::mem::take(datagram);
        aad.extend_from_slice(&counter.to_be_bytes());
        let tag = aead
            .seal_in_place_separate_tag(nonce, Aad::from(&aad[..]), &mut [])
            .map_err(|_| AuthError::BadTag)?;
        aad.extend_from_slice(tag.as_ref());
        *datagram = aad;
        Ok(())
    }

    /// Check (and for an encrypted body, decrypt into `plain`) a datagram under `aead`.
    #[allow(clippy::too_many_arguments)]
    fn open_with(
        key: &DatagramKey,
        datagram: &[u8],
        plain: &mut Vec<u8>,
        src: NodeId,
        counter: u64,
        end: usize,
        encrypted: bool,
        mut tag: [u8; 16],
    ) -> bool {
        plain.clear();
        let aead = key.get(Cipher::of_flags(datagram[4]));
        if encrypted {
            let aad = Self::body_aad(&datagram[..HEADER_LEN], counter);
            plain.extend_from_slice(datagram);
            let opened = aead.open_in_place_separate_tag(
                Self::nonce(src, counter),
                Aad::from(&aad[..]),
                Tag::from(tag),
                &mut plain[HEADER_LEN..end],
                0..,
            );
            if opened.is_err() {
                plain.clear();
                return false;
            }
            // The plaintext's crc field is left as sent (the ciphertext's): the tag has
            // covered every byte, so readers parse it with `Envelope::parse_authenticated`
            // and a second pass over the body is saved.
            plain[4] &= !FLAG_ENCRYPTED;
            true
        } else {
            let covered = end + CRC_LEN + 8;
            // Empty ciphertext followed by the tag: `open_in_place` checks the tag in constant
            // time.
            aead.open_in_place(
                Self::nonce(src, counter),
                Aad::from(&datagram[..covered]),
                &mut tag,
            )
            .is_ok()
        }
    }

    /// Associated data of an encrypted body: the header as sent, then the counter.
    fn body_aad(header: &[u8], counter: u64) -> [u8; HEADER_LEN + 8] {
        let mut aad = [0u8; HEADER_LEN + 8];
        aad[..HEADER_LEN].copy_from_slice(header);
        aad[HEADER_LEN..].copy_from_slice(&counter.to_be_bytes());
        aad
    }

    /// Check a received datagram. On success returns the link source. A datagram with an
    /// encrypted body is decrypted into `plain` (header flag cleared, trailer kept; its crc
    /// field is the ciphertext's, so it is read with `Envelope::parse_authenticated`, as a
    /// node on a sealed link reads every datagram), which the caller then hands to the node
    /// instead; otherwise `plain` is left empty and the datagram can be handed on as is.
    pub fn open(&mut self, datagram: &[u8], plain: &mut Vec<u8>) -> Result<NodeId, AuthError> {
        plain.clear();
        // The tag checked below covers every byte the crc32c does: the checksum is not
        // compared here (a corrupted datagram fails as `BadTag`).
        let env = Envelope::parse_authenticated(datagram)?;
        if env.repr.flags & FLAG_AUTH == 0 || env.trailer.len() != TRAILER_LEN {
            return Err(AuthError::Unauthenticated);
        }
        let src = env.repr.link_src;
        let counter = u64::from_be_bytes(env.trailer[..8].try_into().unwrap_or([0; 8]));
        let stream = Stream::of(counter) as usize;
        let end = HEADER_LEN + env.body.len();
        let encrypted = env.repr.flags & FLAG_ENCRYPTED != 0;
        let trailer_tag: [u8; 16] = env.trailer[8..].try_into().unwrap_or([0; 16]);
        if self.own.is_some() {
            let Some(p) = self.peer_keys.get_mut(&src) else {
                return Err(AuthError::NoKey(src));
            };
            let now = std::time::Instant::now();
            if p.previous.as_ref().is_some_and(|(_, until)| now >= *until) {
                p.previous = None;
            }
            let mut replay = false;
            let candidates =
                std::iter::once(&mut p.current).chain(p.previous.as_mut().map(|(k, _)| k));
            for k in candidates {
                if k.windows[stream]
                    .as_ref()
                    .is_some_and(|w| !w.check(counter))
                {
                    replay = true;
                    continue;
                }
                if Self::open_with(
                    &k.aead,
                    datagram,
                    plain,
                    src,
                    counter,
                    end,
                    encrypted,
                    trailer_tag,
                ) {
                    match &mut k.windows[stream] {
                        Some(w) => w.mark(counter),
                        slot => *slot = Some(Window::new(counter)),
                    }
                    return Ok(src);
                }
            }
            plain.clear();
            return Err(if replay {
                AuthError::Replay(counter)
            } else {
                AuthError::BadTag
            });
        }
        let Some(aead) = &self.aead else {
            return Err(AuthError::NoKey(src));
        };
        if let Some(ws) = self.windows.get(&src) {
            if ws[stream].as_ref().is_some_and(|w| !w.check(counter)) {
                return Err(AuthError::Replay(counter));
            }
        } else if self.windows.len() >= self.max_peers {
            return Err(AuthError::TooManyPeers(src));
        }
        let mut opened = Self::open_with(
            aead,
            datagram,
            plain,
            src,
            counter,
            end,
            encrypted,
            trailer_tag,
        );
        if !opened {
            if let Some((old, until)) = &self.previous {
                if std::time::Instant::now() < *until {
                    opened = Self::open_with(
                        old,
                        datagram,
                        plain,
                        src,
                        counter,
                        end,
                        encrypted,
                        trailer_tag,
                    );
                    if opened {
                        self.opened_with_previous += 1;
                    }
                } else {
                    self.previous = None;
                }
            }
        }
        if !opened {
            plain.clear();
            return Err(AuthError::BadTag);
        }
        let ws = self.windows.entry(src).or_insert([None, None]);
        match &mut ws[stream] {
            Some(w) => w.mark(counter),
            slot => *slot = Some(Window::new(counter)),
        }
        Ok(src)
    }
}

#[cfg(test)]
mod tests;
