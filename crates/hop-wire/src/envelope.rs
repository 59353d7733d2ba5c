//! The common envelope carried by every datagram between neighbours.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |        magic 0x4850 "HP"      |   version=3   |  transport    |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |     flags     |  reserved=0   |          body length          |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                     link source node id                       |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                   link destination node id                    |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                 body (transport message) ...                  |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |               crc32c of every byte above                      |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |   authentication trailer (only if flags & AUTH) ...           |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! All integers are big-endian. The link destination is the neighbour the sender intends the
//! datagram for; a node that receives a datagram whose link destination is neither itself nor
//! [`BROADCAST_NODE`] has *overheard* it. The authentication trailer is appended and checked
//! by the runtime that holds keys (see `docs/wire-format.md`); this module only reserves the
//! flag and reports the trailer's bytes.

use crate::{Error, NodeId};

/// "HP" in ASCII.
pub const MAGIC: u16 = 0x4850;
/// Current wire version.
pub const VERSION: u8 = 4;
/// Length of the fixed header before the body.
pub const HEADER_LEN: usize = 16;
/// Length of the integrity check after the body.
pub const CRC_LEN: usize = 4;
/// Link destination meaning "every neighbour".
pub const BROADCAST_NODE: NodeId = u32::MAX;
/// Flag: an authentication trailer follows the integrity check.
pub const FLAG_AUTH: u8 = 0x01;
/// Flag: the body is encrypted (only with [`FLAG_AUTH`], whose trailer holds the tag); the
/// integrity check covers the encrypted bytes. The runtime that holds the keys decrypts the
/// body and clears the flag before the node sees the datagram.
pub const FLAG_ENCRYPTED: u8 = 0x02;
/// Flag: the trailer's tag (and an encrypted body) is AES-256-GCM instead of
/// ChaCha20-Poly1305 (only with [`FLAG_AUTH`]).
pub const FLAG_AES_GCM: u8 = 0x04;
const KNOWN_FLAGS: u8 = FLAG_AUTH | FLAG_ENCRYPTED | FLAG_AES_GCM;

/// Which transport a datagram belongs to.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum TransportId {
    /// Hop: reliable per-hop block transfer.
    Hop = 1,
    /// HxH: credit-based hop-by-hop congestion control.
    Hxh = 2,
    /// ATP: ad hoc transport protocol (rate-based, receiver feedback).
    Atp = 3,
    /// TCP-like baseline (NewReno with SACK, end to end; relays forward).
    Tcp = 4,
    /// A node's hello (neighbour discovery, hopd): not a transport; the daemon handles it.
    Hello = 5,
    /// A session handshake between two neighbours (hopd's per-neighbour keys): not a
    /// transport; the daemon handles it.
    Session = 6,
}

impl TransportId {
    pub fn from_u8(v: u8) -> Result<Self, Error> {
        match v {
            1 => Ok(TransportId::Hop),
            2 => Ok(TransportId::Hxh),
            3 => Ok(TransportId::Atp),
            4 => Ok(TransportId::Tcp),
            5 => Ok(TransportId::Hello),
            6 => Ok(TransportId::Session),
            other => Err(Error::UnknownTransport(other)),
        }
    }
}

/// Parsed envelope header; the body is borrowed from the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvelopeRepr {
    pub transport: TransportId,
    pub flags: u8,
    pub link_src: NodeId,
    pub link_dst: NodeId,
}

/// A checked view of a received datagram.
#[derive(Debug, Clone, Copy)]
pub struct Envelope<'a> {
    pub repr: EnvelopeRepr,
    /// The transport message.
    pub body: &'a [u8],
    /// Bytes after the integrity check (the authentication trailer), empty unless `FLAG_AUTH`.
    pub trailer: &'a [u8],
    /// Bytes covered by the integrity check (header and body).
    pub covered: &'a [u8],
}

impl EnvelopeRepr {
    /// Total encoded length of an envelope with a body of `body_len` bytes, without trailer.
    pub fn encoded_len(body_len: usize) -> usize {
        HEADER_LEN + body_len + CRC_LEN
    }

    /// Append header, `body` and integrity check to `out`.
    ///
    /// Bodies longer than 65535 bytes cannot be encoded and yield an error.
    pub fn emit(&self, body: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        self.emit_crc(body, out, true)
    }

    /// As [`EnvelopeRepr::emit`], with the crc32c left zero: for a runtime that seals every
    /// datagram before it leaves (an AEAD tag over the envelope) and computes the crc32c as
    /// it seals, so that it is computed once on the send path.
    pub fn emit_for_sealing(&self, body: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        self.emit_crc(body, out, false)
    }

