//! In-order reassembly of a packet-sequenced flow at its destination, shared by the packet
//! transports (HxH, ATP). Packets are numbered from 0; the packet carrying the FIN flag is
//! the last one. Delivery is in order and exactly once.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

use crate::{Event, FlowKey};

/// Packets accepted ahead of the cumulative point; anything further is refused, so a
/// misbehaving sender cannot make a destination hold unbounded data.
pub(crate) const MAX_AHEAD: u32 = 1 << 16;

#[derive(Debug, Default)]
pub(crate) struct Reassembly {
    /// Every packet below `next` has been delivered.
    next: u32,
    pending: BTreeMap<u32, Bytes>,
    pending_bytes: u64,
    delivered_bytes: u64,
    fin_seq: Option<u32>,
}

impl Reassembly {
    /// Cumulative ACK: the first packet not yet received in order.
    pub fn cum(&self) -> u32 {
        self.next
    }

    pub fn delivered_bytes(&self) -> u64 {
        self.delivered_bytes
    }

    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    pub fn pending_packets(&self) -> usize {
        self.pending.len()
    }

    /// True once the FIN packet and everything before it were delivered.
    pub fn complete(&self) -> bool {
        self.fin_seq.is_some_and(|f| self.next > f)
    }

    /// Whether `seq` was already received (delivered or held).
    pub fn has(&self, seq: u32) -> bool {
        seq < self.next || self.pending.contains_key(&seq)
    }

    /// Store a packet; returns false for a duplicate. In-order data is moved to `events`.
    /// A FIN at a sequence below data already seen is ignored as inconsistent.
    pub fn insert(
        &mut self,
        flow: FlowKey,
        seq: u32,
        data: Bytes,
        fin: bool,
        events: &mut VecDeque<Event>,
    ) -> bool {
        if self.has(seq) || self.fin_seq.is_some_and(|f| seq > f) || seq - self.next >= MAX_AHEAD {
            return false;
        }
        if fin {
            let highest = self.pending.keys().next_back().copied();
            if highest.is_some_and(|h| h > seq) {
                return false;
            }
            self.fin_seq = Some(seq);
        }
        self.pending_bytes += data.len() as u64;
        self.pending.insert(seq, data);
        while let Some(d) = self.pending.remove(&self.next) {
            self.pending_bytes -= d.len() as u64;
            if !d.is_empty() {
                events.push_back(Event::Delivered {
                    flow,
                    offset: self.delivered_bytes,
                    data: d.clone(),
                });
            }
            self.delivered_bytes += d.len() as u64;
            self.next = self.next.wrapping_add(1);
        }
        true
    }

    /// Highest sequence number received, if any beyond the cumulative point.
    pub fn highest(&self) -> Option<u32> {
        self.pending.keys().next_back().copied()
    }

    /// Runs `[start, end)` missing between the cumulative point and the highest packet held.
    pub fn missing(&self, limit: usize) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        let mut expect = self.next;
        for &s in self.pending.keys() {
            if out.len() >= limit {
                break;
            }
            if s > expect {
                out.push((expect, s));
            }
            expect = s + 1;
        }
        out
    }

    /// Runs `[start, end)` held above the cumulative point (SACK blocks), lowest first.
    pub fn received_runs(&self, limit: usize) -> Vec<(u32, u32)> {
        let mut out: Vec<(u32, u32)> = Vec::new();
        for &s in self.pending.keys() {
            match out.last_mut() {
                Some(last) if last.1 == s => last.1 = s + 1,
                _ => {
                    if out.len() >= limit {
                        break;
                    }
                    out.push((s, s + 1));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: FlowKey = FlowKey { src: 1, id: 1 };

    #[test]
    fn delivers_in_order_once_and_reports_gaps() {
        let mut r = Reassembly::default();
        let mut ev = VecDeque::new();
        assert!(r.insert(F, 1, Bytes::from_static(b"bb"), false, &mut ev));
        assert!(r.insert(F, 3, Bytes::from_static(b"d"), true, &mut ev));
        assert!(ev.is_empty());
        assert_eq!(r.missing(10), vec![(0, 1), (2, 3)]);
        assert_eq!(r.received_runs(10), vec![(1, 2), (3, 4)]);
        assert!(r.insert(F, 0, Bytes::from_static(b"a"), false, &mut ev));
        assert!(!r.insert(F, 0, Bytes::from_static(b"a"), false, &mut ev));
        assert_eq!(r.cum(), 2);
        assert!(r.insert(F, 2, Bytes::from_static(b"c"), false, &mut ev));
        assert!(r.complete());
        let offsets: Vec<u64> = ev
            .iter()
            .map(|e| match e {
                Event::Delivered { offset, .. } => *offset,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(offsets, vec![0, 1, 3, 4]);
        assert_eq!(r.delivered_bytes(), 5);
    }

    #[test]
    fn far_ahead_is_refused() {
        let mut r = Reassembly::default();
        let mut ev = VecDeque::new();
        assert!(!r.insert(F, MAX_AHEAD, Bytes::new(), false, &mut ev));
        assert!(r.insert(F, MAX_AHEAD - 1, Bytes::new(), false, &mut ev));
    }

    #[test]
    fn data_beyond_fin_is_refused() {
        let mut r = Reassembly::default();
        let mut ev = VecDeque::new();
        assert!(r.insert(F, 2, Bytes::new(), true, &mut ev));
        assert!(!r.insert(F, 5, Bytes::from_static(b"x"), false, &mut ev));
    }
}
