//! The source (§4.2): cutting the application's bytes into blocks.

use super::*;

impl HopTransport {
    /// Cut the next block from the application's bytes (never waiting for more, §4.2).
    pub(super) fn form_block(&mut self, ctx: &mut Ctx<'_>, key: FlowKey) {
        let limit = self.cfg.block_bytes();
        let micro_threshold = self.cfg.micro_block_threshold;
        let pkt = self.packet_size;
        let now = ctx.now;
        let Some(f) = self.flows.get(&key) else {
            return;
        };
        if f.finished {
            return;
        }
        let mut in_transfer = f.outs.values().filter(|o| !o.vtx);
        let busy = match (in_transfer.next(), in_transfer.next()) {
            (None, _) => false,
            // The previous block is in its tail: every packet sent once.
            (Some(o), None) if self.cfg.overlap_block_tails => !o.ever_sent.is_full(),
            _ => true,
        };
        if busy {
            return;
        }
        let Some(s) = f.source() else {
            return;
        };
        if s.fin_block.is_some() || (s.pending_bytes == 0 && !s.finish) {
            return;
        }
        let limit = if self.cfg.block_time.is_zero() {
            // The ramp's purpose is a short turn for a flow that has more to come: a flow
            // whose rest fits one block ends in this turn, so it is cut whole.
            let ends_here = s.finish && s.pending_bytes <= limit;
            let shared = f.block_hint.is_some() || !self.cfg.ramp_while_shared;
            let recut = s.next_block == 0 && s.alone_at_start;
            if ends_here || recut || (s.next_block > 0 && !shared) {
                limit
            } else {
                ramped_block_bytes(&self.cfg, limit, s.next_block, pkt)
            }
        } else if s.block_limit > 0 {
            s.block_limit.min(limit)
        } else if self.cfg.initial_block_bytes > 0 {
            self.cfg.initial_block_bytes.min(limit)
        } else {
            limit
        };
        // Blocks sized to shared turns: no larger than the first hop asks for; the first
        // block, cut before any ask can have come, no larger than the smallest ask, so that a
        // flow starting among others gets a short first turn at each hop.
        let limit = match f.block_hint {
            Some(h) if self.cfg.shared_turn_blocks => h.clamp(1, limit.max(1)),
            Some(_) => limit,
            None if self.cfg.shared_turn_blocks && s.next_block == 0 => {
                limit.min(smallest_ask(&self.cfg))
            }
            None => limit,
        };
        // Custody at the source is bounded by the cache: with the cache full of blocks not
        // yet acknowledged end to end, wait for end-to-end BACKs.
        if s.pending_bytes > 0 {
            let next = s.pending_bytes.min(limit) as u64;
            // (Every pinned byte is a byte of a cached block: a cache whose blocks leave
            // room needs no count, which walks every flow.)
            let blocks = self.cache_bytes.saturating_sub(self.app_bytes);
            let full = blocks + next > self.cfg.cache_limit_bytes && {
                let held = self.pinned_bytes(false);
                held > 0 && held + next > self.cfg.cache_limit_bytes
            };
            if full {
                return;
            }
        }
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let dst = f.dst;
        let idle_before = f.blocks.is_empty();
        let Some(s) = f.source_mut() else {
            return;
        };
        if idle_before {
            // New work after an idle period: the give-up clock starts now.
            s.last_progress = now;
        }
        let len = s.pending_bytes.min(limit);
        let (data, data_len) = match s.pending.front_mut() {
            // The block lies in one buffer the application handed over: it keeps a
            // reference to it rather than a copy (hopd hands a file's first block over
            // whole, the simulator's applications a block at a time).
            Some(front) if front.len() >= len => {
                let d = front.split_to(len);
                if front.is_empty() {
                    s.pending.pop_front();
                }
                (BlockData::Shared(d), len)
            }
            _ => {
                let mut data = Vec::with_capacity(len);
                while data.len() < len {
                    let Some(front) = s.pending.front_mut() else {
                        break;
                    };
                    let take = (len - data.len()).min(front.len());
                    data.extend_from_slice(&front.split_to(take));
                    if front.is_empty() {
                        s.pending.pop_front();
                    }
                }
                let n = data.len();
                (BlockData::Whole(data), n)
            }
        };
        s.pending_bytes -= data_len;
        self.app_bytes = self.app_bytes.saturating_sub(data_len as u64);
        let fin = s.finish && s.pending_bytes == 0;
        let num = s.next_block;
        s.next_block = s.next_block.wrapping_add(1);
        let offset = s.next_offset;
        s.next_offset += data_len as u64;
        if fin {
            s.fin_block = Some(num);
        }
        let rto = s.rto;
        let was_blocked = std::mem::take(&mut s.blocked);
        let geom = BlockGeom {
            block_len: data_len as u32,
            packet_size: pkt,
        };
        let mut b = Block::new(offset, geom, fin, now);
        b.data = data;
        b.have.fill();
        b.custody = true;
        b.first_sent = Some(now);
        b.vtx_deadline = Some(now + rto);
        let micro = (geom.block_len as usize) < micro_threshold;
        f.blocks.insert(num, b);
        f.last_activity = now;
        let next_hop = ctx.routing.next_hop(dst).unwrap_or(dst);
        f.outs
            .insert(num, Self::new_transfer(next_hop, geom, false, 0, micro));
        if was_blocked {
            self.events.push_back(Event::Writable { flow: key });
        }
        self.note_buffered(key);
    }
}

