//! HxH messages (HxH paper §3): data packets with the HxH shim header, and the per-hop
//! acknowledgements, credit updates, end-to-end NACKs and explicit ACKs that travel upstream.
//!
//! Every message starts with a type byte and a flags byte. All integers are big-endian.
//!
//! ```text
//! DATA   (type 1): type flags credits:u16 src:u32 id:u32 dst:u32 seq:u32 rev_ack:u32 payload...
//! HOPACK (type 2): type flags credits:u16 src:u32 id:u32 seq:u32 rev_ack:u32
//! CREDIT (type 3): type flags credits:u16 src:u32 id:u32 rev_ack:u32
//! NACK   (type 4): type flags count:u16 src:u32 id:u32 cum:u32 {start:u32 end:u32} x count
//! ACK    (type 5): type flags 0:u16 src:u32 id:u32 cum:u32
//! ```
//!
//! `(src, id)` names the flow. Sequence numbers count packets from 0. `rev_ack` and `cum` are
//! cumulative: every packet with a sequence number below them has reached the destination.
//! `credits` is the sender's free buffer for the flow, in packets (§3.2). NACK ranges are
//! half-open `[start, end)` runs of missing packets.

use crate::Error;

/// Data flag: the last hop asks the destination for its cumulative ACK (§3.3.1).
pub const DATA_SYNC: u8 = 0x01;
/// Data flag: the destination must answer with an explicit ACK (§3.3.2).
pub const DATA_ACK_REQ: u8 = 0x02;
/// Data flag: this is the last packet of the flow.
pub const DATA_FIN: u8 = 0x04;
/// Data flag: an end-to-end retransmission from the source (informational).
pub const DATA_RETX: u8 = 0x08;
const DATA_FLAGS: u8 = DATA_SYNC | DATA_ACK_REQ | DATA_FIN | DATA_RETX;

/// Hop-ack flag: the receiver had no buffer and discarded the packet; send it again later.
pub const HOPACK_REFUSED: u8 = 0x01;
/// Hop-ack flag: `rev_ack` is the destination's own cumulative ACK (answer to a sync bit).
pub const HOPACK_SYNC_REPLY: u8 = 0x02;
const HOPACK_FLAGS: u8 = HOPACK_REFUSED | HOPACK_SYNC_REPLY;

/// Most ranges a NACK may carry (keeps it well inside one datagram).
pub const MAX_NACK_RANGES: usize = 64;

const T_DATA: u8 = 1;
const T_HOPACK: u8 = 2;
const T_CREDIT: u8 = 3;
const T_NACK: u8 = 4;
const T_ACK: u8 = 5;

/// Data packet header length before the payload.
pub const DATA_HEADER_LEN: usize = 24;

/// A data packet carrying the HxH shim header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Data<'a> {
    pub flags: u8,
    /// Free buffer for this flow at the transmitting node, in packets.
    pub credits: u16,
    pub src: u32,
    pub id: u32,
    pub dst: u32,
    pub seq: u32,
    /// The transmitting node's reverse ACK value for the flow.
    pub rev_ack: u32,
    pub payload: &'a [u8],
}

/// Per-hop acknowledgement of one data packet: the explicit feedback of §3.4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HopAck {
    pub flags: u8,
    pub credits: u16,
    pub src: u32,
    pub id: u32,
    pub seq: u32,
    pub rev_ack: u32,
}

/// Unsolicited credit update from a downstream node whose buffer drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credit {
    pub flags: u8,
    pub credits: u16,
    pub src: u32,
    pub id: u32,
    pub rev_ack: u32,
}

/// End-to-end negative acknowledgement (§3.3.1), routed to the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nack {
    pub src: u32,
    pub id: u32,
    /// Destination's cumulative ACK.
    pub cum: u32,
    /// Missing runs `[start, end)`.
    pub ranges: Vec<(u32, u32)>,
}

/// Explicit end-to-end acknowledgement (§3.3.2), routed to the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    pub src: u32,
    pub id: u32,
    pub cum: u32,
}

/// Any HxH message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    Data(Data<'a>),
    HopAck(HopAck),
    Credit(Credit),
    Nack(Nack),
    Ack(Ack),
}

