//! §3.1 per-hop reliability: the packets a node forwards toward its next hop, the ones in
//! flight there, the per-hop delay estimate and timeout, and the per-hop acknowledgement.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use hop_wire::hxh::{self as wire, Message};
use hop_wire::NodeId;
use rand::Rng;

use super::{duration_from_secs, HxhConfig, HxhTransport, Role};
use crate::time::Instant;
use crate::transport::{Class, Ctx, Outgoing};
use crate::FlowKey;

/// Weight of a new sample in the per-hop delay deviation (RFC 6298's beta).
pub(super) const HOP_DELAY_VAR_GAIN: f64 = 0.25;

/// Per-hop timeouts double for each earlier try of a packet, up to 2^this.
pub(super) const HOP_BACKOFF_MAX_EXP: u32 = 2;

#[derive(Debug, Clone)]
pub(super) struct Pkt {
    pub(super) seq: u32,
    /// ACK_REQ / FIN / RETX as received or set by the source.
    pub(super) flags: u8,
    pub(super) payload: Bytes,
    pub(super) tries: u32,
}

#[derive(Debug)]
pub(super) struct Inflight {
    pub(super) pkt: Pkt,
    pub(super) sent_at: Instant,
    /// When the packet counts as lost on this hop.
    pub(super) deadline: Instant,
}

/// Forwarding state toward the next hop (sources and relays).
#[derive(Debug)]
pub(super) struct Fwd {
    pub(super) queue: BTreeMap<u32, Pkt>,
    pub(super) inflight: BTreeMap<u32, Inflight>,
    pub(super) next_hop: Option<NodeId>,
    /// Credits the next hop last advertised.
    pub(super) adv: u16,
    pub(super) last_feedback: Instant,
    /// When the flow last became blocked or sent a stall probe (§3.2 stall timer start).
    pub(super) stall_clock: Instant,
    pub(super) probe_ready: bool,
    /// EWMA of per-hop feedback delay, seconds.
    pub(super) hop_delay: f64,
    /// Mean deviation of the per-hop feedback delay, seconds.
    pub(super) hop_delay_var: f64,
    /// Fair-queueing finish tag (bytes).
    pub(super) vtime: u64,
    /// Last hop only: packets the destination acknowledged above `rev_ack` (§3.3).
    pub(super) delivered: BTreeSet<u32>,
    pub(super) in_sync: bool,
    pub(super) highest_tx: Option<u32>,
    /// Passive feedback toward this next hop (§3.2): a relay, whose forwarding of our packets
    /// we overhear. The pool is then the credits its latest transmission advertised, minus
    /// the packets sent since (the paper's pool, decremented per packet sent and synchronised
    /// from the shim header), not minus the packets it has not acknowledged.
    pub(super) passive: bool,
    /// Packets sent since the credits were last synchronised (passive feedback).
    pub(super) sent_since_sync: u32,
    /// The next hop's transmission the credits were last synchronised from: a link-layer
    /// retry of the same frame, overheard again, carries nothing new.
    pub(super) synced_seq: Option<u32>,
}

impl Fwd {
    pub(super) fn new(cfg: &HxhConfig, now: Instant, vclock: u64) -> Self {
        Fwd {
            queue: BTreeMap::new(),
            inflight: BTreeMap::new(),
            next_hop: None,
            adv: cfg.buffer_packets,
            last_feedback: now,
            stall_clock: now,
            probe_ready: false,
            hop_delay: cfg.hop_delay_initial.as_secs_f64(),
            hop_delay_var: cfg.hop_delay_initial.as_secs_f64() / 2.0,
            vtime: vclock,
            delivered: BTreeSet::new(),
            in_sync: true,
            highest_tx: None,
            passive: false,
            sent_since_sync: 0,
            synced_seq: None,
        }
    }

    pub(super) fn held(&self) -> usize {
        self.queue.len() + self.inflight.len()
    }

