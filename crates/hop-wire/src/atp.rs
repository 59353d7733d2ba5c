//! ATP messages (ATP paper §III-C, Fig. 2, and §V-A3 for the hop count): data packets that
//! carry the path's maximum delay, and receiver feedback with SACK blocks.
//!
//! All integers are big-endian; delays are in microseconds.
//!
//! ```text
//! DATA     (type 1): type flags hops:u8 0:u8 src:u32 id:u32 dst:u32 seq:u32
//!                    d_max:u32 d_s:u32 payload...
//! FEEDBACK (type 2): type flags hops:u8 nblocks:u8 src:u32 id:u32 cum:u32 d_avg:u32
//!                    {start:u32 end:u32} x nblocks
//! ```
//!
//! `(src, id)` names the flow; sequence numbers count packets from 0. `d_max` is the largest
//! per-node delay stamped so far (§II-A), `d_s` the sender's current inter-packet delay (§V-A3),
//! `hops` the number of transmissions so far (`N_h`, §V-A3). A data packet with
//! [`FLAG_SACK_REQ`] and no payload is a quick-start probe and occupies no sequence number.
//! Feedback carries the cumulative ACK (every packet below `cum` received), the receiver's
//! average delay and up to [`MAX_SACK_BLOCKS`] half-open runs `[start, end)` received above
//! `cum`.

use crate::Error;

/// Feedback flag: no data arrived for half an epoch; resend everything unacknowledged.
pub const FLAG_SACK_MORE: u8 = 0x80;
/// Feedback flag: the packet carries SACK blocks rather than data.
pub const FLAG_SACK_OPT: u8 = 0x40;
/// Data: ask for immediate feedback (quick-start). Feedback: the answer to such a request.
pub const FLAG_SACK_REQ: u8 = 0x20;
/// Data: last packet of the flow. Feedback: the receiver holds the whole flow.
pub const FLAG_FIN: u8 = 0x01;
const KNOWN_FLAGS: u8 = FLAG_SACK_MORE | FLAG_SACK_OPT | FLAG_SACK_REQ | FLAG_FIN;

/// Most SACK blocks in one feedback packet (ATP paper §II-B).
pub const MAX_SACK_BLOCKS: usize = 20;

const T_DATA: u8 = 1;
const T_FEEDBACK: u8 = 2;

/// Data header length before the payload.
pub const DATA_HEADER_LEN: usize = 28;
/// Offset of `hops` in a data packet, for in-place update by forwarding nodes.
pub const HOPS_OFFSET: usize = 2;
/// Offset of `d_max` in a data packet, for in-place update by forwarding nodes.
pub const D_MAX_OFFSET: usize = 20;

/// A data packet or quick-start probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Data<'a> {
    pub flags: u8,
    pub hops: u8,
    pub src: u32,
    pub id: u32,
    pub dst: u32,
    pub seq: u32,
    pub d_max_us: u32,
    pub d_s_us: u32,
    pub payload: &'a [u8],
}

impl Data<'_> {
    /// A quick-start probe: asks for feedback and carries no data.
    pub fn is_probe(&self) -> bool {
        self.flags & FLAG_SACK_REQ != 0 && self.payload.is_empty()
    }
}

/// Receiver feedback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feedback {
    pub flags: u8,
    pub hops: u8,
    pub src: u32,
    pub id: u32,
    pub cum: u32,
    pub d_avg_us: u32,
    pub blocks: Vec<(u32, u32)>,
}

/// Any ATP message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    Data(Data<'a>),
    Feedback(Feedback),
}

