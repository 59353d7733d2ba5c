//! The destination: in-order delivery of complete blocks to the application's store.

use super::*;

impl HopTransport {
    /// A block became complete on this node.
    pub(super) fn block_completed(
        &mut self,
        ctx: &mut Ctx<'_>,
        key: FlowKey,
        n: u32,
        from: NodeId,
    ) {
        if self.withholding.admitted.remove(&(key, n)).is_some() {
            self.withholding.last_holder = Some(from);
        }
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        f.deferred.remove(&n);
        if f.dest().is_some() {
            if let Some(b) = f.blocks.get_mut(&n) {
                b.custody = true;
            }
            self.deliver(ctx, key);
        }
    }

    /// Destination: tell the source that block `n` waits for room in the application's
    /// store (an end-to-end BACK with the wait flag, which acknowledges nothing): without it
    /// the source sees a flow that stopped and cannot tell a full disk from a broken path.
    /// Once per stall; relays pass it on and keep their custody.
    fn send_full_notice(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, n: u32) {
        let Some(f) = self.flows.get(&key) else {
            return;
        };
        let Some(d) = f.dest() else { return };
        let msg = HopMessage {
            header: Self::header(key, f.dst, n, FLAG_WAIT, 0),
            body: HopBody::E2eBack {
                cum_blocks: d.next_deliver,
            },
        };
        if let Some(nh) = ctx.routing.next_hop(key.src) {
            self.push_ctrl(nh, &msg);
            self.extra("full_notice_sent");
        }
    }

    /// Destination: deliver complete blocks in order and acknowledge them end to end.
    pub(super) fn deliver(&mut self, ctx: &mut Ctx<'_>, key: FlowKey) {
        loop {
            let Some(f) = self.flows.get_mut(&key) else {
                return;
            };
            let Role::Destination(d) = &mut f.role else {
                return;
            };
            let n = d.next_deliver;
            let ready = f.blocks.get(&n).is_some_and(|b| b.complete());
            if !ready {
                return;
            }
            if let Some(b) = f.blocks.get_mut(&n) {
                let delivery = Delivery {
                    flow: key,
                    block_num: n,
                    offset: d.delivered,
                    fin: b.fin,
                    data: b.data.whole(&b.geom),
                };
                if self.store.deliver(&delivery).is_err() {
                    if !d.blocked {
                        d.blocked = true;
                        bump(&mut self.stats.extra, "delivery_withheld");
                        self.send_full_notice(ctx, key, n);
                    }
                    return;
                }
                d.blocked = false;
            }
            let Some(b) = f.blocks.remove(&n) else {
                return;
            };
            self.cache_bytes = self.cache_bytes.saturating_sub(u64::from(b.geom.block_len));
            d.next_deliver = n.wrapping_add(1);
            let len = u64::from(b.geom.block_len);
            if len > 0 {
                self.events.push_back(Event::Delivered {
                    flow: key,
                    offset: d.delivered,
                    data: b.data.into_bytes(&b.geom),
                });
            }
            d.delivered += len;
            if b.fin {
                d.finished = true;
                let bytes = d.delivered;
                f.finished = true;
                self.events
                    .push_back(Event::FlowFinished { flow: key, bytes });
            }
            f.outs.remove(&n);
            self.note_cache();
            self.send_e2e(ctx, key, n);
        }
    }
}
