//! Virtual retransmission (§3.2) and the end-to-end BACK: a source that hears no end-to-end
//! BACK in time sends the block again, served from the caches along the path.

use super::*;

impl HopTransport {
    /// Source: virtual retransmission of blocks not acknowledged end to end in time (§3.2).
    pub(super) fn source_vtx(&mut self, ctx: &mut Ctx<'_>, key: FlowKey) {
        if !self.cfg.virtual_retransmission {
            return;
        }
        let now = ctx.now;
        let ttl = self.cfg.vtx_ttl;
        let vmax = self.cfg.vtx_initial_timeout;
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let rto = f.source().map(|s| s.rto).unwrap_or(vmax);
        let dst = f.dst;
        let mut started = 0;
        for (n, b) in f.blocks.iter_mut() {
            let Some(dl) = b.vtx_deadline else { continue };
            if dl > now {
                continue;
            }
            if f.outs.contains_key(n) {
                // Still moving to the first hop: not a loss; look again later.
                b.vtx_deadline = Some(now + rto);
                continue;
            }
            b.vtx_count += 1;
            b.vtx_deadline = Some(now + backoff(rto, vmax.max(rto), b.vtx_count));
            let next_hop = ctx.routing.next_hop(dst).unwrap_or(dst);
            let micro = (b.geom.block_len as usize) < self.cfg.micro_block_threshold;
            f.outs
                .insert(*n, Self::new_transfer(next_hop, b.geom, true, ttl, micro));
            started += 1;
        }
        for _ in 0..started {
            self.extra("vtx_sent");
        }
    }

    pub(super) fn send_e2e(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, n: u32) {
        let Some(f) = self.flows.get(&key) else {
            return;
        };
        let Some(d) = f.dest() else { return };
        // The block named is one the store has durably: nodes on the way drop the block
        // named as well as those below `cum_blocks`.
        let durable = d.durable();
        let n = if !d.writing.is_empty() && n >= durable {
            let Some(last) = durable.checked_sub(1) else {
                return;
            };
            last
        } else {
            n
        };
        let flags = if d.finished_durably() { FLAG_FIN } else { 0 };
        let msg = HopMessage {
            header: Self::header(key, f.dst, n, flags, 0),
            body: HopBody::E2eBack {
                cum_blocks: d.durable(),
            },
        };
        if let Some(nh) = ctx.routing.next_hop(key.src) {
            self.push_ctrl(nh, &msg);
        }
    }

    pub(super) fn on_e2e(&mut self, ctx: &mut Ctx<'_>, h: &HopHeader, cum: u32) {
        let now = ctx.now;
        let key = flow_key(h);
        let fin = h.flags & FLAG_FIN != 0;
        let n = h.block_num;
        if h.flags & FLAG_WAIT != 0 {
            // A full destination's notice: for the source's application; it acknowledges
            // nothing, so no node drops a block for it.
            if key.src == ctx.local {
                if self.flows.get(&key).is_some_and(|f| f.source().is_some()) {
                    self.events.push_back(Event::DestinationFull { flow: key });
                }
            } else {
                self.forward_e2e(ctx, h, cum);
            }
            return;
        }
        let Some(f) = self.flows.get_mut(&key) else {
            // Still pass it on toward the source.
            if key.src != ctx.local {
                self.forward_e2e(ctx, h, cum);
            }
            return;
        };
        if fin && h.flags & FLAG_COPY != 0 && f.e2e_fin {
            // A copy of the end-to-end BACK this relay already passed on (control_copies.rs).
            return;
        }
        f.last_activity = now;
        // Round-trip time of the block (§3.2: the most recent block RTT is the timeout).
        if let Role::Source(s) = &mut f.role {
            s.last_progress = now;
            if let Some(b) = f.blocks.get(&n) {
                if b.vtx_count == 0 {
                    if let Some(t0) = b.first_sent {
                        s.rto = (now - t0).max(self.cfg.bsyn_timeout);
                    }
                }
            }
        }
        // The delivered prefix, for the application's progress: the end of the last block
        // below `cum` still held (blocks below an earlier `cum` were dropped then).
        let prefix = f
            .blocks
            .range(..cum)
            .next_back()
            .map(|(_, b)| b.offset + u64::from(b.geom.block_len));
        if let (Some(bytes), true) = (prefix, f.source().is_some()) {
            self.events
                .push_back(Event::Acknowledged { flow: key, bytes });
        }
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let acked: Vec<u32> = f
            .blocks
            .keys()
            .copied()
            .filter(|b| *b < cum || *b == n)
            .collect();
        for b in acked {
            self.drop_block(key, b);
        }
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        if let Role::Source(s) = &mut f.role {
            let done = s.fin_block.is_some_and(|fb| cum > fb) && f.blocks.is_empty();
            if fin && done {
                let bytes = s.next_offset;
                let dst = f.dst;
                self.events
                    .push_back(Event::SendComplete { flow: key, bytes });
                let msg = HopMessage {
                    header: Self::header(key, dst, n, 0, 0),
                    body: HopBody::Fin { total_bytes: bytes },
                };
                if let Some(nh) = ctx.routing.next_hop(dst) {
                    self.push_ctrl(nh, &msg);
                }
                self.remove_flow(key, ctx.now);
                self.stats.flows = self.flows.len() as u64;
            } else {
                self.pump_flow(ctx, key);
            }
        } else {
            if fin && !f.e2e_fin {
                f.finished = true;
                f.e2e_fin = true;
                f.fin_probe = None;
                self.finished_flows.push_back(key);
            }
            f.e2e_cum = f.e2e_cum.max(cum);
            // Passed on as this relay's own, copied where its next hop loses control.
            let mut own = *h;
            own.flags &= !FLAG_COPY;
            self.forward_e2e(ctx, &own, cum);
            self.service_waiting(ctx);
            self.pump_flow(ctx, key);
        }
    }

    pub(super) fn forward_e2e(&mut self, ctx: &mut Ctx<'_>, h: &HopHeader, cum: u32) {
        if let Some(nh) = ctx.routing.next_hop(h.src) {
            let msg = HopMessage {
                header: *h,
                body: HopBody::E2eBack { cum_blocks: cum },
            };
            self.push_ctrl(nh, &msg);
        }
    }
}
