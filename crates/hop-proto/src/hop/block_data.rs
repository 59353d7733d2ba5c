//! A block's bytes as a node holds them (§3.2's caches).
//!
//! A runtime that reads each datagram into a buffer of its own (hopd) hands the core a slice
//! that is gone after the call: its packets are copied into one buffer per block, which is
//! delivered or written out whole. A runtime whose datagrams are shared, reference-counted
//! buffers (the simulator: one buffer per frame, seen by every neighbour in range) hands the
//! core the buffer itself ([`crate::Node::handle_shared_datagram`]), and a block keeps a
//! reference to each packet's bytes instead of a copy: a frame overheard by ten neighbours
//! is held once, not ten times. The cache's accounting is the same either way (a block
//! counts its whole length from its first packet, `cache_bytes`), so the per-node cap
//! behaves as before.

use bytes::Bytes;

use super::BlockGeom;

#[derive(Debug, Default)]
pub(super) enum BlockData {
    /// Nothing stored yet (a block known from its BSYN alone): no memory.
    #[default]
    Empty,
    /// One buffer: a source's block, a restored one, or packets copied in as they came. A
    /// buffer being filled is only as long as the furthest packet stored so far (bytes
    /// before it that were not received read as zeros); [`BlockData::whole`] brings it to
    /// the block's length.
    Whole(Vec<u8>),
    /// Each packet held as a slice of the shared datagram it arrived in.
    Packets(Vec<Option<Bytes>>),
    /// The whole block in one shared buffer: a source's block cut from the application's
    /// buffer without a copy, or a block turned into one to be kept elsewhere too (the
    /// custody store) without a copy.
    Shared(Bytes),
}

impl BlockData {
    /// Store packet `n` at `range` of the block (its length already checked against the
    /// geometry). With `shared`, the buffer `payload` lies in, keep a reference to it.
    pub(super) fn store(
        &mut self,
        geom: &BlockGeom,
        n: u32,
        range: std::ops::Range<usize>,
        payload: &[u8],
        shared: Option<&Bytes>,
    ) {
        let shared = shared.filter(|d| contains(d, payload));
        if let BlockData::Shared(b) = self {
            // Its bytes are read-only: a packet written into it goes into a copy.
            *self = BlockData::Whole(b.to_vec());
        }
        if matches!(self, BlockData::Empty) {
            *self = match shared {
                Some(_) => BlockData::Packets(vec![None; geom.packets() as usize]),
                None => BlockData::Whole(Vec::with_capacity(geom.block_len as usize)),
            };
        }
        match self {
            // Packets mostly come in order: each one extends the buffer, and only a gap
            // left by a lost packet is filled with zeros, so a received block's bytes are
            // written once rather than zeroed first (a relay's CPU per packet).
            BlockData::Whole(v) => {
                if v.len() < range.end {
                    v.resize(range.start.max(v.len()), 0);
                    let overlap = v.len() - range.start;
                    v[range.start..].copy_from_slice(&payload[..overlap]);
                    v.extend_from_slice(&payload[overlap..]);
                } else {
                    v[range].copy_from_slice(payload)
                }
            }
            BlockData::Packets(p) => {
                let bytes = match shared {
                    Some(d) => d.slice_ref(payload),
                    None => Bytes::copy_from_slice(payload),
                };
                if let Some(slot) = p.get_mut(n as usize) {
                    *slot = Some(bytes);
                }
            }
            BlockData::Empty | BlockData::Shared(_) => {}
        }
    }

    /// The bytes of packet `n` at `range` (empty if not held).
    pub(super) fn packet(&self, n: u32, range: std::ops::Range<usize>) -> &[u8] {
        match self {
            BlockData::Whole(v) => v.get(range).unwrap_or(&[]),
            BlockData::Packets(p) => p.get(n as usize).and_then(|b| b.as_deref()).unwrap_or(&[]),
            BlockData::Shared(b) => b.get(range).unwrap_or(&[]),
            BlockData::Empty => &[],
        }
    }

    /// The whole block in one buffer (for delivery and the store, which take complete
    /// blocks). Packets held as shared slices are copied together once, here; a packet not
    /// held reads as zeros and can still be stored later.
    pub(super) fn whole(&mut self, geom: &BlockGeom) -> &[u8] {
        match self {
            BlockData::Packets(p) => {
                let mut v = vec![0; geom.block_len as usize];
                for (n, b) in p.iter().enumerate() {
                    if let (Some(b), Some(r)) = (b, geom.packet_range(n as u32)) {
                        if r.len() == b.len() {
                            v[r].copy_from_slice(b);
                        }
                    }
                }
                *self = BlockData::Whole(v);
            }
            BlockData::Empty => *self = BlockData::Whole(vec![0; geom.block_len as usize]),
            BlockData::Whole(v) => v.resize((geom.block_len as usize).max(v.len()), 0),
            BlockData::Shared(_) => {}
        }
        match self {
            BlockData::Whole(v) => v,
            BlockData::Shared(b) => b,
            _ => &[],
        }
    }

    /// The whole block as a shared buffer, which this block then keeps too (no copy).
    pub(super) fn share(&mut self, geom: &BlockGeom) -> Bytes {
        self.whole(geom);
        if let BlockData::Whole(v) = self {
            *self = BlockData::Shared(Bytes::from(std::mem::take(v)));
        }
        match self {
            BlockData::Shared(b) => b.clone(),
            _ => Bytes::new(),
        }
    }
}