impl Message<'_> {
    /// Short name for counters.
    pub fn type_name(&self) -> &'static str {
        match self {
            Message::Data(_) => "data",
            Message::HopAck(_) => "hopack",
            Message::Credit(_) => "credit",
            Message::Nack(_) => "nack",
            Message::Ack(_) => "ack",
        }
    }

    /// Append the encoding to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        match self {
            Message::Data(d) => {
                out.extend_from_slice(&[T_DATA, d.flags]);
                out.extend_from_slice(&d.credits.to_be_bytes());
                for v in [d.src, d.id, d.dst, d.seq, d.rev_ack] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
                out.extend_from_slice(d.payload);
            }
            Message::HopAck(a) => {
                out.extend_from_slice(&[T_HOPACK, a.flags]);
                out.extend_from_slice(&a.credits.to_be_bytes());
                for v in [a.src, a.id, a.seq, a.rev_ack] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
            }
            Message::Credit(c) => {
                out.extend_from_slice(&[T_CREDIT, c.flags]);
                out.extend_from_slice(&c.credits.to_be_bytes());
                for v in [c.src, c.id, c.rev_ack] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
            }
            Message::Nack(n) => {
                let count = n.ranges.len().min(MAX_NACK_RANGES);
                out.extend_from_slice(&[T_NACK, 0]);
                out.extend_from_slice(&(count as u16).to_be_bytes());
                for v in [n.src, n.id, n.cum] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
                for &(s, e) in &n.ranges[..count] {
                    out.extend_from_slice(&s.to_be_bytes());
                    out.extend_from_slice(&e.to_be_bytes());
                }
            }
            Message::Ack(a) => {
                out.extend_from_slice(&[T_ACK, 0, 0, 0]);
                for v in [a.src, a.id, a.cum] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
            }
        }
    }

    /// Encode into a fresh vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.emit(&mut v);
        v
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn need(buf: &[u8], n: usize) -> Result<(), Error> {
    if buf.len() < n {
        Err(Error::Truncated {
            needed: n,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

fn exact(buf: &[u8], n: usize) -> Result<(), Error> {
    need(buf, n)?;
    if buf.len() != n {
        return Err(Error::LengthMismatch {
            declared: n,
            actual: buf.len(),
        });
    }
    Ok(())
}

fn check_flags(flags: u8, known: u8) -> Result<(), Error> {
    if flags & !known != 0 {
        Err(Error::ReservedBits(u32::from(flags & !known)))
    } else {
        Ok(())
    }
}

/// Decode one HxH message. Never panics.
pub fn parse(buf: &[u8]) -> Result<Message<'_>, Error> {
    need(buf, 2)?;
    let flags = buf[1];
    match buf[0] {
        T_DATA => {
            need(buf, DATA_HEADER_LEN)?;
            check_flags(flags, DATA_FLAGS)?;
            Ok(Message::Data(Data {
                flags,
                credits: u16_at(buf, 2),
                src: u32_at(buf, 4),
                id: u32_at(buf, 8),
                dst: u32_at(buf, 12),
                seq: u32_at(buf, 16),
                rev_ack: u32_at(buf, 20),
                payload: &buf[DATA_HEADER_LEN..],
            }))
        }
        T_HOPACK => {
            exact(buf, 20)?;
            check_flags(flags, HOPACK_FLAGS)?;
            Ok(Message::HopAck(HopAck {
                flags,
                credits: u16_at(buf, 2),
                src: u32_at(buf, 4),
                id: u32_at(buf, 8),
                seq: u32_at(buf, 12),
                rev_ack: u32_at(buf, 16),
            }))
        }
        T_CREDIT => {
            exact(buf, 16)?;
            check_flags(flags, 0)?;
            Ok(Message::Credit(Credit {
                flags,
                credits: u16_at(buf, 2),
                src: u32_at(buf, 4),
                id: u32_at(buf, 8),
                rev_ack: u32_at(buf, 12),
            }))
        }
        T_NACK => {
            need(buf, 16)?;
            check_flags(flags, 0)?;
            let count = usize::from(u16_at(buf, 2));
            if count > MAX_NACK_RANGES {
                return Err(Error::Malformed {
                    field: "nack.count",
                    reason: "more ranges than allowed",
                });
            }
            exact(buf, 16 + 8 * count)?;
            let mut ranges = Vec::with_capacity(count);
            for i in 0..count {
                let s = u32_at(buf, 16 + 8 * i);
                let e = u32_at(buf, 20 + 8 * i);
                if e <= s {
                    return Err(Error::Malformed {
                        field: "nack.range",
                        reason: "empty or inverted range",
                    });
                }
                ranges.push((s, e));
            }
            Ok(Message::Nack(Nack {
                src: u32_at(buf, 4),
                id: u32_at(buf, 8),
                cum: u32_at(buf, 12),
                ranges,
            }))
        }
        T_ACK => {
            exact(buf, 16)?;
            check_flags(flags, 0)?;
            if u16_at(buf, 2) != 0 {
                return Err(Error::ReservedBits(u32::from(u16_at(buf, 2))));
            }
            Ok(Message::Ack(Ack {
                src: u32_at(buf, 4),
                id: u32_at(buf, 8),
                cum: u32_at(buf, 12),
            }))
        }
        other => Err(Error::UnknownMessageType(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Case = (u8, Vec<u32>, Vec<u8>, Vec<(u32, u32)>);

    fn arb_msg() -> impl Strategy<Value = Case> {
        (
            0u8..5,
            proptest::collection::vec(any::<u32>(), 8),
            proptest::collection::vec(any::<u8>(), 0..300),
            proptest::collection::vec((any::<u32>(), 1u32..1000), 0..MAX_NACK_RANGES),
        )
    }

    fn build<'a>(kind: u8, v: &[u32], payload: &'a [u8], r: &[(u32, u32)]) -> Message<'a> {
        match kind {
            0 => Message::Data(Data {
                flags: (v[0] as u8) & DATA_FLAGS,
                credits: v[1] as u16,
                src: v[2],
                id: v[3],
                dst: v[4],
                seq: v[5],
                rev_ack: v[6],
                payload,
            }),
            1 => Message::HopAck(HopAck {
                flags: (v[0] as u8) & HOPACK_FLAGS,
                credits: v[1] as u16,
                src: v[2],
                id: v[3],
                seq: v[5],
                rev_ack: v[6],
            }),
            2 => Message::Credit(Credit {
                flags: 0,
                credits: v[1] as u16,
                src: v[2],
                id: v[3],
                rev_ack: v[6],
            }),
            3 => Message::Nack(Nack {
                src: v[2],
                id: v[3],
                cum: v[7],
                ranges: r
                    .iter()
                    .map(|&(s, len)| (s.min(u32::MAX - len), s.min(u32::MAX - len) + len))
                    .collect(),
            }),
            _ => Message::Ack(Ack {
                src: v[2],
                id: v[3],
                cum: v[7],
            }),
        }
    }

    proptest! {
        #[test]
        fn round_trip((kind, v, payload, r) in arb_msg()) {
            let m = build(kind, &v, &payload, &r);
            let bytes = m.to_vec();
            prop_assert_eq!(parse(&bytes).unwrap(), m);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn truncation_is_an_error((kind, v, payload, r) in arb_msg(), cut in 1usize..30) {
            let m = build(kind, &v, &payload, &r);
            let bytes = m.to_vec();
            let keep = bytes.len().saturating_sub(cut);
            // Data payloads may be cut anywhere past the header and still parse.
            if !matches!(m, Message::Data(_)) || keep < DATA_HEADER_LEN {
                prop_assert!(parse(&bytes[..keep]).is_err());
            }
        }
    }

    #[test]
    fn rejects_unknown_type_and_flags() {
        assert_eq!(parse(&[9, 0]).unwrap_err(), Error::UnknownMessageType(9));
        let mut b = Message::Ack(Ack {
            src: 1,
            id: 2,
            cum: 3,
        })
        .to_vec();
        b[1] = 0x80;
        assert!(matches!(parse(&b), Err(Error::ReservedBits(_))));
    }
}
