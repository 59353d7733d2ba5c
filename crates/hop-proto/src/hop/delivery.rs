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
                cum_blocks: d.durable(),
            },
        };
        if let Some(nh) = ctx.routing.next_hop(key.src) {
            self.push_ctrl(nh, &msg);
            self.extra("full_notice_sent");
        }
    }

    /// Destination: deliver complete blocks in order and acknowledge them end to end once
    /// the store has them durably (at once, or when it reports a deferred write).
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
            let Some(b) = f.blocks.get_mut(&n) else {
                return;
            };
            let delivery = Delivery {
                flow: key,
                block_num: n,
                offset: d.delivered,
                fin: b.fin,
                data: b.data.share(&b.geom),
            };
            let later = match self.store.deliver(&delivery) {
                Ok(p) => p == Persist::Later,
                Err(StoreFull) => {
                    if !d.blocked {
                        d.blocked = true;
                        bump(&mut self.stats.extra, "delivery_withheld");
                        self.send_full_notice(ctx, key, n);
                    }
                    return;
                }
            };
            d.blocked = false;
            let Some(b) = f.blocks.remove(&n) else {
                return;
            };
            let queued = later || !d.writing.is_empty();
            if !queued {
                // A block still being written (or behind one) stays counted against the cache
                // until it is durable: a disk that falls behind holds the flow back.
                self.cache_bytes = self.cache_bytes.saturating_sub(u64::from(b.geom.block_len));
            }
            d.next_deliver = n.wrapping_add(1);
            let offset = d.delivered;
            d.delivered += u64::from(b.geom.block_len);
            if b.fin {
                d.finished = true;
                f.finished = true;
                self.finished_flows.push_back(key);
            }
            f.outs.remove(&n);
            if queued {
                // The application gets it once it and the blocks before it are durable.
                d.writing.insert(
                    n,
                    Writing {
                        offset,
                        data: delivery.data,
                        durable: !later,
                    },
                );
                self.note_cache();
                continue;
            }
            let (finished, bytes) = (d.finished_durably(), d.delivered);
            if !delivery.data.is_empty() {
                self.events.push_back(Event::Delivered {
                    flow: key,
                    offset,
                    data: delivery.data,
                });
            }
            if finished {
                self.events
                    .push_back(Event::FlowFinished { flow: key, bytes });
            }
            self.note_cache();
            self.send_e2e(ctx, key, n);
        }
    }

    /// The store finished writing delivered block `n` ([`Persist::Later`]): the blocks
    /// durable in order go to the application, the end-to-end BACK covers them, and the
    /// flow ends once its last block is durable. A failed write (`ok` false; the store
    /// retries it) is a full destination to the source, told once per stall.
    pub(super) fn on_delivery_persisted(
        &mut self,
        ctx: &mut Ctx<'_>,
        key: FlowKey,
        n: u32,
        ok: bool,
    ) {
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let Role::Destination(d) = &mut f.role else {
            return;
        };
        if !ok {
            if d.writing.contains_key(&n) && !d.write_failing {
                d.write_failing = true;
                bump(&mut self.stats.extra, "delivery_withheld");
                self.send_full_notice(ctx, key, n);
            }
            return;
        }
        d.write_failing = false;
        match d.writing.get_mut(&n) {
            Some(w) if !w.durable => w.durable = true,
            _ => return,
        }
        // The blocks now durable in order reach the application.
        let mut last = None;
        while let Some(e) = d.writing.first_entry() {
            if !e.get().durable {
                break;
            }
            let (m, w) = e.remove_entry();
            last = Some(m);
            self.cache_bytes = self.cache_bytes.saturating_sub(w.data.len() as u64);
            if !w.data.is_empty() {
                self.events.push_back(Event::Delivered {
                    flow: key,
                    offset: w.offset,
                    data: w.data,
                });
            }
        }
        let Some(last) = last else {
            return;
        };
        if d.finished_durably() {
            self.events.push_back(Event::FlowFinished {
                flow: key,
                bytes: d.delivered,
            });
        }
        self.note_cache();
        self.send_e2e(ctx, key, last);
        self.pump_flow(ctx, key);
    }
}
