//! The source side of a packet-sequenced flow, shared by the packet transports (HxH, ATP):
//! application bytes cut into packets numbered from 0, kept until acknowledged end to end.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};

#[derive(Debug)]
pub(crate) struct SendBuffer {
    payload: usize,
    limit: usize,
    unacked: BTreeMap<u32, Bytes>,
    partial: BytesMut,
    /// Next sequence number to assign.
    next_seq: u32,
    /// Next sequence number never transmitted.
    next_new: u32,
    /// Every packet below `acked` was acknowledged.
    acked: u32,
    bytes: usize,
    finished: bool,
    fin_seq: Option<u32>,
    /// Bytes accepted from the application.
    total: u64,
}

impl SendBuffer {
    pub fn new(payload: usize, limit: usize) -> Self {
        SendBuffer {
            payload: payload.max(1),
            limit: limit.max(1),
            unacked: BTreeMap::new(),
            partial: BytesMut::new(),
            next_seq: 0,
            next_new: 0,
            acked: 0,
            bytes: 0,
            finished: false,
            fin_seq: None,
            total: 0,
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn acked(&self) -> u32 {
        self.acked
    }

    pub fn finished(&self) -> bool {
        self.finished
    }

    #[cfg(test)]
    pub fn fin_seq(&self) -> Option<u32> {
        self.fin_seq
    }

    /// A new limit on the bytes held (bytes already held above it stay until acknowledged).
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit.max(1);
    }

    pub fn has_room(&self) -> bool {
        self.bytes < self.limit
    }

    /// Take as many bytes as fit; returns how many.
    pub fn accept(&mut self, data: &[u8]) -> usize {
        if self.finished {
            return 0;
        }
        let n = data.len().min(self.limit.saturating_sub(self.bytes));
        let mut rest = &data[..n];
        while !rest.is_empty() {
            let take = (self.payload - self.partial.len()).min(rest.len());
            self.partial.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.partial.len() == self.payload {
                self.packetize();
            }
        }
        self.bytes += n;
        self.total += n as u64;
        n
    }

    fn packetize(&mut self) {
        let p = self.partial.split().freeze();
        self.unacked.insert(self.next_seq, p);
        self.next_seq += 1;
    }

    /// No more bytes follow: decide which packet carries FIN.
    pub fn finish(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        if !self.partial.is_empty() || self.next_new >= self.next_seq {
            // Flush the tail, or add an empty FIN packet when everything was already sent.
            self.packetize();
        }
        self.fin_seq = Some(self.next_seq - 1);
    }

    /// Whether a never-sent packet is available (flushing a partial packet when idle).
    pub fn has_new(&mut self) -> bool {
        if self.next_new >= self.next_seq && !self.partial.is_empty() {
            self.packetize();
        }
        self.next_new < self.next_seq
    }

    /// Like [`Self::has_new`] without flushing the partial packet.
    pub fn has_pending_new(&self) -> bool {
        self.next_new < self.next_seq || !self.partial.is_empty()
    }

    /// The next never-sent packet: (seq, payload, is_fin).
    pub fn take_new(&mut self) -> Option<(u32, Bytes, bool)> {
        if !self.has_new() {
            return None;
        }
        let seq = self.next_new;
        self.next_new += 1;
        let data = self.unacked.get(&seq).cloned().unwrap_or_default();
        Some((seq, data, self.fin_seq == Some(seq)))
    }

    /// A packet for retransmission, if still unacknowledged and already sent once.
    pub fn get(&self, seq: u32) -> Option<(Bytes, bool)> {
        if seq >= self.next_new {
            return None;
        }
        self.unacked
            .get(&seq)
            .map(|d| (d.clone(), self.fin_seq == Some(seq)))
    }

    /// Sequence numbers sent at least once and not acknowledged.
    pub fn unacked_sent(&self) -> impl Iterator<Item = u32> + '_ {
        self.unacked.range(..self.next_new).map(|(s, _)| *s)
    }

    pub fn next_new(&self) -> u32 {
        self.next_new
    }

    /// Cumulative acknowledgement; returns true when it advanced.
    pub fn ack(&mut self, cum: u32) -> bool {
        let cum = cum.min(self.next_new);
        if cum <= self.acked {
            return false;
        }
        let keep = self.unacked.split_off(&cum);
        for d in self.unacked.values() {
            self.bytes -= d.len();
        }
        self.unacked = keep;
        self.acked = cum;
        true
    }

    /// Selective acknowledgement of one packet above the cumulative point.
    pub fn sack(&mut self, seq: u32) {
        if seq < self.next_new {
            if let Some(d) = self.unacked.remove(&seq) {
                self.bytes -= d.len();
            }
        }
    }

    /// Finished and every packet acknowledged.
    pub fn complete(&self) -> bool {
        self.fin_seq.is_some_and(|f| self.acked > f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packetizes_and_finishes() {
        let mut b = SendBuffer::new(4, 100);
        assert_eq!(b.accept(b"abcdefghij"), 10);
        assert_eq!(b.take_new().unwrap().0, 0);
        assert_eq!(b.take_new().unwrap().0, 1);
        // The partial tail is flushed when nothing else is waiting.
        let (s, d, fin) = b.take_new().unwrap();
        assert_eq!((s, &d[..], fin), (2, &b"ij"[..], false));
        b.finish();
        // Everything was sent: an empty FIN packet closes the flow.
        let (s, d, fin) = b.take_new().unwrap();
        assert_eq!((s, d.len(), fin), (3, 0, true));
        assert!(!b.complete());
        b.ack(4);
        assert!(b.complete());
        assert_eq!(b.bytes(), 0);
    }

    #[test]
    fn respects_limit() {
        let mut b = SendBuffer::new(4, 6);
        assert_eq!(b.accept(b"abcdefghij"), 6);
        assert!(!b.has_room());
        b.finish();
        assert_eq!(b.fin_seq(), Some(1));
    }
}
