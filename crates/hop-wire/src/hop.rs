//! Messages of the Hop transport (Hop paper §4.2 "Header format"), carried as envelope bodies.
//!
//! Every message starts with a 20-byte common header, followed by a type-specific part. All
//! integers are big-endian. The byte-by-byte layout is documented in `docs/wire-format.md`.
//!
//! ```text
//! offset size field
//!  0      1   msg_type   1 DATA, 2 BSYN, 3 BACK, 4 E2E_BACK, 5 FIN
//!  1      1   flags      VTX 0x01, FIN 0x02, MICRO 0x04, ABORT 0x08, COMPLETE 0x10, ASK 0x20
//!  2      1   ttl        hops a virtual retransmission may still travel (0 otherwise)
//!  3      1   priority   0 normal, 1 bulk, 2 expedited (the flow's class)
//!  4      4   src        end-to-end source node id (owner of the flow id)
//!  8      4   flow_id    flow id, unique at `src`
//! 12      4   dst        end-to-end destination node id
//! 16      4   block_num  block number within the flow
//! ```
//!
//! Decoders never panic: every byte string yields a [`HopMessage`] or an [`Error`].

use crate::{Error, NodeId};

/// Length of the common header.
pub const HEADER_LEN: usize = 20;
/// Bytes after the common header of a DATA message, before its payload.
pub const DATA_FIXED_LEN: usize = 18;
/// Bytes after the common header of a BSYN message, before its payload.
pub const BSYN_FIXED_LEN: usize = 25;
/// Bytes after the common header of a BACK message, before its bitmap.
pub const BACK_FIXED_LEN: usize = 17;
/// Largest number of packets in one block (packet numbers are 16 bits).
pub const MAX_PACKETS_PER_BLOCK: u32 = 65_535;

/// Flag: this BSYN is a virtual retransmission (Hop paper §3.2).
pub const FLAG_VTX: u8 = 0x01;
/// Flag: this block is the last of the flow (BSYN/DATA/BACK), or the flow is finished
/// (E2E_BACK).
pub const FLAG_FIN: u8 = 0x02;
/// Flag: the block is a micro-block; the BSYN carries one of its packets (Hop paper §3.6).
pub const FLAG_MICRO: u8 = 0x04;
/// Flag: the FIN message tears down an aborted flow.
pub const FLAG_ABORT: u8 = 0x08;
/// Flag: the BACK reports the whole block received.
pub const FLAG_COMPLETE: u8 = 0x10;
/// Flag: the sender of this micro-block BSYN asks for a BACK (set on the last BSYN of a round).
pub const FLAG_ASK: u8 = 0x20;
/// Flag: the BACK is a wait notice. The receiver holds the BSYN for later (ack withholding,
/// §3.5, or backpressure, §3.3) and will send the real BACK when the sender's turn comes; the
/// notice carries no bitmap (0 packets). On an E2E_BACK: the destination holds the block but
/// cannot deliver it (its application store is full); nothing is acknowledged.
pub const FLAG_WAIT: u8 = 0x40;
/// Flag (BSYN): this BSYN left behind the round's data, in one FIFO queue with it, as the
/// sender has learnt of its link to the addressee: answer at once, what the BACK lacks of the
/// round was lost. Shares its bit with `FLAG_COMPLETE` (BACK).
pub const FLAG_BEHIND: u8 = 0x10;
/// Flag (BACK): the round's end (the packet the answered BSYN names) had arrived when that
/// BSYN did, the BSYN came behind its data. Shares its bit with `FLAG_ABORT` (FIN).
pub const FLAG_END_HEARD: u8 = 0x08;
/// Flag: this BSYN or BACK repeats, byte for byte but for its sequence number, the one sent
/// just before it (a control copy, sent where the addressee reports control datagrams lost).
pub const FLAG_COPY: u8 = 0x80;

/// The control-link fields of a BSYN and a BACK: every such datagram a node sends to one
/// neighbour is numbered (`seq`, counting up from 1, skipping 0 when it wraps), so the
/// neighbour counts the ones lost; each carries the latest number the sender heard from the
/// addressee (`echo`), so a BACK names the BSYNs it follows; and the sender's smoothed loss
/// of the addressee's numbered datagrams (`loss`, in 1/255), which tells the addressee
/// whether to send its control datagrams twice. 0 in `seq` or `echo`: none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ControlSeq {
    pub seq: u16,
    pub echo: u16,
    pub loss: u8,
}