/// True if `part` lies inside `buf`'s bytes (so that `buf.slice_ref(part)` is valid).
fn contains(buf: &Bytes, part: &[u8]) -> bool {
    let (start, end) = (buf.as_ptr() as usize, buf.as_ptr() as usize + buf.len());
    let (p, q) = (part.as_ptr() as usize, part.as_ptr() as usize + part.len());
    !part.is_empty() && start <= p && q <= end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom() -> BlockGeom {
        BlockGeom {
            block_len: 10,
            packet_size: 4,
        }
    }

    #[test]
    fn shared_packets_are_references_and_join_in_order() {
        let g = geom();
        let frame = Bytes::from_static(b"hdr-abcd-efgh-ij");
        let mut d = BlockData::default();
        // Packets 2, 0, 1 (lengths 2, 4, 4) as slices of frame-like buffers.
        let p2 = &frame[14..16];
        d.store(&g, 2, 8..10, p2, Some(&frame));
        assert!(matches!(d, BlockData::Packets(_)));
        let f0 = Bytes::from_static(b"xxabcd");
        d.store(&g, 0, 0..4, &f0[2..6], Some(&f0));
        let f1 = Bytes::from_static(b"efgh");
        d.store(&g, 1, 4..8, &f1[..], Some(&f1));
        assert_eq!(d.packet(0, 0..4), b"abcd");
        assert_eq!(d.packet(2, 8..10), b"ij");
        // The stored slice points into the frame's buffer: no copy was made.
        if let BlockData::Packets(p) = &d {
            assert_eq!(p[2].as_ref().unwrap().as_ptr(), p2.as_ptr());
        }
        assert_eq!(d.whole(&g), b"abcdefghij");
        assert_eq!(&d.share(&g)[..], b"abcdefghij");
    }

    #[test]
    fn a_slice_outside_the_shared_buffer_is_copied() {
        let g = geom();
        let other = Bytes::from_static(b"zzzz");
        let mut d = BlockData::default();
        d.store(&g, 0, 0..4, b"abcd", Some(&other));
        assert!(matches!(d, BlockData::Whole(_)));
        assert_eq!(d.packet(0, 0..4), b"abcd");
    }

    #[test]
    fn copied_packets_fill_one_buffer() {
        let g = geom();
        let mut d = BlockData::default();
        assert_eq!(d.packet(0, 0..4), b"");
        d.store(&g, 1, 4..8, b"efgh", None);
        d.store(&g, 0, 0..4, b"abcd", None);
        d.store(&g, 2, 8..10, b"ij", None);
        assert_eq!(d.whole(&g), b"abcdefghij");
    }

    #[test]
    fn a_copied_block_grows_with_its_packets_and_a_gap_reads_as_zeros() {
        let g = geom();
        let mut d = BlockData::default();
        d.store(&g, 2, 8..10, b"ij", None);
        // Packets 0 and 1 are not held: nothing to read for them yet.
        assert_eq!(d.packet(2, 8..10), b"ij");
        assert_eq!(d.packet(0, 0..4), b"\0\0\0\0");
        d.store(&g, 0, 0..4, b"abcd", None);
        assert_eq!(d.whole(&g), b"abcd\0\0\0\0ij");
        d.store(&g, 1, 4..8, b"efgh", None);
        assert_eq!(d.whole(&g), b"abcdefghij");
        // Only the first packet held: the whole block still has the block's length.
        let mut e = BlockData::default();
        e.store(&g, 0, 0..4, b"abcd", None);
        assert_eq!(e.packet(1, 4..8), b"");
        assert_eq!(e.whole(&g), b"abcd\0\0\0\0\0\0");
    }

    #[test]
    fn a_block_joined_before_it_is_complete_keeps_its_geometry() {
        let g = geom();
        let f = Bytes::from_static(b"abcdij");
        let mut d = BlockData::default();
        d.store(&g, 0, 0..4, &f[..4], Some(&f));
        d.store(&g, 2, 8..10, &f[4..], Some(&f));
        assert_eq!(d.whole(&g), b"abcd\0\0\0\0ij");
        d.store(&g, 1, 4..8, b"efgh", None);
        assert_eq!(d.whole(&g), b"abcdefghij");
        assert_eq!(BlockData::Empty.whole(&g).len(), 10);
    }

    #[test]
    fn a_shared_block_is_read_and_handed_on_without_a_copy() {
        let g = geom();
        let buf = Bytes::from_static(b"abcdefghij");
        let mut d = BlockData::Shared(buf.clone());
        assert_eq!(d.packet(1, 4..8), b"efgh");
        assert_eq!(d.whole(&g).as_ptr(), buf.as_ptr());
        assert_eq!(d.share(&g).as_ptr(), buf.as_ptr());
        // A packet written into it goes into a copy; the shared buffer is left as it was.
        d.store(&g, 0, 0..4, b"ABCD", None);
        assert_eq!(d.whole(&g), b"ABCDefghij");
        assert_eq!(&buf[..], b"abcdefghij");
    }

    #[test]
    fn a_joined_block_becomes_shared_when_handed_on() {
        let g = geom();
        let mut d = BlockData::default();
        d.store(&g, 0, 0..4, b"abcd", None);
        d.store(&g, 1, 4..8, b"efgh", None);
        d.store(&g, 2, 8..10, b"ij", None);
        let kept = d.share(&g);
        assert_eq!(&kept[..], b"abcdefghij");
        assert_eq!(d.whole(&g).as_ptr(), kept.as_ptr());
        assert_eq!(d.share(&g).as_ptr(), kept.as_ptr());
    }
}