impl Message<'_> {
    pub fn type_name(&self) -> &'static str {
        match self {
            Message::Data(d) if d.is_probe() => "probe",
            Message::Data(_) => "data",
            Message::Feedback(_) => "feedback",
        }
    }

    /// Append the encoding to `out`. Blocks beyond [`MAX_SACK_BLOCKS`] are not encoded.
    pub fn emit(&self, out: &mut Vec<u8>) {
        match self {
            Message::Data(d) => {
                out.extend_from_slice(&[T_DATA, d.flags, d.hops, 0]);
                for v in [d.src, d.id, d.dst, d.seq, d.d_max_us, d.d_s_us] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
                out.extend_from_slice(d.payload);
            }
            Message::Feedback(f) => {
                let n = f.blocks.len().min(MAX_SACK_BLOCKS);
                out.extend_from_slice(&[T_FEEDBACK, f.flags, f.hops, n as u8]);
                for v in [f.src, f.id, f.cum, f.d_avg_us] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
                for &(s, e) in &f.blocks[..n] {
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

/// Decode one ATP message. Never panics.
pub fn parse(buf: &[u8]) -> Result<Message<'_>, Error> {
    need(buf, 4)?;
    let flags = buf[1];
    if flags & !KNOWN_FLAGS != 0 {
        return Err(Error::ReservedBits(u32::from(flags & !KNOWN_FLAGS)));
    }
    match buf[0] {
        T_DATA => {
            need(buf, DATA_HEADER_LEN)?;
            if buf[3] != 0 {
                return Err(Error::ReservedBits(u32::from(buf[3]) << 8));
            }
            if flags & (FLAG_SACK_MORE | FLAG_SACK_OPT) != 0 {
                return Err(Error::Malformed {
                    field: "data.flags",
                    reason: "feedback-only flag on data",
                });
            }
            Ok(Message::Data(Data {
                flags,
                hops: buf[2],
                src: u32_at(buf, 4),
                id: u32_at(buf, 8),
                dst: u32_at(buf, 12),
                seq: u32_at(buf, 16),
                d_max_us: u32_at(buf, 20),
                d_s_us: u32_at(buf, 24),
                payload: &buf[DATA_HEADER_LEN..],
            }))
        }
        T_FEEDBACK => {
            let n = usize::from(buf[3]);
            if n > MAX_SACK_BLOCKS {
                return Err(Error::Malformed {
                    field: "feedback.nblocks",
                    reason: "more than 20 SACK blocks",
                });
            }
            let len = 20 + 8 * n;
            need(buf, len)?;
            if buf.len() != len {
                return Err(Error::LengthMismatch {
                    declared: len,
                    actual: buf.len(),
                });
            }
            let mut blocks = Vec::with_capacity(n);
            for i in 0..n {
                let s = u32_at(buf, 20 + 8 * i);
                let e = u32_at(buf, 24 + 8 * i);
                if e <= s {
                    return Err(Error::Malformed {
                        field: "feedback.block",
                        reason: "empty or inverted SACK block",
                    });
                }
                blocks.push((s, e));
            }
            Ok(Message::Feedback(Feedback {
                flags,
                hops: buf[2],
                src: u32_at(buf, 4),
                id: u32_at(buf, 8),
                cum: u32_at(buf, 12),
                d_avg_us: u32_at(buf, 16),
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

    type Case = (bool, u8, Vec<u32>, Vec<u8>, Vec<(u32, u32)>);

    fn arb() -> impl Strategy<Value = Case> {
        (
            any::<bool>(),
            any::<u8>(),
            proptest::collection::vec(any::<u32>(), 7),
            proptest::collection::vec(any::<u8>(), 0..300),
            proptest::collection::vec((any::<u32>(), 1u32..1000), 0..=MAX_SACK_BLOCKS),
        )
    }

    fn build<'a>(data: bool, f: u8, v: &[u32], payload: &'a [u8], b: &[(u32, u32)]) -> Message<'a> {
        if data {
            Message::Data(Data {
                flags: f & (FLAG_SACK_REQ | FLAG_FIN),
                hops: v[0] as u8,
                src: v[1],
                id: v[2],
                dst: v[3],
                seq: v[4],
                d_max_us: v[5],
                d_s_us: v[6],
                payload,
            })
        } else {
            Message::Feedback(Feedback {
                flags: f & KNOWN_FLAGS,
                hops: v[0] as u8,
                src: v[1],
                id: v[2],
                cum: v[4],
                d_avg_us: v[5],
                blocks: b
                    .iter()
                    .map(|&(s, l)| (s.min(u32::MAX - l), s.min(u32::MAX - l) + l))
                    .collect(),
            })
        }
    }

    proptest! {
        #[test]
        fn round_trip((d, f, v, p, b) in arb()) {
            let m = build(d, f, &v, &p, &b);
            let bytes = m.to_vec();
            prop_assert_eq!(parse(&bytes).unwrap(), m);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn truncated_feedback_is_an_error((_d, f, v, p, b) in arb(), cut in 1usize..20) {
            let m = build(false, f, &v, &p, &b);
            let bytes = m.to_vec();
            prop_assert!(parse(&bytes[..bytes.len() - cut]).is_err());
        }
    }

    #[test]
    fn offsets_match_layout() {
        let m = Message::Data(Data {
            flags: 0,
            hops: 7,
            src: 1,
            id: 2,
            dst: 3,
            seq: 4,
            d_max_us: 0xAABB_CCDD,
            d_s_us: 5,
            payload: b"x",
        });
        let b = m.to_vec();
        assert_eq!(b[HOPS_OFFSET], 7);
        assert_eq!(u32_at(&b, D_MAX_OFFSET), 0xAABB_CCDD);
    }

    #[test]
    fn too_many_blocks_rejected() {
        let mut b = vec![T_FEEDBACK, 0, 0, 21];
        b.extend_from_slice(&[0; 16 + 8 * 21]);
        assert!(matches!(parse(&b), Err(Error::Malformed { .. })));
    }
}