/// Bytes of [`ControlSeq`] on the wire.
pub const CONTROL_SEQ_LEN: usize = 5;

/// Write `ctl` into an encoded BSYN or BACK (the fields are filled as the datagram is queued,
/// in the order datagrams leave). False, and nothing written, for any other message.
pub fn set_control_seq(buf: &mut [u8], ctl: ControlSeq) -> bool {
    let at = match buf.first().map(|t| MsgType::from_u8(*t)) {
        Some(Ok(MsgType::Bsyn)) => HEADER_LEN + 20,
        Some(Ok(MsgType::Back)) => HEADER_LEN + 12,
        _ => return false,
    };
    let Some(field) = buf.get_mut(at..at + CONTROL_SEQ_LEN) else {
        return false;
    };
    field[..2].copy_from_slice(&ctl.seq.to_be_bytes());
    field[2..4].copy_from_slice(&ctl.echo.to_be_bytes());
    field[4] = ctl.loss;
    true
}

impl ControlSeq {
    fn read(b: &[u8]) -> Self {
        ControlSeq {
            seq: be_u16(b, 0),
            echo: be_u16(b, 2),
            loss: b[4],
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.echo.to_be_bytes());
        out.push(self.loss);
    }
}

/// The `msg_type` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MsgType {
    Data = 1,
    Bsyn = 2,
    Back = 3,
    E2eBack = 4,
    Fin = 5,
}

impl MsgType {
    pub fn from_u8(v: u8) -> Result<Self, Error> {
        Ok(match v {
            1 => MsgType::Data,
            2 => MsgType::Bsyn,
            3 => MsgType::Back,
            4 => MsgType::E2eBack,
            5 => MsgType::Fin,
            other => return Err(Error::UnknownMessageType(other)),
        })
    }
}

/// A flow's class (the Bundle Protocol's, RFC 9171 §4.2.3's predecessor in RFC 5050): nodes
/// send the data of flows of a higher class first. Normal is 0, so that a header that
/// names none is normal.
pub const PRIORITY_NORMAL: u8 = 0;
pub const PRIORITY_BULK: u8 = 1;
pub const PRIORITY_EXPEDITED: u8 = 2;

/// The order of a priority value: bulk < normal < expedited.
pub fn priority_rank(priority: u8) -> u8 {
    match priority {
        PRIORITY_BULK => 0,
        PRIORITY_EXPEDITED => 2,
        _ => 1,
    }
}

/// The common header of every Hop message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HopHeader {
    pub flags: u8,
    /// The flow's class ([`PRIORITY_NORMAL`], [`PRIORITY_BULK`], [`PRIORITY_EXPEDITED`]).
    pub priority: u8,
    pub ttl: u8,
    /// End-to-end source (the node that opened the flow).
    pub src: NodeId,
    pub flow_id: u32,
    /// End-to-end destination.
    pub dst: NodeId,
    pub block_num: u32,
}

/// Geometry of a block: its length and the payload size of each packet (the last packet may be
/// shorter). Carried by DATA and BSYN so any node, including one that only overhears, can place
/// packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockGeom {
    pub block_len: u32,
    pub packet_size: u16,
}

impl BlockGeom {
    /// Check the geometry is usable (non-zero packet size when the block has bytes, and at
    /// most [`MAX_PACKETS_PER_BLOCK`] packets).
    pub fn validate(&self) -> Result<(), Error> {
        if self.block_len > 0 && self.packet_size == 0 {
            return Err(Error::Malformed {
                field: "packet_size",
                reason: "zero packet size for a non-empty block",
            });
        }
        if self.packets() > MAX_PACKETS_PER_BLOCK {
            return Err(Error::Malformed {
                field: "block_len",
                reason: "too many packets in block",
            });
        }
        Ok(())
    }

    /// Number of packets (0 for an empty block).
    pub fn packets(&self) -> u32 {
        if self.block_len == 0 || self.packet_size == 0 {
            0
        } else {
            self.block_len.div_ceil(u32::from(self.packet_size))
        }
    }

    /// Byte range of packet `n` within the block, if it exists.
    pub fn packet_range(&self, n: u32) -> Option<std::ops::Range<usize>> {
        if n >= self.packets() {
            return None;
        }
        let start = n as usize * usize::from(self.packet_size);
        let end = (start + usize::from(self.packet_size)).min(self.block_len as usize);
        Some(start..end)
    }
}