    pub(super) fn held_bytes(&self) -> u64 {
        let q: usize = self.queue.values().map(|p| p.payload.len()).sum();
        let i: usize = self.inflight.values().map(|p| p.pkt.payload.len()).sum();
        (q + i) as u64
    }

    /// Feed one per-hop delay sample (packet sent -> its feedback) to the estimator.
    pub(super) fn delay_sample(&mut self, cfg: &HxhConfig, sample: f64) {
        // Smoothed delay and mean deviation, as TCP's RTT estimator (RFC 6298).
        let dev = (sample - self.hop_delay).abs();
        self.hop_delay_var =
            (1.0 - HOP_DELAY_VAR_GAIN) * self.hop_delay_var + HOP_DELAY_VAR_GAIN * dev;
        self.hop_delay = (1.0 - cfg.hop_delay_gain) * self.hop_delay + cfg.hop_delay_gain * sample;
    }

    pub(super) fn hop_rto(&self, cfg: &HxhConfig) -> Duration {
        let rto = duration_from_secs(
            self.hop_delay + self.hop_delay_var * f64::from(cfg.hop_rto_multiplier),
        );
        // With passive feedback a missing acknowledgement is mostly a transmission of the
        // next hop we did not overhear, not a lost packet (the link retries the data): send
        // again only when §3.2 would probe a stopped flow, after five EWMAs of the delay.
        let rto = if self.passive {
            rto.max(self.stall_after(cfg))
        } else {
            rto
        };
        rto.clamp(cfg.hop_rto_min, cfg.hop_rto_max)
    }

    pub(super) fn holds(&self, seq: u32) -> bool {
        self.queue.contains_key(&seq) || self.inflight.contains_key(&seq)
    }

    pub(super) fn requeue(&mut self, seq: u32, pkt: Pkt) {
        self.queue.entry(seq).or_insert(pkt);
    }
    /// Per-hop retransmission: a missing hop ack puts the packet back in the queue (§3.1:
    /// "places a copy of the packet back into the flow's queue"), unless it was tried too
    /// often or the destination has it already. Returns (requeued, dropped).
    pub(super) fn expire_inflight(
        &mut self,
        cfg: &HxhConfig,
        now: Instant,
        rev_ack: u32,
    ) -> (u64, u64) {
        let mut hop_retx = 0u64;
        let mut hop_drops = 0u64;
        let expired: Vec<u32> = self
            .inflight
            .iter()
            .filter(|(_, i)| i.deadline <= now)
            .map(|(&s, _)| s)
            .collect();
        for seq in expired {
            if let Some(mut inf) = self.inflight.remove(&seq) {
                inf.pkt.tries += 1;
                if inf.pkt.tries > cfg.hop_retry_limit {
                    hop_drops += 1;
                } else if seq >= rev_ack {
                    hop_retx += 1;
                    self.requeue(seq, inf.pkt);
                }
            }
        }
        (hop_retx, hop_drops)
    }

    /// Keep a packet just sent in flight until the next hop has it. Per-hop timeout: doubled
    /// for each earlier try and stretched by a random 0-50 %, so that neighbours that lost
    /// frames together (hidden terminals) do not retry together.
    pub(super) fn keep_in_flight(&mut self, cfg: &HxhConfig, ctx: &mut Ctx<'_>, pkt: Pkt) {
        let rto = self
            .hop_rto(cfg)
            .saturating_mul(1u32 << pkt.tries.min(HOP_BACKOFF_MAX_EXP))
            .min(cfg.hop_rto_max)
            .mul_f64(1.0 + 0.5 * ctx.rng.gen::<f64>());
        self.inflight.insert(
            pkt.seq,
            Inflight {
                pkt,
                sent_at: ctx.now,
                deadline: ctx.now + rto,
            },
        );
    }
}

