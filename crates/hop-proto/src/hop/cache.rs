//! In-network caches (§3.2): cache accounting, eviction, and the blocks that must not be
//! evicted.

use super::*;

impl HopTransport {
    pub(super) fn note_cache(&mut self) {
        self.stats.cache_bytes = self.cache_bytes;
        self.stats.cache_bytes_peak = self.stats.cache_bytes_peak.max(self.cache_bytes);
    }

    pub(super) fn note_buffered(&mut self, key: FlowKey) {
        if let Some(f) = self.flows.get(&key) {
            let n = f.held_unmoved() as u64;
            self.stats.buffered_blocks_peak = self.stats.buffered_blocks_peak.max(n);
        }
    }

    /// Evict cached (non-custody, not in progress) blocks until the cache fits its limit.
    pub(super) fn evict(&mut self) {
        while self.cache_bytes > self.cfg.cache_limit_bytes {
            let mut victim: Option<(Instant, FlowKey, u32)> = None;
            for (k, f) in &self.flows {
                for (n, b) in &f.blocks {
                    let protected = self.pinned(*k, f, *n, b);
                    if !protected && !matches!(victim, Some((t, _, _)) if t <= b.last_used) {
                        victim = Some((b.last_used, *k, *n));
                    }
                }
            }
            match victim {
                Some((_, k, n)) => {
                    self.drop_block(k, n);
                    self.extra("cache_evictions");
                }
                None => break,
            }
        }
    }

    /// A block that must not be evicted: in custody (at a source, until acknowledged end to
    /// end), being written to the store, being sent, or being received.
    pub(super) fn pinned(&self, k: FlowKey, f: &Flow, n: u32, b: &Block) -> bool {
        (b.custody && (!b.moved || f.source().is_some()))
            || b.persisting.is_some()
            || f.outs.contains_key(&n)
            || self.withholding.admitted.contains_key(&(k, n))
    }

    /// Whether the bytes that cannot be evicted, plus `add` less `minus`, fit the cache.
    /// Every such byte is a cached one, so a cache with room for `add` needs no count.
    pub(super) fn protected_fit(&self, add: u64, minus: u64) -> bool {
        let limit = self.cfg.cache_limit_bytes;
        (self.cache_bytes + add).saturating_sub(minus) <= limit
            || (self.pinned_bytes(true) + add).saturating_sub(minus) <= limit
    }

    /// Bytes of pinned blocks, plus application bytes waiting at sources if `pending`.
    pub(super) fn pinned_bytes(&self, pending: bool) -> u64 {
        let mut sum = 0u64;
        for (k, f) in &self.flows {
            for (n, b) in &f.blocks {
                if self.pinned(*k, f, *n, b) {
                    sum += u64::from(b.geom.block_len);
                }
            }
            if let Some(s) = f.source().filter(|_| pending) {
                sum += s.pending_bytes as u64;
            }
        }
        sum
    }
}