/// The type-specific part of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HopBody<'a> {
    /// One packet of a block (Class::Data).
    Data {
        /// Byte offset of the block in the flow's stream (lets an overhearing node cache it).
        offset: u64,
        geom: BlockGeom,
        packet_num: u16,
        payload: &'a [u8],
    },
    /// Block synchronisation: asks the next hop for a BACK. With `FLAG_MICRO` it carries
    /// packet `packet_num` of a micro-block; otherwise `payload` is empty and `packet_num`
    /// marks the end of the round (see the field).
    Bsyn {
        /// Byte offset of the block in the flow's stream.
        offset: u64,
        geom: BlockGeom,
        /// With `FLAG_MICRO`: the packet the BSYN carries. Otherwise the round's end marker:
        /// 1 + the number of the last DATA packet of the block the sender handed to its link
        /// before this BSYN (0: none or unknown). The link's data queue is FIFO, so once
        /// that packet has arrived every other packet of the round has arrived or is lost,
        /// and the receiver answers without waiting for the data to pause.
        packet_num: u16,
        /// Packets of the block the receiver holds once the data the sender has handed to its
        /// link for this block has arrived: those of the last BACK plus those sent since. The
        /// receiver answers at once when it holds that many, and otherwise waits briefly for
        /// data still in flight behind this BSYN. 0: nothing in flight, answer at once.
        expect: u16,
        ctl: ControlSeq,
        payload: &'a [u8],
    },
    /// Bitmap acknowledgement: bit `i` (LSB-first within each byte) set when packet `i` is held.
    Back {
        block_len: u32,
        packets: u16,
        /// DATA packets of the block that arrived from the BACK's addressee although the
        /// receiver already held them, since its previous BACK to it (saturating): evidence
        /// that the sender gave up copies that were only late (as a TCP D-SACK, RFC 2883).
        duplicates: u16,
        /// The largest block, in KiB, the receiver and the nodes beyond it ask the flow's
        /// source to cut while their turns are shared among flows (0: no limit).
        block_hint_kib: u16,
        ctl: ControlSeq,
        bitmap: &'a [u8],
    },
    /// End-to-end acknowledgement of `block_num`; `cum_blocks` blocks (0..cum_blocks) have all
    /// been delivered in order. With `FLAG_FIN` the flow is finished at the destination.
    E2eBack { cum_blocks: u32 },
    /// Teardown of the flow on every node along the path (`FLAG_ABORT` for an aborted flow).
    Fin { total_bytes: u64 },
}

/// A parsed Hop message; payloads are borrowed from the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HopMessage<'a> {
    pub header: HopHeader,
    pub body: HopBody<'a>,
}

fn truncated(needed: usize, have: usize) -> Error {
    Error::Truncated { needed, have }
}

fn be_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

/// Check a packet payload has exactly the size its geometry implies.
fn check_payload(geom: &BlockGeom, packet_num: u16, len: usize) -> Result<(), Error> {
    match geom.packet_range(u32::from(packet_num)) {
        None => Err(Error::Malformed {
            field: "packet_num",
            reason: "packet number beyond the block",
        }),
        Some(r) if r.len() != len => Err(Error::Malformed {
            field: "payload_len",
            reason: "payload size does not match the block geometry",
        }),
        Some(_) => Ok(()),
    }
}

impl HopHeader {
    /// The message type a body encodes as.
    pub fn msg_type(body: &HopBody<'_>) -> MsgType {
        match body {
            HopBody::Data { .. } => MsgType::Data,
            HopBody::Bsyn { .. } => MsgType::Bsyn,
            HopBody::Back { .. } => MsgType::Back,
            HopBody::E2eBack { .. } => MsgType::E2eBack,
            HopBody::Fin { .. } => MsgType::Fin,
        }
    }
}

impl<'a> HopMessage<'a> {
    pub fn msg_type(&self) -> MsgType {
        HopHeader::msg_type(&self.body)
    }

