//! TCP-like baseline messages: data segments and acknowledgements with SACK blocks
//! (`docs/transports.md`, "tcp"). The baseline models kernel TCP (NewReno with SACK) for
//! bulk transfer, so the header keeps only what that needs.
//!
//! All integers are big-endian.
//!
//! ```text
//! SEGMENT (type 1): type flags 0:u8 0:u8 src:u32 id:u32 dst:u32 seq:u32 payload...
//! ACK     (type 2): type 0:u8 0:u8 nblocks:u8 src:u32 id:u32 ack:u32 wnd:u32
//!                   {start:u32 end:u32} x nblocks
//! ```
//!
//! `(src, id)` names the flow and `dst` its destination; an ACK travels back toward `src`.
//! Sequence numbers count segments from 0 rather than bytes: every segment but the flow's
//! last carries exactly one MSS, so a segment number is a byte offset divided by the MSS
//! (a simplification of RFC 793's byte numbering that changes nothing for bulk transfer).
//! The segment with [`FLAG_FIN`] is the flow's last (it may be empty). `ack` is cumulative
//! (every segment below it received, RFC 793), `wnd` the receive window in segments
//! (RFC 793 §3.7), and the blocks are RFC 2018 SACK blocks `[start, end)` above `ack`, at
//! most [`MAX_SACK_BLOCKS`] (what fits next to the timestamp option in 40 option bytes).

use crate::Error;

/// Segment flag: last segment of the flow.
pub const FLAG_FIN: u8 = 0x01;
const SEGMENT_FLAGS: u8 = FLAG_FIN;

/// Most SACK blocks in one ACK: RFC 2018 §3 allows 4, 3 when the timestamp option is also
/// present, as on Linux.
pub const MAX_SACK_BLOCKS: usize = 3;

const T_SEGMENT: u8 = 1;
const T_ACK: u8 = 2;

/// Segment header length before the payload.
pub const SEGMENT_HEADER_LEN: usize = 20;
/// ACK length without SACK blocks.
pub const ACK_HEADER_LEN: usize = 20;

/// A data segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment<'a> {
    pub flags: u8,
    pub src: u32,
    pub id: u32,
    pub dst: u32,
    pub seq: u32,
    pub payload: &'a [u8],
}

impl Segment<'_> {
    pub fn fin(&self) -> bool {
        self.flags & FLAG_FIN != 0
    }
}

/// A cumulative acknowledgement with SACK blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub src: u32,
    pub id: u32,
    pub ack: u32,
    pub wnd: u32,
    pub blocks: Vec<(u32, u32)>,
}

/// Any TCP-baseline message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    Segment(Segment<'a>),
    Ack(Ack),
}

impl Message<'_> {
    pub fn type_name(&self) -> &'static str {
        match self {
            Message::Segment(_) => "data",
            Message::Ack(_) => "ack",
        }
    }

    /// Append the encoding to `out`. Blocks beyond [`MAX_SACK_BLOCKS`] are not encoded.
    pub fn emit(&self, out: &mut Vec<u8>) {
        match self {
            Message::Segment(s) => {
                out.extend_from_slice(&[T_SEGMENT, s.flags & SEGMENT_FLAGS, 0, 0]);
                for v in [s.src, s.id, s.dst, s.seq] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
                out.extend_from_slice(s.payload);
            }
            Message::Ack(a) => {
                let n = a.blocks.len().min(MAX_SACK_BLOCKS);
                out.extend_from_slice(&[T_ACK, 0, 0, n as u8]);
                for v in [a.src, a.id, a.ack, a.wnd] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
                for &(s, e) in &a.blocks[..n] {
                    out.extend_from_slice(&s.to_be_bytes());
                    out.extend_from_slice(&e.to_be_bytes());
                }
            }
        }
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.emit(&mut v);
        v
    }
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