impl HopTransport {
    /// With `ramp_while_shared`: the first hop answered the BSYN of flow `key`'s first block,
    /// a small one cut before any answer could say whether the flow shares turns, without
    /// reporting shared turns, and no packet of it has left. A flow alone has no turns to
    /// shorten and would pay a round and a tail for the small block (§3.1), so the block
    /// goes back to the flow's pending bytes and is cut again as large as they allow; the
    /// next BSYN names the new geometry and the next hop starts the block afresh
    /// (receiver.rs). Returns whether it did.
    pub(super) fn recut_first_block_alone(
        &mut self,
        ctx: &mut Ctx<'_>,
        key: FlowKey,
        from: NodeId,
        hint_kib: u16,
    ) -> bool {
        if !self.cfg.ramp_while_shared || self.cfg.initial_block_bytes == 0 || hint_kib > 0 {
            return false;
        }
        let whole = self.cfg.block_bytes();
        let Some(f) = self.flows.get_mut(&key) else {
            return false;
        };
        let untouched = match (f.blocks.get(&0), f.outs.get(&0), f.source()) {
            (Some(b), Some(x), Some(s)) => {
                !x.vtx
                    && x.next_hop == from
                    && x.ever_sent.count() == 0
                    && (b.geom.block_len as usize) < whole
                    && s.pending_bytes > 0
                    && s.next_block == 1
                    && !s.alone_at_start
            }
            _ => false,
        };
        if !untouched {
            return false;
        }
        let (Some(mut b), Role::Source(s)) = (f.blocks.remove(&0), &mut f.role) else {
            return false;
        };
        f.outs.remove(&0);
        let len = b.geom.block_len as usize;
        let data = b.data.share(&b.geom);
        s.pending.push_front(data);
        s.pending_bytes += len;
        s.next_block = 0;
        s.next_offset -= len as u64;
        s.fin_block = None;
        s.alone_at_start = true;
        self.app_bytes += len as u64;
        bump(&mut self.stats.extra, "first_block_recut");
        self.form_block(ctx, key);
        if !self.to_form.contains(&key) {
            self.to_form.push(key);
        }
        true
    }
}

/// With `block_time`: the first hop took a whole block of `len` bytes, cut at `cut`, at
/// `now`. The block's time is counted from its cut or from the previous block's hand-over,
/// whichever came later (with overlapping tails a block is cut while the one before is still
/// being repaired), and the next block is what the flow moved in `block_time` at that rate.
pub(super) fn pace_next_block(
    cfg: &HopConfig,
    s: &mut SourceState,
    len: usize,
    cut: Instant,
    now: Instant,
) {
    if cfg.block_time.is_zero() {
        return;
    }
    let max = cfg.block_bytes();
    let floor = if cfg.initial_block_bytes > 0 {
        cfg.initial_block_bytes.min(max)
    } else {
        (max / 16).max(1)
    };
    let since = s.hop_done_at.map_or(cut, |t| t.max(cut));
    s.hop_done_at = Some(now);
    let took = now.saturating_duration_since(since).as_secs_f64().max(1e-6);
    let at_rate = (len as f64 * cfg.block_time.as_secs_f64() / took).min(max as f64) as usize;
    s.block_limit = at_rate.clamp(floor, max);
}

/// The largest block a source cuts as its flow's block `num`: with `initial_block_bytes`, a
/// flow's first block holds at most that much and each next one twice the one before, up to
/// `limit` (the block size); with `opening_block_packets` the first holds that many packets
/// of `pkt` bytes and the doubling starts from `initial_block_bytes` at the second, so that a
/// first block under the micro-block threshold (§3.6) passes every turn while the rest ramps
/// as before. Not in the paper, whose blocks are as large as the data ready (§4.2): with many
/// flows sharing a path a whole first block takes minutes to arrive, and every relay's turn
/// (§3.5) lasts one block.
fn ramped_block_bytes(cfg: &HopConfig, limit: usize, num: u32, pkt: u16) -> usize {
    if cfg.initial_block_bytes == 0 {
        return limit;
    }
    if cfg.opening_block_packets > 0 {
        if num == 0 {
            return cfg
                .opening_block_packets
                .saturating_mul(usize::from(pkt).max(1))
                .min(limit);
        }
        return cfg
            .initial_block_bytes
            .saturating_mul(1usize << (num - 1).min(24))
            .min(limit);
    }
    cfg.initial_block_bytes
        .saturating_mul(1usize << num.min(24))
        .min(limit)
}