    /// Encoded length in bytes.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN
            + match &self.body {
                HopBody::Data { payload, .. } => DATA_FIXED_LEN + payload.len(),
                HopBody::Bsyn { payload, .. } => BSYN_FIXED_LEN + payload.len(),
                HopBody::Back { bitmap, .. } => BACK_FIXED_LEN + bitmap.len(),
                HopBody::E2eBack { .. } => 4,
                HopBody::Fin { .. } => 8,
            }
    }

    /// Parse a Hop message. Never panics.
    pub fn parse(buf: &'a [u8]) -> Result<Self, Error> {
        if buf.len() < HEADER_LEN {
            return Err(truncated(HEADER_LEN, buf.len()));
        }
        let kind = MsgType::from_u8(buf[0])?;
        let flags = buf[1];
        // Every flag bit has a meaning (on some message type): only the class byte has
        // reserved values.
        if buf[3] > PRIORITY_EXPEDITED {
            return Err(Error::ReservedBits(u32::from(buf[3]) << 8));
        }
        let header = HopHeader {
            priority: buf[3],
            flags,
            ttl: buf[2],
            src: be_u32(buf, 4),
            flow_id: be_u32(buf, 8),
            dst: be_u32(buf, 12),
            block_num: be_u32(buf, 16),
        };
        let rest = &buf[HEADER_LEN..];
        let need = |n: usize| -> Result<(), Error> {
            if rest.len() < n {
                Err(truncated(HEADER_LEN + n, buf.len()))
            } else {
                Ok(())
            }
        };
        let exact = |n: usize| -> Result<(), Error> {
            if rest.len() != n {
                Err(Error::LengthMismatch {
                    declared: HEADER_LEN + n,
                    actual: buf.len(),
                })
            } else {
                Ok(())
            }
        };
        let body = match kind {
            MsgType::Data => {
                need(DATA_FIXED_LEN)?;
                let offset = be_u64(rest, 0);
                let geom = BlockGeom {
                    block_len: be_u32(rest, 8),
                    packet_size: be_u16(rest, 12),
                };
                geom.validate()?;
                let packet_num = be_u16(rest, 14);
                let len = usize::from(be_u16(rest, 16));
                exact(DATA_FIXED_LEN + len)?;
                check_payload(&geom, packet_num, len)?;
                HopBody::Data {
                    offset,
                    geom,
                    packet_num,
                    payload: &rest[DATA_FIXED_LEN..],
                }
            }
            MsgType::Bsyn => {
                need(BSYN_FIXED_LEN)?;
                let offset = be_u64(rest, 0);
                let geom = BlockGeom {
                    block_len: be_u32(rest, 8),
                    packet_size: be_u16(rest, 12),
                };
                geom.validate()?;
                let packet_num = be_u16(rest, 14);
                let len = usize::from(be_u16(rest, 16));
                let expect = be_u16(rest, 18);
                if u32::from(expect) > geom.packets() {
                    return Err(Error::Malformed {
                        field: "expect",
                        reason: "more packets expected than the block has",
                    });
                }
                exact(BSYN_FIXED_LEN + len)?;
                if flags & FLAG_MICRO != 0 {
                    if geom.block_len > 0 {
                        check_payload(&geom, packet_num, len)?;
                    } else if len != 0 || packet_num != 0 {
                        return Err(Error::Malformed {
                            field: "payload_len",
                            reason: "payload on an empty micro-block",
                        });
                    }
                } else if len != 0 {
                    return Err(Error::Malformed {
                        field: "payload_len",
                        reason: "payload on a BSYN without the MICRO flag",
                    });
                } else if u32::from(packet_num) > geom.packets() {
                    return Err(Error::Malformed {
                        field: "packet_num",
                        reason: "round end beyond the block's last packet",
                    });
                }
                HopBody::Bsyn {
                    offset,
                    geom,
                    packet_num,
                    expect,
                    ctl: ControlSeq::read(&rest[20..]),
                    payload: &rest[BSYN_FIXED_LEN..],
                }
            }
            MsgType::Back => {
                need(BACK_FIXED_LEN)?;
                let block_len = be_u32(rest, 0);
                let packets = be_u16(rest, 4);
                let bitmap_len = usize::from(be_u16(rest, 6));
                if bitmap_len != usize::from(packets).div_ceil(8) {
                    return Err(Error::Malformed {
                        field: "bitmap_len",
                        reason: "bitmap length does not match the packet count",
                    });
                }
                let duplicates = be_u16(rest, 8);
                let block_hint_kib = be_u16(rest, 10);
                exact(BACK_FIXED_LEN + bitmap_len)?;
                let bitmap = &rest[BACK_FIXED_LEN..];
                let tail_bits = usize::from(packets) % 8;
                if tail_bits != 0 {
                    if let Some(last) = bitmap.last() {
                        if last >> tail_bits != 0 {
                            return Err(Error::Malformed {
                                field: "bitmap",
                                reason: "bits set beyond the packet count",
                            });
                        }
                    }
                }
                HopBody::Back {
                    block_len,
                    packets,
                    duplicates,
                    block_hint_kib,
                    ctl: ControlSeq::read(&rest[12..]),
                    bitmap,
                }
            }
            MsgType::E2eBack => {
                exact(4)?;
                HopBody::E2eBack {
                    cum_blocks: be_u32(rest, 0),
                }
            }
            MsgType::Fin => {
                exact(8)?;
                HopBody::Fin {
                    total_bytes: be_u64(rest, 0),
                }
            }
        };
        Ok(HopMessage { header, body })
    }

    /// Append the encoded message to `out`. Fails (without writing) for payloads or bitmaps
    /// that do not fit their length fields.
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), Error> {
        let too_long = |field| Error::Malformed {
            field,
            reason: "longer than 65535 bytes",
        };
        match &self.body {
            HopBody::Data { payload, .. } => {
                u16::try_from(payload.len()).map_err(|_| too_long("payload_len"))?;
            }
            HopBody::Bsyn {
                payload,
                geom,
                expect,
                packet_num,
                ..
            } => {
                u16::try_from(payload.len()).map_err(|_| too_long("payload_len"))?;
                if u32::from(*expect) > geom.packets() {
                    return Err(Error::Malformed {
                        field: "expect",
                        reason: "more packets expected than the block has",
                    });
                }
                if self.header.flags & FLAG_MICRO == 0 && u32::from(*packet_num) > geom.packets() {
                    return Err(Error::Malformed {
                        field: "packet_num",
                        reason: "round end beyond the block's last packet",
                    });
                }
            }
            HopBody::Back {
                bitmap, packets, ..
            } => {
                u16::try_from(bitmap.len()).map_err(|_| too_long("bitmap_len"))?;
                if bitmap.len() != usize::from(*packets).div_ceil(8) {
                    return Err(Error::Malformed {
                        field: "bitmap_len",
                        reason: "bitmap length does not match the packet count",
                    });
                }
            }
            _ => {}
        }
        let h = &self.header;
        if h.priority > PRIORITY_EXPEDITED {
            return Err(Error::Malformed {
                field: "priority",
                reason: "not 0 (normal), 1 (bulk) or 2 (expedited)",
            });
        }
        out.reserve(self.encoded_len());
        out.push(self.msg_type() as u8);
        out.push(h.flags);
        out.push(h.ttl);
        out.push(h.priority);
        out.extend_from_slice(&h.src.to_be_bytes());
        out.extend_from_slice(&h.flow_id.to_be_bytes());
        out.extend_from_slice(&h.dst.to_be_bytes());
        out.extend_from_slice(&h.block_num.to_be_bytes());
        match &self.body {
            HopBody::Data {
                offset,
                geom,
                packet_num,
                payload,
            } => {
                out.extend_from_slice(&offset.to_be_bytes());
                out.extend_from_slice(&geom.block_len.to_be_bytes());
                out.extend_from_slice(&geom.packet_size.to_be_bytes());
                out.extend_from_slice(&packet_num.to_be_bytes());
                out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
                out.extend_from_slice(payload);
            }
            HopBody::Bsyn {
                offset,
                geom,
                packet_num,
                expect,
                ctl,
                payload,
            } => {
                out.extend_from_slice(&offset.to_be_bytes());
                out.extend_from_slice(&geom.block_len.to_be_bytes());
                out.extend_from_slice(&geom.packet_size.to_be_bytes());
                out.extend_from_slice(&packet_num.to_be_bytes());
                out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
                out.extend_from_slice(&expect.to_be_bytes());
                ctl.write(out);
                out.extend_from_slice(payload);
            }
            HopBody::Back {
                block_len,
                packets,
                duplicates,
                block_hint_kib,
                ctl,
                bitmap,
            } => {
                out.extend_from_slice(&block_len.to_be_bytes());
                out.extend_from_slice(&packets.to_be_bytes());
                out.extend_from_slice(&(bitmap.len() as u16).to_be_bytes());
                out.extend_from_slice(&duplicates.to_be_bytes());
                out.extend_from_slice(&block_hint_kib.to_be_bytes());
                ctl.write(out);
                out.extend_from_slice(bitmap);
            }
            HopBody::E2eBack { cum_blocks } => out.extend_from_slice(&cum_blocks.to_be_bytes()),
            HopBody::Fin { total_bytes } => out.extend_from_slice(&total_bytes.to_be_bytes()),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