    /// As [`EnvelopeRepr::emit`] (or [`EnvelopeRepr::emit_for_sealing`] without `crc`) for a
    /// body already written at `buf[HEADER_LEN..]`, the first [`HEADER_LEN`] bytes left for
    /// the header: writes the header there and appends the crc32c, so the body is not copied.
    pub fn emit_around(&self, buf: &mut Vec<u8>, crc: bool) -> Result<(), Error> {
        if buf.len() < HEADER_LEN {
            return Err(Error::Truncated {
                needed: HEADER_LEN,
                have: buf.len(),
            });
        }
        let body_len = u16::try_from(buf.len() - HEADER_LEN).map_err(|_| Error::Malformed {
            field: "body_len",
            reason: "body longer than 65535 bytes",
        })?;
        let mut head = [0u8; HEADER_LEN];
        self.write_header(body_len, &mut head);
        buf[..HEADER_LEN].copy_from_slice(&head);
        let crc = if crc { crc32c::crc32c(buf) } else { 0 };
        buf.extend_from_slice(&crc.to_be_bytes());
        Ok(())
    }

    fn write_header(&self, body_len: u16, head: &mut [u8; HEADER_LEN]) {
        head[0..2].copy_from_slice(&MAGIC.to_be_bytes());
        head[2] = VERSION;
        head[3] = self.transport as u8;
        head[4] = self.flags;
        head[5] = 0;
        head[6..8].copy_from_slice(&body_len.to_be_bytes());
        head[8..12].copy_from_slice(&self.link_src.to_be_bytes());
        head[12..16].copy_from_slice(&self.link_dst.to_be_bytes());
    }

    fn emit_crc(&self, body: &[u8], out: &mut Vec<u8>, crc: bool) -> Result<(), Error> {
        let body_len = u16::try_from(body.len()).map_err(|_| Error::Malformed {
            field: "body_len",
            reason: "body longer than 65535 bytes",
        })?;
        let start = out.len();
        out.reserve(Self::encoded_len(body.len()));
        let mut head = [0u8; HEADER_LEN];
        self.write_header(body_len, &mut head);
        out.extend_from_slice(&head);
        out.extend_from_slice(body);
        let crc = if crc {
            crc32c::crc32c(&out[start..])
        } else {
            0
        };
        out.extend_from_slice(&crc.to_be_bytes());
        Ok(())
    }
}

impl<'a> Envelope<'a> {
    /// Parse and check a datagram. Never panics.
    pub fn parse(buf: &'a [u8]) -> Result<Self, Error> {
        Self::parse_crc(buf, true)
    }

    /// As [`Envelope::parse`], without comparing the crc32c: for a datagram whose bytes an
    /// authentication tag covers, checked by the caller before it trusts anything parsed
    /// (hopd's sealed envelopes), which makes the checksum redundant. Never panics.
    pub fn parse_authenticated(buf: &'a [u8]) -> Result<Self, Error> {
        Self::parse_crc(buf, false)
    }