/// Decode one message. Never panics.
pub fn parse(buf: &[u8]) -> Result<Message<'_>, Error> {
    need(buf, 4)?;
    match buf[0] {
        T_SEGMENT => {
            need(buf, SEGMENT_HEADER_LEN)?;
            let flags = buf[1];
            if flags & !SEGMENT_FLAGS != 0 || buf[2] != 0 || buf[3] != 0 {
                return Err(Error::ReservedBits(
                    u32::from(flags & !SEGMENT_FLAGS)
                        | u32::from(buf[2]) << 8
                        | u32::from(buf[3]) << 16,
                ));
            }
            Ok(Message::Segment(Segment {
                flags,
                src: u32_at(buf, 4),
                id: u32_at(buf, 8),
                dst: u32_at(buf, 12),
                seq: u32_at(buf, 16),
                payload: &buf[SEGMENT_HEADER_LEN..],
            }))
        }
        T_ACK => {
            if buf[1] != 0 || buf[2] != 0 {
                return Err(Error::ReservedBits(
                    u32::from(buf[1]) | u32::from(buf[2]) << 8,
                ));
            }
            let n = usize::from(buf[3]);
            if n > MAX_SACK_BLOCKS {
                return Err(Error::Malformed {
                    field: "ack.nblocks",
                    reason: "more than 3 SACK blocks",
                });
            }
            let len = ACK_HEADER_LEN + 8 * n;
            need(buf, len)?;
            if buf.len() != len {
                return Err(Error::LengthMismatch {
                    declared: len,
                    actual: buf.len(),
                });
            }
            let ack = u32_at(buf, 12);
            let mut blocks = Vec::with_capacity(n);
            for i in 0..n {
                let s = u32_at(buf, ACK_HEADER_LEN + 8 * i);
                let e = u32_at(buf, ACK_HEADER_LEN + 4 + 8 * i);
                if e <= s {
                    return Err(Error::Malformed {
                        field: "ack.block",
                        reason: "empty or inverted SACK block",
                    });
                }
                blocks.push((s, e));
            }
            Ok(Message::Ack(Ack {
                src: u32_at(buf, 4),
                id: u32_at(buf, 8),
                ack,
                wnd: u32_at(buf, 16),
                blocks,
            }))
        }
        other => Err(Error::UnknownMessageType(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_blocks() -> impl Strategy<Value = Vec<(u32, u32)>> {
        proptest::collection::vec((any::<u32>(), 1u32..1000), 0..=MAX_SACK_BLOCKS).prop_map(|b| {
            b.into_iter()
                .map(|(s, l)| (s.min(u32::MAX - l), s.min(u32::MAX - l) + l))
                .collect()
        })
    }

    proptest! {
        #[test]
        fn segment_round_trip(
            fin in any::<bool>(),
            v in proptest::collection::vec(any::<u32>(), 4),
            payload in proptest::collection::vec(any::<u8>(), 0..1500),
        ) {
            let m = Message::Segment(Segment {
                flags: if fin { FLAG_FIN } else { 0 },
                src: v[0],
                id: v[1],
                dst: v[2],
                seq: v[3],
                payload: &payload,
            });
            let bytes = m.to_vec();
            prop_assert_eq!(bytes.len(), SEGMENT_HEADER_LEN + payload.len());
            prop_assert_eq!(parse(&bytes).unwrap(), m);
        }

        #[test]
        fn ack_round_trip(v in proptest::collection::vec(any::<u32>(), 4), blocks in arb_blocks()) {
            let m = Message::Ack(Ack { src: v[0], id: v[1], ack: v[2], wnd: v[3], blocks });
            let bytes = m.to_vec();
            prop_assert_eq!(parse(&bytes).unwrap(), m);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn truncated_messages_are_errors(
            v in proptest::collection::vec(any::<u32>(), 4),
            blocks in arb_blocks(),
            cut in 1usize..20,
        ) {
            let ack = Message::Ack(Ack { src: v[0], id: v[1], ack: v[2], wnd: v[3], blocks })
                .to_vec();
            prop_assert!(parse(&ack[..ack.len() - cut]).is_err());
            let seg = Message::Segment(Segment {
                flags: 0, src: v[0], id: v[1], dst: v[2], seq: v[3], payload: &[],
            })
            .to_vec();
            prop_assert!(parse(&seg[..seg.len() - cut]).is_err());
        }
    }

    #[test]
    fn malformed_inputs_are_errors() {
        assert!(matches!(parse(&[]), Err(Error::Truncated { .. })));
        assert!(matches!(
            parse(&[T_SEGMENT, 0, 0, 0, 1]),
            Err(Error::Truncated {
                needed: SEGMENT_HEADER_LEN,
                have: 5
            })
        ));
        assert!(matches!(
            parse(&[9, 0, 0, 0]),
            Err(Error::UnknownMessageType(9))
        ));
        let mut seg = vec![T_SEGMENT, 0x80, 0, 0];
        seg.extend_from_slice(&[0; 16]);
        assert!(matches!(parse(&seg), Err(Error::ReservedBits(0x80))));
        let mut ack = vec![T_ACK, 0, 0, 4];
        ack.extend_from_slice(&[0; 16 + 32]);
        assert!(matches!(parse(&ack), Err(Error::Malformed { .. })));
        // An inverted block and trailing bytes.
        let mut ack = vec![T_ACK, 0, 0, 1];
        ack.extend_from_slice(&[0; 16]);
        ack.extend_from_slice(&5u32.to_be_bytes());
        ack.extend_from_slice(&5u32.to_be_bytes());
        assert!(matches!(parse(&ack), Err(Error::Malformed { .. })));
        let mut ack = Message::Ack(Ack {
            src: 1,
            id: 2,
            ack: 3,
            wnd: 4,
            blocks: vec![],
        })
        .to_vec();
        ack.push(0);
        assert!(matches!(parse(&ack), Err(Error::LengthMismatch { .. })));
    }
}