impl HxhTransport {
    pub(super) fn on_hop_ack(&mut self, ctx: &mut Ctx<'_>, from: NodeId, a: wire::HopAck) {
        let now = ctx.now;
        let key = FlowKey {
            src: a.src,
            id: a.id,
        };
        let cfg = self.cfg.clone();
        let Some(flow) = self.flows.get_mut(&key) else {
            return;
        };
        if matches!(flow.role, Role::Dest(_)) || flow.fwd.next_hop != Some(from) {
            return;
        }
        let last_hop = Self::is_last_hop(flow);
        flow.fwd.sync_credits(a.credits, now);
        if let Role::Relay(rl) = &mut flow.role {
            rl.last_activity = now;
        }
        let mut freed = false;
        if let Some(inf) = flow.fwd.inflight.remove(&a.seq) {
            flow.fwd
                .delay_sample(&cfg, (now - inf.sent_at).as_secs_f64());
            if a.flags & wire::HOPACK_REFUSED != 0 {
                flow.fwd.requeue(a.seq, inf.pkt);
            } else {
                freed = true;
                if last_hop && flow.fwd.in_sync && a.seq >= flow.rev_ack {
                    flow.fwd.delivered.insert(a.seq);
                }
            }
        }
        if !last_hop {
            self.learn_rev_ack(now, key, a.rev_ack);
        } else if a.flags & wire::HOPACK_SYNC_REPLY != 0 {
            // §3.3.1: the destination's own cumulative ACK resynchronises the last hop.
            self.bump("sync_replies");
            self.learn_rev_ack(now, key, a.rev_ack);
        }
        let mut sync_request = false;
        if last_hop {
            let advanced = self.flows.get_mut(&key).and_then(|flow| {
                if !flow.fwd.in_sync {
                    return None;
                }
                let mut r = flow.rev_ack;
                while flow.fwd.delivered.contains(&r) {
                    r += 1;
                }
                (r > flow.rev_ack).then_some(r)
            });
            if let Some(r) = advanced {
                self.learn_rev_ack(now, key, r);
            }
            if let Some(flow) = self.flows.get_mut(&key) {
                sync_request = Self::last_hop_check_gap(flow);
            }
        }
        if sync_request {
            self.bump("sync_requests");
        }
        if freed {
            self.maybe_credit_update(key);
        }
    }
    /// Send the next packet of flow `key` to its next hop, as the scheduler chose it at
    /// virtual time `start`, and keep it in flight until the next hop has it (§3.1).
    pub(super) fn send_data(
        &mut self,
        ctx: &mut Ctx<'_>,
        key: FlowKey,
        start: u64,
    ) -> Option<Outgoing> {
        let cfg = &self.cfg;
        let flow = self.flows.get_mut(&key)?;
        let probe = flow.fwd.pool() <= 0;
        let mut pkt = Self::take_packet(flow)?;
        let next_hop = flow.fwd.next_hop?;
        let flags = flow.data_flags(&mut pkt, next_hop);
        let credits = flow.credits_to_advertise(cfg);
        let body = Message::Data(wire::Data {
            flags,
            credits,
            src: key.src,
            id: key.id,
            dst: flow.dst,
            seq: pkt.seq,
            rev_ack: flow.rev_ack,
            payload: &pkt.payload,
        })
        .to_vec();
        // Fair queueing (§3.1): the flow's finish tag moves on by the bytes it sent.
        let len = pkt.payload.len().max(1) as u64;
        flow.fwd.vtime = start + len;
        self.vclock = start;
        flow.fwd.note_sent(probe, ctx.now);
        let retx = pkt.tries > 0;
        flow.fwd.keep_in_flight(cfg, ctx, pkt);
        if retx {
            self.stats.data_retransmissions += 1;
        }
        *self.stats.sent_by_type.entry("data").or_insert(0) += 1;
        if probe {
            self.bump("probe_packets");
        }
        Some(Outgoing {
            next_hop,
            class: Class::Data,
            body,
            head: 0,
        })
    }
}