    fn parse_crc(buf: &'a [u8], check: bool) -> Result<Self, Error> {
        if buf.len() < HEADER_LEN + CRC_LEN {
            return Err(Error::Truncated {
                needed: HEADER_LEN + CRC_LEN,
                have: buf.len(),
            });
        }
        let magic = u16::from_be_bytes([buf[0], buf[1]]);
        if magic != MAGIC {
            return Err(Error::BadMagic(magic));
        }
        if buf[2] != VERSION {
            return Err(Error::UnsupportedVersion(buf[2]));
        }
        let transport = TransportId::from_u8(buf[3])?;
        let flags = buf[4];
        if flags & !KNOWN_FLAGS != 0 || buf[5] != 0 {
            return Err(Error::ReservedBits(
                u32::from(flags & !KNOWN_FLAGS) | (u32::from(buf[5]) << 8),
            ));
        }
        if flags & (FLAG_ENCRYPTED | FLAG_AES_GCM) != 0 && flags & FLAG_AUTH == 0 {
            // An encrypted body, or a cipher named for a tag, without the trailer that carries
            // the tag cannot be read.
            return Err(Error::ReservedBits(u32::from(
                flags & (FLAG_ENCRYPTED | FLAG_AES_GCM),
            )));
        }
        let body_len = usize::from(u16::from_be_bytes([buf[6], buf[7]]));
        let end = HEADER_LEN + body_len;
        if buf.len() < end + CRC_LEN {
            return Err(Error::Truncated {
                needed: end + CRC_LEN,
                have: buf.len(),
            });
        }
        let trailer = &buf[end + CRC_LEN..];
        if flags & FLAG_AUTH == 0 && !trailer.is_empty() {
            return Err(Error::LengthMismatch {
                declared: end + CRC_LEN,
                actual: buf.len(),
            });
        }
        let crc = u32::from_be_bytes([buf[end], buf[end + 1], buf[end + 2], buf[end + 3]]);
        if check && crc32c::crc32c(&buf[..end]) != crc {
            return Err(Error::BadChecksum);
        }
        let link_src = u32::from_be_bytes([buf[8], buf[9], buf[10], buf[11]]);
        let link_dst = u32::from_be_bytes([buf[12], buf[13], buf[14], buf[15]]);
        Ok(Envelope {
            repr: EnvelopeRepr {
                transport,
                flags,
                link_src,
                link_dst,
            },
            body: &buf[HEADER_LEN..end],
            trailer,
            covered: &buf[..end],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let repr = EnvelopeRepr {
            transport: TransportId::Hop,
            flags: 0,
            link_src: 7,
            link_dst: BROADCAST_NODE,
        };
        let mut out = Vec::new();
        repr.emit(b"hello", &mut out).unwrap();
        let env = Envelope::parse(&out).unwrap();
        assert_eq!(env.repr, repr);
        assert_eq!(env.body, b"hello");
        assert!(env.trailer.is_empty());
    }

    #[test]
    fn an_envelope_emitted_around_a_body_in_place_is_the_one_emitted_by_copy() {
        let repr = EnvelopeRepr {
            transport: TransportId::Hop,
            flags: 0,
            link_src: 0x0102_0304,
            link_dst: 9,
        };
        for crc in [true, false] {
            let mut copied = Vec::new();
            if crc {
                repr.emit(b"hello", &mut copied).unwrap();
            } else {
                repr.emit_for_sealing(b"hello", &mut copied).unwrap();
            }
            let mut framed = vec![0xEE; HEADER_LEN];
            framed.extend_from_slice(b"hello");
            repr.emit_around(&mut framed, crc).unwrap();
            assert_eq!(framed, copied, "crc {crc}");
        }
        let mut short = vec![0; HEADER_LEN - 1];
        assert!(repr.emit_around(&mut short, true).is_err());
    }

    #[test]
    fn an_envelope_for_sealing_has_no_crc_and_parses_only_as_authenticated() {
        let repr = EnvelopeRepr {
            transport: TransportId::Hop,
            flags: 0,
            link_src: 7,
            link_dst: 9,
        };
        let mut out = Vec::new();
        repr.emit_for_sealing(b"hello", &mut out).unwrap();
        assert_eq!(out.len(), EnvelopeRepr::encoded_len(5));
        assert_eq!(out[out.len() - CRC_LEN..], [0; CRC_LEN]);
        assert_eq!(Envelope::parse(&out).unwrap_err(), Error::BadChecksum);
        let env = Envelope::parse_authenticated(&out).unwrap();
        assert_eq!((env.repr, env.body), (repr, &b"hello"[..]));
        // Framing is still checked.
        assert!(Envelope::parse_authenticated(&out[..out.len() - 1]).is_err());
        out[0] ^= 1;
        assert!(Envelope::parse_authenticated(&out).is_err());
    }

    #[test]
    fn encrypted_and_cipher_flags_need_the_trailer() {
        for flag in [FLAG_ENCRYPTED, FLAG_AES_GCM] {
            let repr = EnvelopeRepr {
                transport: TransportId::Hop,
                flags: flag,
                link_src: 1,
                link_dst: 2,
            };
            let mut out = Vec::new();
            repr.emit(&[9; 40], &mut out).unwrap();
            assert_eq!(
                Envelope::parse(&out).unwrap_err(),
                Error::ReservedBits(u32::from(flag))
            );
        }
    }

    #[test]
    fn corrupted_byte_is_rejected() {
        let repr = EnvelopeRepr {
            transport: TransportId::Atp,
            flags: 0,
            link_src: 1,
            link_dst: 2,
        };
        let mut out = Vec::new();
        repr.emit(&[9; 40], &mut out).unwrap();
        out[20] ^= 0x40;
        assert_eq!(Envelope::parse(&out).unwrap_err(), Error::BadChecksum);
    }
}
