//! Hop: reliable per-hop block transfer (Hop paper, NSDI 2009, §3).
//!
//! Data moves in blocks of up to 1 MiB, split into packets and sent in txop-sized bursts. Each
//! hop runs rounds of BSYN → BACK (bitmap) → missing packets until its next hop holds the block
//! (§3.1); relays forward a block as soon as they hold a txop's worth of it (spatial
//! pipelining). The destination acknowledges each block end to end; a source that hears
//! nothing within the last block round-trip time sends a virtual retransmission that is served
//! from the caches along the path (§3.2). Per flow a node holds at most H blocks not yet moved
//! downstream (backpressure, §3.3); blocks wait in custody while the next hop is unreachable
//! (§3.4); a receiver serves one upstream sender at a time (ack withholding, §3.5); small
//! transfers ride on the BSYN and are served first (micro-blocks, §3.6).
//!
//! The transport is sans-IO: see [`crate::Transport`].

mod bitmap;
mod config;
mod custody;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use hop_wire::hop::{
    BlockGeom, HopBody, HopHeader, HopMessage, MsgType, FLAG_ABORT, FLAG_ASK, FLAG_COMPLETE,
    FLAG_FIN, FLAG_MICRO, FLAG_VTX, FLAG_WAIT,
};
use hop_wire::{NodeId, TransportId};
use rand::Rng;

use crate::time::Instant;
use crate::transport::{Class, Ctx, Outgoing, Received, Transport, TransportStats};
use crate::{AppError, Event, FailReason, FlowKey};

pub use bitmap::Bitmap;
pub use config::*;
pub use custody::{
    CustodyStore, Delivery, DestProgress, MemoryOnly, Persist, StoreFull, StoredBlock,
};

/// Why a BSYN was not answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Withhold {
    /// Backpressure: H blocks held, or custody storage full (§3.3).
    Backpressure,
    /// Another upstream sender holds the receiver (§3.5).
    AckWithholding,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutState {
    /// A BSYN must be sent (when a route exists).
    NeedBsyn,
    /// BSYN sent; waiting for the BACK until `deadline`.
    AwaitBack { deadline: Instant },
    /// Sending the packets the next hop lacks.
    Sending,
}

/// The transfer of one block to the next hop.
#[derive(Debug, Clone)]
struct OutXfer {
    next_hop: NodeId,
    state: OutState,
    /// Packets the next hop reported.
    peer: Bitmap,
    /// Packets sent since the last BACK.
    sent_round: Bitmap,
    /// Packets ever sent on this hop (retransmission accounting).
    ever_sent: Bitmap,
    /// Per packet: position in this node's stream of data handed to the link (0 = never)
    /// and when, of its latest transmission (loss inference, `queue_aware`).
    sent_seq: Vec<u64>,
    sent_at: Vec<Instant>,
    /// Packets handed to the link more than once on this hop: their arrival does not tell
    /// which copy arrived, so it gives no delay sample (Karn's rule).
    resent: Bitmap,
    /// Per packet: position in the node's stream of its oldest copy not known lost. Whichever
    /// copy arrived was handed to the link at or after it, so an arrival proves that every
    /// packet handed over before this position has left the queue, even for a resent packet.
    live_seq: Vec<u64>,
    /// Packets whose every copy so far is known lost: a BACK left them out although a
    /// packet handed to the link after their latest copy had arrived (FIFO). Their next
    /// copy is the only one that can arrive, so its arrival is evidence again.
    lost_known: Bitmap,
    /// No BSYN before this: the last BACK showed no progress and the packets still in
    /// flight are probably queued here.
    not_before: Option<Instant>,
    /// When the latest BSYN was sent.
    bsyn_at: Instant,
    /// Data packets handed to the link since the latest BSYN (`early_bsyn`).
    sent_since_bsyn: u32,
    /// When a BACK last showed new packets of this transfer (or it started).
    progress_at: Instant,
    vtx: bool,
    ttl: u8,
    micro: bool,
    /// Unanswered BSYNs in a row (backoff exponent).
    attempts: u32,
    cursor: u32,
    /// The next hop said it holds our BSYN for later (`wait_notice`) and has not answered
    /// it since: the packets of ours it has not reported do not count against the link
    /// window, or a node whose window is full of them could send nothing else, not even
    /// to the receivers that gave it a turn, until the wait ends.
    told_wait: bool,
    /// Copies the tail rule gave up that may still be queued here (`hold_tail_losses`):
    /// (packet, position in the node's stream, when handed to the link).
    tail_held: Vec<(u32, u64, Instant)>,
}

#[derive(Debug)]
struct Block {
    offset: u64,
    geom: BlockGeom,
    fin: bool,
    data: Vec<u8>,
    have: Bitmap,
    /// The node must not drop it: it accepted it from upstream (complete) or is its source.
    custody: bool,
    /// Fully acknowledged by the next hop (or delivered, at the destination).
    moved: bool,
    /// The upstream neighbour whose BSYN we answered (on-path block).
    admitted_from: Option<NodeId>,
    last_used: Instant,
    last_data: Instant,
    /// When this node last sent a BACK for the block (None: never).
    last_back: Option<Instant>,
    /// DATA packets of the block received again from upstream since the last BACK.
    dups: u16,
    /// Packets held only from overheard frames: their sender did not know we had them, so
    /// its copy is no duplicate.
    overheard: Bitmap,
    /// A virtual retransmission with this TTL must be forwarded.
    vtx_fwd: Option<u8>,
    /// When custody was taken (expiry).
    custody_since: Instant,
    /// The store is writing the block ([`Persist::Later`]); the completing BACK goes to this
    /// upstream neighbour once it is durable.
    persisting: Option<NodeId>,
    /// Source only: first BSYN (round-trip measurement) and virtual retransmission timer.
    first_sent: Option<Instant>,
    vtx_deadline: Option<Instant>,
    vtx_count: u32,
}

impl Block {
    fn new(offset: u64, geom: BlockGeom, fin: bool, now: Instant) -> Self {
        let n = geom.packets();
        Block {
            offset,
            geom,
            fin,
            data: vec![0; geom.block_len as usize],
            have: Bitmap::new(n),
            custody: false,
            moved: false,
            admitted_from: None,
            last_used: now,
            last_data: Instant::ZERO,
            last_back: None,
            dups: 0,
            overheard: Bitmap::new(n),
            vtx_fwd: None,
            custody_since: now,
            persisting: None,
            first_sent: None,
            vtx_deadline: None,
            vtx_count: 0,
        }
    }

    fn complete(&self) -> bool {
        self.have.is_full()
    }

    /// Store packet `n`; returns true if it was new.
    fn store(&mut self, n: u32, payload: &[u8]) -> bool {
        match self.geom.packet_range(n) {
            Some(r) if r.len() == payload.len() && !self.have.get(n) => {
                self.data[r].copy_from_slice(payload);
                self.have.set(n)
            }
            _ => false,
        }
    }

    /// Payload bytes of the packets held.
    fn held_bytes(&self) -> u64 {
        (0..self.geom.packets())
            .filter(|&i| self.have.get(i))
            .filter_map(|i| self.geom.packet_range(i))
            .map(|r| r.len() as u64)
            .sum()
    }

    fn packet(&self, n: u32) -> &[u8] {
        match self.geom.packet_range(n) {
            Some(r) => &self.data[r],
            None => &[],
        }
    }
}

#[derive(Debug, Default)]
struct SourceState {
    pending: VecDeque<Bytes>,
    pending_bytes: usize,
    next_block: u32,
    next_offset: u64,
    finish: bool,
    fin_block: Option<u32>,
    rto: Duration,
    last_progress: Instant,
    blocked: bool,
    had_route: bool,
}

#[derive(Debug, Default)]
struct DestState {
    next_deliver: u32,
    delivered: u64,
    finished: bool,
    /// The store refused the next block (no room): its end-to-end BACK and new blocks of
    /// the flow are withheld until a retry succeeds.
    blocked: bool,
}

#[derive(Debug)]
struct Flow {
    dst: NodeId,
    blocks: BTreeMap<u32, Block>,
    outs: BTreeMap<u32, OutXfer>,
    /// Deferred BACKs: block -> (upstream, due, packets the upstream's BSYN said it sent).
    deferred: BTreeMap<u32, (NodeId, Instant, u16)>,
    last_activity: Instant,
    /// The destination reported the flow finished; waiting for FIN or idle timeout.
    finished: bool,
    /// End-to-end acknowledgement seen passing (relays): blocks below `e2e_cum` are delivered,
    /// and with `e2e_fin` the whole flow is.
    e2e_cum: u32,
    e2e_fin: bool,
    source: Option<SourceState>,
    dest: Option<DestState>,
}

impl Flow {
    fn new(dst: NodeId, now: Instant) -> Self {
        Flow {
            dst,
            blocks: BTreeMap::new(),
            outs: BTreeMap::new(),
            deferred: BTreeMap::new(),
            last_activity: now,
            finished: false,
            e2e_cum: 0,
            e2e_fin: false,
            source: None,
            dest: None,
        }
    }

    /// Complete blocks held and not yet moved downstream (§3.3).
    fn held_unmoved(&self) -> usize {
        self.blocks
            .values()
            .filter(|b| (b.custody || b.persisting.is_some()) && !b.moved && b.complete())
            .count()
    }

    fn has_custody(&self) -> bool {
        self.blocks.values().any(|b| b.custody && !b.moved)
    }
}

/// A BSYN that was withheld, answered when the reason clears.
#[derive(Debug, Clone)]
struct Waiting {
    from: NodeId,
    key: FlowKey,
    dst: NodeId,
    block: u32,
    offset: u64,
    geom: BlockGeom,
    flags: u8,
    ttl: u8,
    /// Latest BSYN for this block (the sender's retries refresh it).
    at: Instant,
    /// First BSYN for this block that was withheld: turns go in this order.
    since: Instant,
    reason: Withhold,
}

/// An upstream block this node is receiving (ack withholding bookkeeping).
#[derive(Debug, Clone, Copy)]
struct Admitted {
    last_heard: Instant,
    /// Packets the sender sent in this turn, from the `expect` of its BSYNs
    /// (`withhold_turn_sends`).
    sent: u32,
    /// Packets of the block held here when this node last answered the sender: a BSYN's
    /// `expect` above it is what the sender sent since.
    base: u32,
}

/// What a node's sending side was doing, for the time-in-state counters (diagnostics): where
/// a node that seldom sends spends its time. A node in several states at once counts in the
/// first that applies, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SendState {
    /// A transfer has packets of its round it may hand to the link now: the node sends as
    /// fast as its link takes them (or as its link window opens).
    Ready,
    /// A relay's transfer holds fewer than a txop of new packets of a block still arriving
    /// and waits for more from upstream (pipelining threshold, §3.1): the pace is set
    /// upstream.
    Feed,
    /// The transfers wait for the BACK of a round's first BSYN (a control round trip, the
    /// receiver's BACK deferral, or the node's own queue ahead of the BSYN), or have yet to
    /// send their BSYN (held back while their packets may still be queued here, or for want
    /// of a route).
    Round,
    /// The transfers' BSYNs went unanswered more than once, or the next hop told them to
    /// wait: the receiver withholds (backpressure §3.3, ack withholding §3.5) or the control
    /// frames were lost.
    Silent,
    /// Blocks to move or application bytes to cut, and no transfer under way: a source
    /// holding its next block back (backpressure, §3.3, or its cache bound).
    Held,
}

/// Names of the counters, in [`SendState`] order, and how long the node was in none of them.
const SEND_STATE_NAMES: [&str; 5] = [
    "time_ready_ms",
    "time_feed_ms",
    "time_round_ms",
    "time_silent_ms",
    "time_held_ms",
];
const SEND_IDLE_NAME: &str = "time_idle_ms";
/// Time during which this node withheld at least one upstream BSYN for backpressure (§3.3)
/// or for ack withholding (§3.5): why its upstream neighbours were silent.
const WITHHOLD_NAMES: [&str; 2] = ["time_withholding_bp_ms", "time_withholding_aw_ms"];

/// Time per [`SendState`], credited at each call into the transport for the time since the
/// previous one (the state cannot change in between).
#[derive(Debug, Clone, Default)]
struct StateClock {
    at: Option<Instant>,
    spent: [Duration; 5],
    idle: Duration,
    withholding: [Duration; 2],
}

/// The Hop transport of one node.
pub struct HopTransport {
    cfg: HopConfig,
    pkt: u16,
    txop_pkts: u32,
    flows: BTreeMap<FlowKey, Flow>,
    ctrl: VecDeque<Outgoing>,
    rr: VecDeque<FlowKey>,
    turn_left: u32,
    events: VecDeque<Event>,
    admitted: BTreeMap<(FlowKey, u32), Admitted>,
    /// The sender whose block completed last (ack withholding hands the next turn to the
    /// others first).
    last_holder: Option<NodeId>,
    waiting: Vec<Waiting>,
    /// Flows this node was the destination of and no longer holds (finished, aborted by their
    /// source, or given up idle), oldest first, at most `CLOSED_FLOW_MEMORY`: a late BSYN or
    /// DATA of one must not open it again from block 0, which would hold the source's later
    /// blocks forever without delivering them.
    closed: VecDeque<FlowKey>,
    closed_set: BTreeSet<FlowKey>,
    store: Box<dyn CustodyStore>,
    stats: TransportStats,
    cache_bytes: u64,
    timer: Option<Instant>,
    housekeeping_at: Option<Instant>,
    /// Source flows with new application bytes or a finish to cut into blocks when polled.
    to_form: Vec<FlowKey>,
    /// Data packets handed to the link so far (sequence of the latest).
    link_seq: u64,
    /// Every data packet up to this sequence has left the link's queue: a packet with this
    /// sequence was reported by a BACK (the data queue is FIFO) or judged lost.
    left_seq: u64,
    /// The newest position of that stream known to have arrived at a next hop (judged
    /// lost packets excluded): every copy handed to the link before it has left the link.
    arrived_seq: u64,
    /// Smoothed time from handing a packet to the link to the BACK that reports it.
    delivery_delay: Option<Duration>,
    /// Delivery delays added to the tail rule's loss age because next hops reported
    /// duplicate data (`duplicate_feedback`), when it last grew, and the BACKs since then
    /// whose tail losses came without duplicates.
    tail_ext: u32,
    tail_ext_at: Instant,
    tail_clean: u32,
    /// BSYN-to-BACK round trip per next hop (`adaptive_bsyn_timeout`).
    bsyn_rtt: BTreeMap<NodeId, RttEstimate>,
    /// The link window and the delivery rate that sizes it.
    lw: LinkWindow,
    /// Time in each sending state (the `time_*_ms` counters).
    clock: StateClock,
}

/// The node's link window (`link_window_packets` up to `link_window_max_packets`).
#[derive(Debug, Clone)]
struct LinkWindow {
    /// Packets handed to the link that next hops newly reported holding, over all transfers.
    delivered: u64,
    /// Start of the current rate interval and `delivered` then.
    rate_mark: Option<(Instant, u64)>,
    /// Current window in packets (0 = unbounded).
    window: usize,
}

impl LinkWindow {
    /// Count `newly` packets of ours a next hop reported holding and, once per [`RATE_INTERVAL`], set
    /// the window to the packets delivered in `link_queue_target` at the rate of the interval
    /// just ended, between `link_window_packets` and `link_window_max_packets`. A
    /// window-limited interval measures window / round time, so on a link faster than the
    /// window the window grows by the ratio of the target to the round time per interval; a
    /// saturated link's rate does not grow with the window, so neither does the window.
    fn note(&mut self, cfg: &HopConfig, now: Instant, newly: u64) {
        self.delivered += newly;
        let floor = cfg.link_window_packets;
        let ceiling = cfg.link_window_max_packets;
        if floor == 0 || ceiling <= floor {
            self.window = floor;
            return;
        }
        let Some((since, mark)) = self.rate_mark else {
            self.rate_mark = Some((now, self.delivered));
            return;
        };
        let elapsed = now.saturating_duration_since(since);
        if elapsed < RATE_INTERVAL {
            return;
        }
        let packets = (self.delivered - mark) as f64;
        let target = packets * cfg.link_queue_target.as_secs_f64() / elapsed.as_secs_f64();
        self.window = (target.ceil() as usize).clamp(floor, ceiling);
        self.rate_mark = Some((now, self.delivered));
    }
}

/// Closed incoming flows a node remembers, so that late messages of one are refused instead
/// of opening it again (about 40 bytes each).
const CLOSED_FLOW_MEMORY: usize = 4096;

/// Length of one delivery-rate measurement behind the link window: several control rounds on
/// a fast link, about one round of a full 32-packet window on 802.11b.
const RATE_INTERVAL: Duration = Duration::from_millis(100);

fn bump(map: &mut BTreeMap<&'static str, u64>, k: &'static str) {
    *map.entry(k).or_insert(0) += 1;
}

fn name_of(t: MsgType, flags: u8) -> &'static str {
    match t {
        MsgType::Data => "data",
        MsgType::Bsyn if flags & FLAG_MICRO != 0 => "micro",
        MsgType::Bsyn if flags & FLAG_VTX != 0 => "vtx",
        MsgType::Bsyn => "bsyn",
        MsgType::Back if flags & FLAG_WAIT != 0 => "wait",
        MsgType::Back => "back",
        MsgType::E2eBack => "e2e_back",
        MsgType::Fin => "fin",
    }
}

/// How long after it was handed to the link an unreported packet is judged lost (the tail,
/// RFC 8985 §7): twice the delivery delay (the BSYN timeout before the first sample), plus
/// one delay per step of `ext` (next hops reported duplicate data, `duplicate_feedback`),
/// but once extended no longer than `link_queue_lifetime`: a copy still missing after the
/// link queue's delay limit was dropped there, so waiting longer cannot save a duplicate.
fn tail_age(delivery_delay: Option<Duration>, ext: u32, cfg: &HopConfig) -> Duration {
    // Without a delay sample yet: the BSYN timeout, extended by halves of it.
    let (base, step) = match delivery_delay {
        Some(d) => (d * 2, d),
        None => (cfg.bsyn_timeout, cfg.bsyn_timeout / 2),
    };
    if ext == 0 {
        return base;
    }
    (base + step.saturating_mul(ext))
        .min(cfg.link_queue_lifetime)
        .max(base)
}

fn backoff(base: Duration, max: Duration, attempts: u32) -> Duration {
    base.saturating_mul(1u32 << attempts.min(16))
        .min(max.max(base))
}

/// Smoothed BSYN-to-BACK round trip of one next hop (RFC 6298 §2 estimator).
#[derive(Debug, Clone, Copy)]
struct RttEstimate {
    srtt: Duration,
    rttvar: Duration,
}

impl RttEstimate {
    fn update(prev: Option<Self>, r: Duration) -> Self {
        match prev {
            None => Self {
                srtt: r,
                rttvar: r / 2,
            },
            Some(e) => {
                let dev = if e.srtt > r { e.srtt - r } else { r - e.srtt };
                Self {
                    rttvar: (e.rttvar * 3 + dev) / 4,
                    srtt: (e.srtt * 7 + r) / 8,
                }
            }
        }
    }
}

/// Floor of the adaptive BSYN timer: `bsyn_min_timeout`, lowered on a link whose data
/// drains fast. A BSYN overtakes the data queued before it, so its BACK may rightly wait for
/// that data to arrive plus `back_quiet`; twice the measured delivery delay (hand-over to
/// BACK) plus `back_quiet` covers that. On 802.11b a window of data takes longer than
/// `bsyn_min_timeout` to drain and the floor stays there; on a wired or veth link (delivery
/// in about a millisecond) it falls to [`MIN_BSYN_FLOOR`], so a lost BSYN or BACK costs
/// milliseconds, not 50 ms.
fn bsyn_floor(cfg: &HopConfig, delivery_delay: Option<Duration>) -> Duration {
    match delivery_delay {
        Some(d) => (d * 2 + cfg.back_quiet)
            .max(MIN_BSYN_FLOOR)
            .min(cfg.bsyn_min_timeout),
        None => cfg.bsyn_min_timeout,
    }
}

/// Lowest floor of the adaptive BSYN timer: two BACK deferrals (`back_quiet`, 10 ms).
const MIN_BSYN_FLOOR: Duration = Duration::from_millis(20);

/// How long to wait for the BACK of a BSYN sent after `attempts` unanswered ones (`micro`:
/// the BSYNs of a micro-block, which carry its packets).
fn bsyn_wait(
    cfg: &HopConfig,
    rtt: Option<&RttEstimate>,
    delivery_delay: Option<Duration>,
    attempts: u32,
    micro: bool,
) -> Duration {
    if !cfg.adaptive_bsyn_timeout {
        return backoff(cfg.bsyn_timeout, cfg.bsyn_max_backoff, attempts);
    }
    let floor = bsyn_floor(cfg, delivery_delay);
    let first = match rtt {
        Some(e) => (e.srtt + e.rttvar * 4).max(floor),
        // Before the first sample, `bsyn_timeout` covers the drain of the data this node
        // handed to its link before the BSYN. A micro-block's packets ride on its BSYNs, in
        // the control class, and the next hop answers the last one at once (no BACK
        // deferral), so nothing of the block is queued behind them: the floor covers their
        // BACK. Without samples (a next hop this node has not sent to, or whose first tries
        // all went unanswered, Karn's rule) 200 ms per round dominated a small file's delay
        // next to a hidden sender: 480 ms median over 16 seeds of the simulator's
        // `micro-hidden` scenario, 65 ms with the floor (docs/reproduce.md).
        None if micro => floor,
        None => cfg.bsyn_timeout,
    };
    if attempts == 0 {
        return first;
    }
    // A repeated BSYN finds the data sent before the first one delivered (the first timer
    // covered its drain): its BACK comes after one control round trip, so the repeats wait
    // a multiple of the floor, growing linearly (under random loss a round fails often, and
    // doubling would let the waits, not the losses, set the rate); an unreachable next hop
    // still slows to one BSYN per bsyn_max_backoff.
    floor
        .saturating_mul(attempts)
        .min(cfg.bsyn_max_backoff.max(floor))
}

impl HopTransport {
    pub fn new(cfg: HopConfig) -> Self {
        Self::with_store(cfg, Box::new(MemoryOnly))
    }

    /// A transport persisting custody through `store`.
    pub fn with_store(cfg: HopConfig, store: Box<dyn CustodyStore>) -> Self {
        let pkt = cfg.packet_size();
        let txop_pkts = cfg.txop_packets();
        let cfg_window = cfg.link_window_packets;
        HopTransport {
            cfg,
            pkt,
            txop_pkts,
            flows: BTreeMap::new(),
            ctrl: VecDeque::new(),
            rr: VecDeque::new(),
            turn_left: 0,
            events: VecDeque::new(),
            admitted: BTreeMap::new(),
            last_holder: None,
            waiting: Vec::new(),
            closed: VecDeque::new(),
            closed_set: BTreeSet::new(),
            store,
            stats: TransportStats::default(),
            cache_bytes: 0,
            timer: None,
            housekeeping_at: None,
            to_form: Vec::new(),
            link_seq: 0,
            left_seq: 0,
            arrived_seq: 0,
            delivery_delay: None,
            tail_ext: 0,
            tail_ext_at: Instant::ZERO,
            tail_clean: 0,
            bsyn_rtt: BTreeMap::new(),
            lw: LinkWindow {
                delivered: 0,
                rate_mark: None,
                window: cfg_window,
            },
            clock: StateClock::default(),
        }
    }

    /// The node's sending state now (see [`SendState`]); None: nothing to send.
    fn send_state(&self) -> Option<SendState> {
        let mut best: Option<SendState> = None;
        let mut has_work = false;
        for f in self.flows.values() {
            if let Some(src) = &f.source {
                has_work |= src.pending_bytes > 0 || (src.finish && src.fin_block.is_none());
            }
            has_work |= f
                .blocks
                .values()
                .any(|b| b.custody && !b.moved && f.dest.is_none());
            // A relay receiving a block it has not started to forward (a txop of it is not
            // here yet, §3.1) waits for upstream too.
            if f.source.is_none()
                && f.dest.is_none()
                && f.blocks.iter().any(|(n, b)| {
                    !b.complete() && b.admitted_from.is_some() && !f.outs.contains_key(n)
                })
            {
                best = Some(match best {
                    Some(b) if (b as u8) <= (SendState::Feed as u8) => b,
                    _ => SendState::Feed,
                });
            }
            for (n, x) in &f.outs {
                let st = match x.state {
                    OutState::Sending => match f.blocks.get(n).map(|b| self.round_left(b, x)) {
                        Some((_, true)) => return Some(SendState::Ready),
                        Some((left, false)) if left > 0 => SendState::Feed,
                        _ => SendState::Round,
                    },
                    OutState::NeedBsyn => SendState::Round,
                    OutState::AwaitBack { .. } if x.told_wait || x.attempts > 1 => {
                        SendState::Silent
                    }
                    OutState::AwaitBack { .. } => SendState::Round,
                };
                best = Some(match best {
                    Some(b) if (b as u8) <= (st as u8) => b,
                    _ => st,
                });
            }
        }
        best.or(has_work.then_some(SendState::Held))
    }

    /// Credit the time since the previous call to the state the node was in.
    fn tick(&mut self, now: Instant) {
        let Some(at) = self.clock.at.replace(now) else {
            return;
        };
        let d = now.saturating_duration_since(at);
        if d.is_zero() {
            return;
        }
        match self.send_state() {
            Some(st) => self.clock.spent[st as usize] += d,
            None => self.clock.idle += d,
        }
        for (i, reason) in [Withhold::Backpressure, Withhold::AckWithholding]
            .into_iter()
            .enumerate()
        {
            if self.waiting.iter().any(|w| w.reason == reason) {
                self.clock.withholding[i] += d;
            }
        }
    }

    pub fn config(&self) -> &HopConfig {
        &self.cfg
    }

    /// The store finished writing a block it took with [`Persist::Later`]: durable (`ok`),
    /// the node now has custody and sends the completing BACK upstream; failed, the BACK
    /// stays withheld (the upstream's next BSYN asks again) and the store is told to forget
    /// the block. A block that has meanwhile moved downstream, or whose flow is gone, is
    /// released at once (its BACK still goes upstream: the block reached the next hop).
    fn on_custody_persisted(&mut self, ctx: &mut Ctx<'_>, flow: FlowKey, block_num: u32, ok: bool) {
        let now = ctx.now;
        let Some(b) = self
            .flows
            .get_mut(&flow)
            .and_then(|f| f.blocks.get_mut(&block_num))
        else {
            self.store.release(flow, block_num);
            return;
        };
        let Some(to) = b.persisting.take() else {
            return;
        };
        if !ok {
            self.store.release(flow, block_num);
            bump(&mut self.stats.extra, "custody_write_failed");
            return;
        }
        if b.moved {
            self.store.release(flow, block_num);
        } else {
            b.custody = true;
            b.custody_since = now;
        }
        self.note_buffered(flow);
        self.send_back(flow, block_num, to, now);
        self.pump_flow(ctx, flow);
    }

    /// Put blocks read back from a [`CustodyStore`] after a restart into custody again; they
    /// are forwarded as soon as the next hop answers. Blocks of flows this node is the source
    /// or destination of are ignored (the application owns those bytes).
    pub fn restore(&mut self, now: Instant, local: NodeId, blocks: Vec<StoredBlock>) {
        for sb in blocks {
            if sb.flow.src == local || sb.dst == local {
                continue;
            }
            if !self.flows.contains_key(&sb.flow) && self.flows.len() >= self.cfg.max_flows {
                continue;
            }
            let Ok(len) = u32::try_from(sb.data.len()) else {
                continue;
            };
            let geom = BlockGeom {
                block_len: len,
                packet_size: self.pkt,
            };
            if geom.validate().is_err() {
                continue;
            }
            let flow = self
                .flows
                .entry(sb.flow)
                .or_insert_with(|| Flow::new(sb.dst, now));
            if flow.blocks.contains_key(&sb.block_num) {
                continue;
            }
            let mut b = Block::new(sb.offset, geom, sb.fin, now);
            b.data.copy_from_slice(&sb.data);
            b.have.fill();
            b.custody = true;
            b.admitted_from = Some(sb.flow.src);
            flow.blocks.insert(sb.block_num, b);
            self.cache_bytes += u64::from(len);
        }
        self.note_cache();
        self.refresh_timer(now);
    }

    /// Resume flows this node is the destination of from progress persisted before a
    /// restart: blocks below `next_block` are acknowledged end to end again, not delivered
    /// again, and the source's retransmissions fill in the rest.
    pub fn restore_destination(&mut self, now: Instant, local: NodeId, flows: Vec<DestProgress>) {
        for p in flows {
            if self.flows.contains_key(&p.flow) || self.flows.len() >= self.cfg.max_flows {
                continue;
            }
            let mut f = Flow::new(local, now);
            f.dest = Some(DestState {
                next_deliver: p.next_block,
                delivered: p.bytes,
                finished: p.finished,
                blocked: false,
            });
            f.finished = p.finished;
            self.flows.insert(p.flow, f);
        }
        self.stats.flows = self.flows.len() as u64;
        self.refresh_timer(now);
    }

    // ----- helpers -----

    fn note_cache(&mut self) {
        self.stats.cache_bytes = self.cache_bytes;
        self.stats.cache_bytes_peak = self.stats.cache_bytes_peak.max(self.cache_bytes);
    }

    fn note_buffered(&mut self, key: FlowKey) {
        if let Some(f) = self.flows.get(&key) {
            let n = f.held_unmoved() as u64;
            self.stats.buffered_blocks_peak = self.stats.buffered_blocks_peak.max(n);
        }
    }

    /// Data packets handed to the link and not yet known to have left it, over all
    /// transfers (the quantity `link_window_packets` bounds).
    fn in_flight_total(&self) -> usize {
        self.flows
            .values()
            .flat_map(|f| f.outs.values())
            .filter(|x| !x.micro && !x.told_wait)
            .map(|x| self.queued(x) as usize + self.tail_held(x))
            .sum()
    }

    /// Copies of a transfer's packets the tail rule gave up that may still be queued here:
    /// no packet handed to the link after them, and not the packet itself, has been
    /// reported arrived (copies older than `link_queue_lifetime` are dropped from the list
    /// by `expire_tail_held`).
    fn tail_held(&self, x: &OutXfer) -> usize {
        x.tail_held
            .iter()
            .filter(|&&(p, sq, _)| sq > self.arrived_seq && !x.peer.get(p))
            .count()
    }

    /// Forget the held tail losses that left the queue or outlived `link_queue_lifetime`.
    fn expire_tail_held(&mut self, now: Instant) {
        let (arrived, life) = (self.arrived_seq, self.cfg.link_queue_lifetime);
        for f in self.flows.values_mut() {
            for x in f.outs.values_mut() {
                let peer = &x.peer;
                x.tail_held
                    .retain(|&(p, sq, at)| sq > arrived && !peer.get(p) && now < at + life);
            }
        }
    }

    /// A transfer's packets handed to the link and not yet known to have left it. With
    /// `queue_aware`, a packet handed over before one that arrived (any transfer's, as
    /// the next hops' BACKs report them) has left this node's FIFO queue, arrived or lost,
    /// whether or not its own next hop has answered yet; without, every packet of the
    /// round not reported.
    fn queued(&self, x: &OutXfer) -> u32 {
        let none = Bitmap::new(0);
        if !self.cfg.queue_aware {
            return x.sent_round.count_in_not(&x.peer, &none);
        }
        let mut n = 0;
        let mut from = 0;
        while let Some(p) = x.sent_round.next_in_not(&x.peer, &none, from) {
            if x.sent_seq
                .get(p as usize)
                .is_some_and(|&sq| sq > self.arrived_seq)
            {
                n += 1;
            }
            from = p + 1;
        }
        n
    }

    /// Packets handed to the link after which a transfer sends its BSYN early (half a link
    /// window, `early_bsyn`); 0 = never early.
    fn early_bsyn_at(&self) -> usize {
        if self.cfg.early_bsyn {
            self.lw.window / 2
        } else {
            0
        }
    }

    /// Per next hop, the transfer in the middle of a round: it has handed packets of the
    /// round to the link and has more to send (`round_per_next_hop`; empty when off).
    fn mid_round(&self) -> BTreeMap<NodeId, (FlowKey, u32)> {
        let mut mid = BTreeMap::new();
        if !self.cfg.round_per_next_hop {
            return mid;
        }
        let none = Bitmap::new(0);
        for (k, f) in &self.flows {
            for (n, x) in &f.outs {
                if x.micro || x.state != OutState::Sending {
                    continue;
                }
                let Some(b) = f.blocks.get(n) else { continue };
                let in_flight = x.sent_round.count_in_not(&x.peer, &none);
                // A relay's transfer waiting for a txop of new packets from upstream
                // (pipelining, §3.1) cannot send now: it does not hold up the others.
                let (_, can_send) = self.round_left(b, x);
                if in_flight > 0 && can_send {
                    mid.entry(x.next_hop).or_insert((*k, *n));
                }
            }
        }
        mid
    }

    /// Packets of block `b` that transfer `x` has not handed to the link in this round, and
    /// whether it may hand them over now: a relay forwarding a block still arriving waits
    /// for a txop of new packets (pipelining threshold, §3.1).
    fn round_left(&self, b: &Block, x: &OutXfer) -> (u32, bool) {
        let left = b.have.count_in_not(&x.peer, &x.sent_round);
        let can = left >= self.txop_pkts || (left > 0 && (b.complete() || !self.cfg.pipelining));
        (left, can)
    }

    /// Whether transfer (`key`, `n`) has handed half the link window to the link since its
    /// last BSYN while another transfer to the same next hop has packets to send.
    fn round_half_done(&self, key: FlowKey, n: u32) -> bool {
        let Some(x) = self.flows.get(&key).and_then(|f| f.outs.get(&n)) else {
            return false;
        };
        let half = self.lw.window / 2;
        if half == 0 || (x.sent_since_bsyn as usize) < half {
            return false;
        }
        self.flows.iter().any(|(k, f)| {
            f.outs.iter().any(|(m, y)| {
                (*k, *m) != (key, n)
                    && y.next_hop == x.next_hop
                    && !y.micro
                    && y.state == OutState::Sending
                    && f.blocks
                        .get(m)
                        .is_some_and(|b| b.have.count_in_not(&y.peer, &y.sent_round) > 0)
            })
        })
    }

    fn window_full(&self) -> bool {
        let w = self.lw.window;
        w > 0 && self.in_flight_total() >= w
    }

    /// The current link window in packets (0 = unbounded).
    pub fn link_window(&self) -> usize {
        self.lw.window
    }

    fn extra(&mut self, k: &'static str) {
        bump(&mut self.stats.extra, k);
    }

    fn push_ctrl(&mut self, next_hop: NodeId, msg: &HopMessage<'_>) {
        let mut body = Vec::with_capacity(msg.encoded_len());
        if msg.emit(&mut body).is_err() {
            return;
        }
        bump(
            &mut self.stats.sent_by_type,
            name_of(msg.msg_type(), msg.header.flags),
        );
        self.ctrl.push_back(Outgoing {
            next_hop,
            class: Class::Control,
            body,
        });
    }

    fn header(key: FlowKey, dst: NodeId, block: u32, flags: u8, ttl: u8) -> HopHeader {
        HopHeader {
            flags,
            ttl,
            src: key.src,
            flow_id: key.id,
            dst,
            block_num: block,
        }
    }

    fn drop_block(&mut self, key: FlowKey, num: u32) {
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        if let Some(b) = f.blocks.remove(&num) {
            self.cache_bytes = self.cache_bytes.saturating_sub(u64::from(b.geom.block_len));
            if (b.custody || b.persisting.is_some()) && !b.moved && f.source.is_none() {
                self.store.release(key, num);
            }
        }
        f.outs.remove(&num);
        f.deferred.remove(&num);
        self.admitted.remove(&(key, num));
        self.note_cache();
    }

    fn remove_flow(&mut self, key: FlowKey) {
        let nums: Vec<u32> = match self.flows.get(&key) {
            Some(f) => f.blocks.keys().copied().collect(),
            None => return,
        };
        for n in nums {
            self.drop_block(key, n);
        }
        if let Some(f) = self.flows.remove(&key) {
            if let Some(s) = f.source {
                self.cache_bytes = self.cache_bytes.saturating_sub(s.pending_bytes as u64);
                self.note_cache();
            }
            if let Some(d) = f.dest {
                if !d.finished {
                    self.store.abandon(key);
                    self.extra("flows_abandoned");
                    self.events.push_back(Event::FlowAbandoned { flow: key });
                }
                if self.closed_set.insert(key) {
                    self.closed.push_back(key);
                    while self.closed.len() > CLOSED_FLOW_MEMORY {
                        if let Some(old) = self.closed.pop_front() {
                            self.closed_set.remove(&old);
                        }
                    }
                }
            }
        }
        self.admitted.retain(|(k, _), _| *k != key);
        self.waiting.retain(|w| w.key != key);
        self.rr.retain(|k| *k != key);
    }

    /// Evict cached (non-custody, not in progress) blocks until the cache fits its limit.
    fn evict(&mut self) {
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
    fn pinned(&self, k: FlowKey, f: &Flow, n: u32, b: &Block) -> bool {
        (b.custody && (!b.moved || f.source.is_some()))
            || b.persisting.is_some()
            || f.outs.contains_key(&n)
            || self.admitted.contains_key(&(k, n))
    }

    /// Bytes that cannot be evicted.
    fn protected_bytes(&self) -> u64 {
        self.pinned_bytes(true)
    }

    /// Bytes of pinned blocks, plus application bytes waiting at sources if `pending`.
    fn pinned_bytes(&self, pending: bool) -> u64 {
        let mut sum = 0u64;
        for (k, f) in &self.flows {
            for (n, b) in &f.blocks {
                if self.pinned(*k, f, *n, b) {
                    sum += u64::from(b.geom.block_len);
                }
            }
            if let Some(s) = f.source.as_ref().filter(|_| pending) {
                sum += s.pending_bytes as u64;
            }
        }
        sum
    }

    // ----- source side -----

    /// Cut the next block from the application's bytes (never waiting for more, §4.2).
    fn form_block(&mut self, ctx: &mut Ctx<'_>, key: FlowKey) {
        let limit = self.cfg.block_bytes();
        let micro_threshold = self.cfg.micro_block_threshold;
        let pkt = self.pkt;
        let now = ctx.now;
        let Some(f) = self.flows.get(&key) else {
            return;
        };
        if f.outs.values().any(|o| !o.vtx) || f.finished {
            return;
        }
        let Some(s) = f.source.as_ref() else {
            return;
        };
        if s.fin_block.is_some() || (s.pending_bytes == 0 && !s.finish) {
            return;
        }
        // Custody at the source is bounded by the cache: with the cache full of blocks not
        // yet acknowledged end to end, wait for end-to-end BACKs.
        if s.pending_bytes > 0 {
            let held = self.pinned_bytes(false);
            let next = s.pending_bytes.min(limit) as u64;
            if held > 0 && held + next > self.cfg.cache_limit_bytes {
                return;
            }
        }
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let dst = f.dst;
        let idle_before = f.blocks.is_empty();
        let Some(s) = f.source.as_mut() else {
            return;
        };
        if idle_before {
            // New work after an idle period: the give-up clock starts now.
            s.last_progress = now;
        }
        let len = s.pending_bytes.min(limit);
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
        s.pending_bytes -= data.len();
        let fin = s.finish && s.pending_bytes == 0;
        let num = s.next_block;
        s.next_block = s.next_block.wrapping_add(1);
        let offset = s.next_offset;
        s.next_offset += data.len() as u64;
        if fin {
            s.fin_block = Some(num);
        }
        let rto = s.rto;
        let was_blocked = std::mem::take(&mut s.blocked);
        let geom = BlockGeom {
            block_len: data.len() as u32,
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
            .insert(num, Self::new_xfer(next_hop, geom, false, 0, micro));
        if was_blocked {
            self.events.push_back(Event::Writable { flow: key });
        }
        self.note_buffered(key);
    }

    fn new_xfer(next_hop: NodeId, geom: BlockGeom, vtx: bool, ttl: u8, micro: bool) -> OutXfer {
        let n = geom.packets();
        OutXfer {
            next_hop,
            state: OutState::NeedBsyn,
            peer: Bitmap::new(n),
            sent_round: Bitmap::new(n),
            ever_sent: Bitmap::new(n),
            sent_seq: vec![0; n as usize],
            sent_at: vec![Instant::ZERO; n as usize],
            resent: Bitmap::new(n),
            live_seq: vec![0; n as usize],
            lost_known: Bitmap::new(n),
            not_before: None,
            bsyn_at: Instant::ZERO,
            sent_since_bsyn: 0,
            progress_at: Instant::ZERO,
            vtx,
            ttl,
            micro,
            attempts: 0,
            cursor: 0,
            told_wait: false,
            tail_held: Vec::new(),
        }
    }

    // ----- per-flow pump: start transfers, send BSYNs -----

    fn pump_flow(&mut self, ctx: &mut Ctx<'_>, key: FlowKey) {
        let now = ctx.now;
        let Some(f) = self.flows.get(&key) else {
            return;
        };
        let is_source = f.source.is_some();
        let is_dest = f.dest.is_some();
        if is_source {
            self.form_block(ctx, key);
            self.source_vtx(ctx, key);
        } else if !is_dest {
            self.relay_forward(ctx, key);
        }
        // Deferred BACKs that are due.
        let due: Vec<(u32, NodeId)> = match self.flows.get(&key) {
            Some(f) => f
                .deferred
                .iter()
                .filter(|(n, (_, t, expect))| {
                    *t <= now
                        || f.blocks
                            .get(n)
                            .is_some_and(|b| b.complete() || b.have.count() >= u32::from(*expect))
                })
                .map(|(n, (u, _, _))| (*n, *u))
                .collect(),
            None => return,
        };
        for (n, up) in due {
            if let Some(f) = self.flows.get_mut(&key) {
                f.deferred.remove(&n);
            }
            self.send_back(key, n, up, now);
        }
        // BSYNs.
        let nums: Vec<u32> = match self.flows.get(&key) {
            Some(f) => f.outs.keys().copied().collect(),
            None => return,
        };
        for n in nums {
            self.drive_xfer(ctx, key, n);
        }
    }

    /// Send a BSYN (or micro-block BSYNs) for a transfer that needs one.
    fn drive_xfer(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, n: u32) {
        let now = ctx.now;
        let sending = self
            .flows
            .get(&key)
            .and_then(|f| f.outs.get(&n))
            .is_some_and(|x| x.state == OutState::Sending && !x.micro);
        let window_full = sending && self.window_full();
        let early_half = self.early_bsyn_at();
        let rounds = self.cfg.round_per_next_hop;
        // With rounds per next hop, a round ends at half the window when another transfer
        // waits to start its round to the same next hop: its BACK then returns while the
        // next round's packets are still on the link.
        let half_round = sending && rounds && self.round_half_done(key, n);
        // Of this transfer's packets, those still queued here (what its BACK would take
        // out of a full window).
        let queued = self
            .flows
            .get(&key)
            .and_then(|f| f.outs.get(&n))
            .map_or(0, |x| self.queued(x));
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let dst = f.dst;
        let (Some(x), Some(b)) = (f.outs.get_mut(&n), f.blocks.get(&n)) else {
            return;
        };
        let mut why = "bsyn_start";
        let need = match x.state {
            OutState::NeedBsyn => true,
            OutState::AwaitBack { .. } => false,
            OutState::Sending => {
                if x.micro {
                    true
                } else {
                    let left = b.have.count_in_not(&x.peer, &x.sent_round);
                    if left > 0 && !self.rr.contains(&key) {
                        self.rr.push_back(key);
                    }
                    // Ask when everything was handed to the link, or when the link window
                    // is full and this transfer has packets in it (the BACK opens it).
                    let in_flight = queued;
                    let round_done = left == 0 && b.complete();
                    if rounds && window_full && in_flight > 0 && !round_done && x.attempts == 0 {
                        // A full window asks for a BACK once this transfer has handed at
                        // least a txop (or half the window, if smaller) to the link since
                        // its last BSYN; with less, the window is full of packets still
                        // queued here (its BACK would report next to nothing), so it asks a
                        // loss age (the tail rule of the BACK handling) after its last BSYN.
                        let enough = self.txop_pkts.min(self.lw.window as u32 / 2).max(1);
                        if x.sent_since_bsyn < enough {
                            let t =
                                x.bsyn_at + tail_age(self.delivery_delay, self.tail_ext, &self.cfg);
                            if t > now {
                                x.not_before = Some(x.not_before.map_or(t, |u| u.max(t)));
                            }
                        }
                    }
                    let due = x.not_before.map_or(true, |t| t <= now);
                    // Early BSYN: half a window handed over since the last one.
                    let half = early_half > 0 && x.sent_since_bsyn as usize >= early_half;
                    let need =
                        due && (round_done || (window_full && in_flight > 0) || half || half_round);
                    if need {
                        why = if round_done {
                            "bsyn_round_done"
                        } else if half_round {
                            "bsyn_half_round"
                        } else if half {
                            "bsyn_early"
                        } else {
                            "bsyn_window_full"
                        };
                    }
                    need
                }
            }
        };
        if !need {
            return;
        }
        // Follow route changes (§3.4): the next hop is looked up whenever a BSYN is sent.
        let Some(next_hop) = ctx.routing.next_hop(dst) else {
            return;
        };
        if next_hop != x.next_hop {
            let (vtx, ttl, micro) = (x.vtx, x.ttl, x.micro);
            *x = Self::new_xfer(next_hop, b.geom, vtx, ttl, micro);
        }
        let mut flags = if b.fin { FLAG_FIN } else { 0 };
        if x.vtx {
            flags |= FLAG_VTX;
        }
        let ttl = if x.vtx { x.ttl } else { 0 };
        let repeat = x.attempts > 0;
        let wait = bsyn_wait(
            &self.cfg,
            self.bsyn_rtt.get(&next_hop),
            self.delivery_delay,
            x.attempts,
            x.micro,
        );
        // Up to 25 % jitter so senders withheld by the same receiver, or hidden from each
        // other, do not retry in lockstep.
        let jitter = u64::try_from(wait.as_nanos() / 4).unwrap_or(u64::MAX);
        let wait = wait + Duration::from_nanos(ctx.rng.gen_range(0..=jitter));
        x.state = OutState::AwaitBack {
            deadline: now + wait,
        };
        x.attempts = x.attempts.saturating_add(1);
        x.not_before = None;
        x.bsyn_at = now;
        x.sent_since_bsyn = 0;
        let mut msgs: Vec<Vec<u8>> = Vec::new();
        let mut retx = 0u64;
        if x.micro {
            flags |= FLAG_MICRO;
            // Every packet the next hop lacks rides on its own BSYN; the last one asks for
            // the BACK. A repeat (no BACK since the last send) carries only the last of
            // them, which asks (§3.6 piggybacks the micro-block on the initial BSYN): the
            // packets of the last send may only be queued behind a busy link, and sending
            // all of them again on every timeout fed a collapse at a lossy hub
            // (docs/reproduce.md); the BACK then says which are missing.
            let mut missing: Vec<u32> = (0..b.geom.packets())
                .filter(|i| !x.peer.get(*i) && b.have.get(*i))
                .collect();
            if repeat && missing.len() > 1 {
                missing.drain(..missing.len() - 1);
            }
            if missing.is_empty() || !b.complete() {
                let msg = HopMessage {
                    header: Self::header(key, dst, n, flags | FLAG_ASK, ttl),
                    body: HopBody::Bsyn {
                        offset: b.offset,
                        geom: b.geom,
                        packet_num: 0,
                        expect: 0,
                        payload: &[],
                    },
                };
                let mut out = Vec::new();
                if msg.emit(&mut out).is_ok() {
                    msgs.push(out);
                }
            } else {
                for (i, p) in missing.iter().enumerate() {
                    let last = i + 1 == missing.len();
                    let fl = if last { flags | FLAG_ASK } else { flags };
                    let msg = HopMessage {
                        header: Self::header(key, dst, n, fl, ttl),
                        body: HopBody::Bsyn {
                            offset: b.offset,
                            geom: b.geom,
                            packet_num: *p as u16,
                            expect: 0,
                            payload: b.packet(*p),
                        },
                    };
                    let mut out = Vec::new();
                    if msg.emit(&mut out).is_ok() {
                        msgs.push(out);
                    }
                    if !x.ever_sent.set(*p) {
                        retx += 1;
                    }
                }
            }
        } else {
            // The next hop holds what it reported plus what this round handed to the link,
            // once that arrives; the BSYN overtakes the data still queued here.
            // A repeated BSYN follows data that had the whole first wait to arrive: it asks
            // for an answer at once.
            let in_flight = if repeat {
                0
            } else {
                x.sent_round.count_in_not(&x.peer, &Bitmap::new(0))
            };
            let expect = (x.peer.count() + in_flight).min(u32::from(u16::MAX)) as u16;
            let msg = HopMessage {
                header: Self::header(key, dst, n, flags, ttl),
                body: HopBody::Bsyn {
                    offset: b.offset,
                    geom: b.geom,
                    packet_num: 0,
                    expect,
                    payload: &[],
                },
            };
            let mut out = Vec::new();
            if msg.emit(&mut out).is_ok() {
                msgs.push(out);
            }
        }
        let name = name_of(MsgType::Bsyn, flags);
        let nh = x.next_hop;
        bump(
            &mut self.stats.extra,
            if repeat { "bsyn_repeat" } else { why },
        );
        self.stats.data_retransmissions += retx;
        for body in msgs {
            bump(&mut self.stats.sent_by_type, name);
            self.ctrl.push_back(Outgoing {
                next_hop: nh,
                class: Class::Control,
                body,
            });
        }
    }

    /// Source: virtual retransmission of blocks not acknowledged end to end in time (§3.2).
    fn source_vtx(&mut self, ctx: &mut Ctx<'_>, key: FlowKey) {
        if !self.cfg.virtual_retransmission {
            return;
        }
        let now = ctx.now;
        let ttl = self.cfg.vtx_ttl;
        let vmax = self.cfg.vtx_initial_timeout;
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let rto = f.source.as_ref().map(|s| s.rto).unwrap_or(vmax);
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
                .insert(*n, Self::new_xfer(next_hop, b.geom, true, ttl, micro));
            started += 1;
        }
        for _ in 0..started {
            self.extra("vtx_sent");
        }
    }

    /// Relay: start forwarding blocks (pipelined once a txop's worth is held, §3.1).
    fn relay_forward(&mut self, ctx: &mut Ctx<'_>, key: FlowKey) {
        let pipelining = self.cfg.pipelining;
        let txop = self.txop_pkts;
        let micro_threshold = self.cfg.micro_block_threshold;
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        if f.finished {
            return;
        }
        let dst = f.dst;
        // Micro-blocks are forwarded whole, on BSYNs (§3.6); larger blocks as soon as a txop
        // of them is here (pipelining, §3.1).
        let ready = |b: &Block| {
            b.complete()
                || (pipelining
                    && b.have.count() >= txop
                    && b.geom.block_len as usize >= micro_threshold)
        };
        let normal_active = f.outs.values().any(|o| !o.vtx);
        let mut start: Vec<(u32, bool, u8)> = Vec::new();
        let mut normal_taken = normal_active;
        for (n, b) in &f.blocks {
            if f.outs.contains_key(n) || !ready(b) {
                continue;
            }
            if let Some(t) = b.vtx_fwd {
                start.push((*n, true, t));
            } else if !normal_taken && b.admitted_from.is_some() && !b.moved {
                start.push((*n, false, 0));
                normal_taken = true;
            }
        }
        if start.is_empty() {
            return;
        }
        let next_hop = ctx.routing.next_hop(dst).unwrap_or(dst);
        for (n, vtx, ttl) in start {
            let Some(b) = f.blocks.get_mut(&n) else {
                continue;
            };
            b.vtx_fwd = None;
            let micro = (b.geom.block_len as usize) < micro_threshold && b.complete();
            f.outs
                .insert(n, Self::new_xfer(next_hop, b.geom, vtx, ttl, micro));
        }
    }

    // ----- receiving side -----

    /// Admission of a BSYN's block (backpressure, custody room, ack withholding).
    fn may_admit(
        &self,
        key: FlowKey,
        n: u32,
        from: NodeId,
        geom: BlockGeom,
        flags: u8,
    ) -> Result<(), Withhold> {
        let micro = flags & FLAG_MICRO != 0;
        // A block older than every block held here repairs a block the destination is
        // missing (a virtual retransmission, or a relay's transfer started again after its
        // next hop lost the block in a crash); holding it back behind H blocks that wait for
        // exactly this repair would deadlock the flow. (A newer block, premature VTX or not,
        // obeys H like any other.)
        let repair = self.flows.get(&key).is_some_and(|f| {
            f.blocks
                .iter()
                .filter(|(_, b)| b.custody && !b.moved && b.complete())
                .all(|(m, _)| n < *m)
        });
        let Some(f) = self.flows.get(&key) else {
            return Ok(());
        };
        if let Some(b) = f.blocks.get(&n) {
            // The block this node is receiving from `from` now. One admitted earlier and
            // released since (its sender went silent) asks again like any other.
            let current = b.admitted_from == Some(from) && self.admitted.contains_key(&(key, n));
            if current || b.complete() {
                return Ok(());
            }
        }
        let unblocks_delivery = f.dest.as_ref().is_some_and(|d| d.next_deliver == n);
        if f.dest.as_ref().is_some_and(|d| d.blocked) && !unblocks_delivery {
            return Err(Withhold::Backpressure);
        }
        if self.cfg.backpressure
            && !unblocks_delivery
            && !repair
            && f.held_unmoved() >= self.cfg.backpressure_limit.max(1)
        {
            return Err(Withhold::Backpressure);
        }
        let have = f
            .blocks
            .get(&n)
            .map(|b| u64::from(b.geom.block_len))
            .unwrap_or(0);
        // A block held under another geometry (a waiting BSYN from before the source
        // restarted) is replaced, so it may hold more than the BSYN asks for.
        let need = (self.protected_bytes() + u64::from(geom.block_len)).saturating_sub(have);
        if need > self.cfg.cache_limit_bytes {
            return Err(Withhold::Backpressure);
        }
        if self.cfg.ack_withholding && !micro {
            // One block at a time (§3.5: the receiver "is only receiving one block from any
            // sender at a given time"), also from the sender it is serving: a sender with
            // blocks of many flows for this node (a bridge relay) would otherwise keep
            // several in progress and never let the others' turn come.
            if !self.admitted.is_empty() {
                return Err(Withhold::AckWithholding);
            }
            // Fairness: a sender that just finished does not jump ahead of waiting senders.
            let waiting_first = self.waiting.iter().any(|w| {
                w.from != from
                    && w.reason == Withhold::AckWithholding
                    && w.geom.block_len <= geom.block_len
            });
            if waiting_first {
                return Err(Withhold::AckWithholding);
            }
        }
        Ok(())
    }

    fn ensure_flow(&mut self, key: FlowKey, dst: NodeId, local: NodeId, now: Instant) -> bool {
        if let Some(f) = self.flows.get_mut(&key) {
            f.last_activity = now;
            return true;
        }
        if key.src == local {
            // A flow of ours we no longer know: finished or aborted.
            return false;
        }
        if dst == local && self.closed_set.contains(&key) {
            self.extra("closed_flow_refused");
            return false;
        }
        if self.flows.len() >= self.cfg.max_flows {
            self.extra("flows_refused");
            return false;
        }
        let mut f = Flow::new(dst, now);
        if dst == local {
            f.dest = Some(DestState::default());
            self.events.push_back(Event::FlowOpened { flow: key });
        }
        self.flows.insert(key, f);
        self.stats.flows = self.flows.len() as u64;
        true
    }

    fn send_back(&mut self, key: FlowKey, n: u32, to: NodeId, now: Instant) {
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let dst = f.dst;
        let delivered =
            f.dest.as_ref().is_some_and(|d| n < d.next_deliver) || n < f.e2e_cum || f.e2e_fin;
        let (len, bits, complete, fin, duplicates) = match f.blocks.get_mut(&n) {
            Some(b) => {
                b.last_used = now;
                b.last_back = Some(now);
                if let Some(a) = self.admitted.get_mut(&(key, n)) {
                    a.base = b.have.count();
                }
                let mut bits = Vec::with_capacity(b.have.len().div_ceil(8) as usize);
                b.have.write_bytes(&mut bits);
                let dups = std::mem::take(&mut b.dups);
                (
                    b.geom.block_len,
                    (b.have.len(), bits),
                    b.complete(),
                    b.fin,
                    dups,
                )
            }
            None if delivered => (0, (0, Vec::new()), true, false, 0),
            None => return,
        };
        let mut flags = if complete { FLAG_COMPLETE } else { 0 };
        if fin {
            flags |= FLAG_FIN;
        }
        let (packets, bitmap) = bits;
        let msg = HopMessage {
            header: Self::header(key, dst, n, flags, 0),
            body: HopBody::Back {
                block_len: len,
                packets: packets as u16,
                duplicates,
                bitmap: &bitmap,
            },
        };
        self.push_ctrl(to, &msg);
    }

    fn send_e2e(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, n: u32) {
        let Some(f) = self.flows.get(&key) else {
            return;
        };
        let Some(d) = &f.dest else { return };
        let flags = if d.finished { FLAG_FIN } else { 0 };
        let msg = HopMessage {
            header: Self::header(key, f.dst, n, flags, 0),
            body: HopBody::E2eBack {
                cum_blocks: d.next_deliver,
            },
        };
        if let Some(nh) = ctx.routing.next_hop(key.src) {
            self.push_ctrl(nh, &msg);
        }
    }

    /// Answer a BSYN now, or remember it if withheld.
    #[allow(clippy::too_many_arguments)]
    fn on_bsyn(
        &mut self,
        ctx: &mut Ctx<'_>,
        from: NodeId,
        h: &HopHeader,
        offset: u64,
        geom: BlockGeom,
        packet_num: u16,
        expect: u16,
        payload: &[u8],
        retry: bool,
    ) {
        let now = ctx.now;
        let key = FlowKey {
            src: h.src,
            id: h.flow_id,
        };
        let n = h.block_num;
        let micro = h.flags & FLAG_MICRO != 0;
        let vtx = h.flags & FLAG_VTX != 0;
        if !self.ensure_flow(key, h.dst, ctx.local, now) {
            return;
        }
        let is_dest = h.dst == ctx.local;
        // Already delivered at the destination: acknowledge again, hop and end to end.
        let delivered = self
            .flows
            .get(&key)
            .and_then(|f| f.dest.as_ref())
            .is_some_and(|d| n < d.next_deliver || d.finished);
        if delivered {
            self.send_back(key, n, from, now);
            self.send_e2e(ctx, key, n);
            return;
        }
        // A relay that saw the end-to-end BACK answers for the destination: this is how the
        // acknowledgement crosses a partition that swallowed it (the source's virtual
        // retransmission probes for it hop by hop).
        let known = self
            .flows
            .get(&key)
            .filter(|f| f.source.is_none() && f.dest.is_none())
            .filter(|f| n < f.e2e_cum || f.e2e_fin)
            .map(|f| (f.e2e_cum, f.e2e_fin, f.dst));
        if let Some((cum, fin, dst)) = known {
            self.send_back(key, n, from, now);
            let msg = HopMessage {
                header: Self::header(key, dst, n, if fin { FLAG_FIN } else { 0 }, 0),
                body: HopBody::E2eBack { cum_blocks: cum },
            };
            self.push_ctrl(from, &msg);
            return;
        }
        let existing_ok = self
            .flows
            .get(&key)
            .and_then(|f| f.blocks.get(&n))
            .map(|b| (b.geom == geom, b.complete()));
        if existing_ok.is_some_and(|(same, _)| !same) {
            // Geometry changed (a restarted source): start the block afresh.
            self.drop_block(key, n);
        }
        let complete_here = existing_ok.is_some_and(|(same, c)| same && c);
        if !retry && !complete_here {
            self.end_long_turn(ctx, key, n, from, geom, expect);
        }
        if vtx && !retry {
            // A virtual retransmission served (wholly or partly) from this node's cache.
            let held = self
                .flows
                .get(&key)
                .and_then(|f| f.blocks.get(&n))
                .is_some_and(|b| b.geom == geom && b.have.count() > 0);
            if held {
                self.extra("cache_hits");
            }
        }
        if !complete_here {
            if let Err(w) = self.may_admit(key, n, from, geom, h.flags) {
                if !retry {
                    self.extra(match w {
                        Withhold::Backpressure => "backpressure_withheld",
                        Withhold::AckWithholding => "acks_withheld",
                    });
                    let since = self
                        .waiting
                        .iter()
                        .find(|x| x.key == key && x.block == n && x.from == from)
                        .map_or(now, |x| x.since);
                    self.waiting
                        .retain(|x| !(x.key == key && x.block == n && x.from == from));
                    self.waiting.push(Waiting {
                        since,
                        from,
                        key,
                        dst: h.dst,
                        block: n,
                        offset,
                        geom,
                        flags: h.flags,
                        ttl: h.ttl,
                        at: now,
                        reason: w,
                    });
                }
                if self.cfg.wait_notice {
                    // Tell the sender it is queued, so it does not keep asking; its BACK
                    // comes when its turn does (`service_waiting`).
                    let msg = HopMessage {
                        header: Self::header(key, h.dst, n, FLAG_WAIT, 0),
                        body: HopBody::Back {
                            block_len: geom.block_len,
                            packets: 0,
                            duplicates: 0,
                            bitmap: &[],
                        },
                    };
                    self.push_ctrl(from, &msg);
                }
                // Keep a micro payload anyway if the block is known; it costs nothing more.
                return;
            }
        }
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        if !f.blocks.contains_key(&n) {
            self.cache_bytes += u64::from(geom.block_len);
        }
        let b = f
            .blocks
            .entry(n)
            .or_insert_with(|| Block::new(offset, geom, h.flags & FLAG_FIN != 0, now));
        b.offset = offset;
        b.fin |= h.flags & FLAG_FIN != 0;
        b.last_used = now;
        if b.admitted_from.is_none() || b.admitted_from != Some(from) {
            b.admitted_from = Some(from);
        }
        if vtx && !is_dest && h.ttl > 1 {
            // Forward the repair; a block already moved downstream is served from the cache
            // without taking custody again (the source still holds it until the end-to-end
            // BACK).
            b.vtx_fwd = Some(h.ttl - 1);
        }
        let mut ask = !micro || h.flags & FLAG_ASK != 0;
        if micro && !payload.is_empty() {
            let was = b.complete();
            b.store(u32::from(packet_num), payload);
            b.last_data = now;
            if b.complete() && !was {
                ask = true;
            }
        }
        let complete = b.complete();
        if !complete {
            let base = b.have.count();
            self.admitted
                .entry((key, n))
                .and_modify(|a| a.last_heard = now)
                .or_insert(Admitted {
                    last_heard: now,
                    sent: 0,
                    base,
                });
        }
        self.note_cache();
        if complete {
            self.block_completed(ctx, key, n, from);
            if ask || !micro {
                self.send_back_checked(ctx, key, n, from);
            }
        } else if ask {
            // Answer at once when every packet the sender handed to its link is here;
            // otherwise wait for the data still behind this BSYN, until it has paused for
            // `back_quiet` (then the BACK reports the packets lost).
            let quiet = self.cfg.back_quiet;
            let Some(f) = self.flows.get_mut(&key) else {
                return;
            };
            let (held, last, data_this_round) = f
                .blocks
                .get(&n)
                .map(|b| {
                    let fresh = b.last_back.map_or(true, |t| b.last_data > t);
                    (b.have.count(), b.last_data, fresh)
                })
                .unwrap_or((0, Instant::ZERO, false));
            // Data of this round that has already paused for `back_quiet` was lost, not
            // delayed; with none yet, it is still queued behind the BSYN.
            let due = if data_this_round {
                last + quiet
            } else {
                now + quiet
            };
            if !micro && held < u32::from(expect) && due > now {
                f.deferred.insert(n, (from, due, expect));
            } else {
                f.deferred.remove(&n);
                self.send_back(key, n, from, now);
            }
        }
        self.evict();
    }

    /// Send the BACK for a complete block, taking custody first (persisting it).
    fn send_back_checked(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, n: u32, to: NodeId) {
        let now = ctx.now;
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let dst = f.dst;
        let is_relay = f.source.is_none() && f.dest.is_none();
        if let Some(b) = f.blocks.get_mut(&n) {
            if b.persisting.is_some() {
                // Still being written: the BACK goes when the store reports it durable.
                b.persisting = Some(to);
                return;
            }
            if is_relay && !b.custody && !b.moved && b.admitted_from.is_some() {
                let sb = StoredBlock {
                    flow: key,
                    dst,
                    block_num: n,
                    offset: b.offset,
                    fin: b.fin,
                    data: Bytes::copy_from_slice(&b.data),
                };
                match self.store.persist(&sb) {
                    Err(StoreFull) => {
                        bump(&mut self.stats.extra, "custody_store_full");
                        return;
                    }
                    Ok(Persist::Later) => {
                        b.persisting = Some(to);
                        bump(&mut self.stats.extra, "custody_writes_deferred");
                        return;
                    }
                    Ok(Persist::Done) => {}
                }
                b.custody = true;
                b.custody_since = now;
            }
        }
        self.note_buffered(key);
        self.send_back(key, n, to, now);
    }

    /// A block became complete on this node.
    fn block_completed(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, n: u32, from: NodeId) {
        if self.admitted.remove(&(key, n)).is_some() {
            self.last_holder = Some(from);
        }
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        f.deferred.remove(&n);
        if f.dest.is_some() {
            if let Some(b) = f.blocks.get_mut(&n) {
                b.custody = true;
            }
            self.deliver(ctx, key);
        }
    }

    /// Destination: deliver complete blocks in order and acknowledge them end to end.
    fn deliver(&mut self, ctx: &mut Ctx<'_>, key: FlowKey) {
        loop {
            let Some(f) = self.flows.get_mut(&key) else {
                return;
            };
            let Some(d) = f.dest.as_mut() else { return };
            let n = d.next_deliver;
            let ready = f.blocks.get(&n).is_some_and(|b| b.complete());
            if !ready {
                return;
            }
            if let Some(b) = f.blocks.get(&n) {
                let delivery = Delivery {
                    flow: key,
                    block_num: n,
                    offset: d.delivered,
                    fin: b.fin,
                    data: &b.data,
                };
                if self.store.deliver(&delivery).is_err() {
                    if !d.blocked {
                        d.blocked = true;
                        bump(&mut self.stats.extra, "delivery_withheld");
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
            let len = b.data.len() as u64;
            if !b.data.is_empty() {
                self.events.push_back(Event::Delivered {
                    flow: key,
                    offset: d.delivered,
                    data: Bytes::from(b.data),
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

    #[allow(clippy::too_many_arguments)]
    fn on_data(
        &mut self,
        ctx: &mut Ctx<'_>,
        rx: &Received<'_>,
        h: &HopHeader,
        offset: u64,
        geom: BlockGeom,
        packet_num: u16,
        payload: &[u8],
    ) {
        let now = ctx.now;
        let key = FlowKey {
            src: h.src,
            id: h.flow_id,
        };
        let n = h.block_num;
        if rx.overheard && !self.cfg.cache_overheard {
            return;
        }
        if rx.overheard && (h.src == ctx.local) {
            return;
        }
        if !self.flows.contains_key(&key) && (rx.overheard || h.dst != ctx.local) {
            // Only cache what fits without displacing custody.
            if self.protected_bytes() + u64::from(geom.block_len) > self.cfg.cache_limit_bytes {
                return;
            }
        }
        if !self.ensure_flow(key, h.dst, ctx.local, now) {
            return;
        }
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        if f.dest
            .as_ref()
            .is_some_and(|d| n < d.next_deliver || d.finished)
        {
            return;
        }
        if f.source.is_some() {
            return;
        }
        if f.dest.is_none() && (n < f.e2e_cum || f.e2e_fin) && !f.blocks.contains_key(&n) {
            // Late copies of a block already delivered end to end (its BACK overtook them):
            // keeping them would start a new transfer of a finished block.
            return;
        }
        if f.blocks.get(&n).is_some_and(|b| b.geom != geom) {
            if rx.overheard {
                return;
            }
            self.drop_block(key, n);
        }
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        let new_block = !f.blocks.contains_key(&n);
        let b = f
            .blocks
            .entry(n)
            .or_insert_with(|| Block::new(offset, geom, false, now));
        if new_block {
            self.cache_bytes += u64::from(geom.block_len);
        }
        // Every DATA packet of a flow's last block carries FIN: the block may complete here
        // from DATA alone (its BSYN was withheld, and the sender sent the packets that
        // follow a BSYN at once), and without it the destination would never finish.
        b.fin |= h.flags & FLAG_FIN != 0;
        let was_complete = b.complete();
        let fresh = b.store(u32::from(packet_num), payload);
        b.last_used = now;
        if !rx.overheard {
            b.last_data = now;
            if !fresh && b.overheard.get(u32::from(packet_num)) {
                // First copy from its sender; the one held was overheard.
                b.overheard.unset(u32::from(packet_num));
            } else if !fresh {
                // A copy of a packet already here: its sender gave up one that was late.
                b.dups = b.dups.saturating_add(1);
                bump(&mut self.stats.extra, "data_duplicates");
            }
            if b.admitted_from.is_none() {
                b.admitted_from = Some(rx.link_src);
            }
        } else if fresh {
            b.overheard.set(u32::from(packet_num));
            self.stats
                .extra
                .entry("overheard_cached")
                .and_modify(|x| *x += 1)
                .or_insert(1);
        }
        let complete = b.complete();
        let upstream = b.admitted_from;
        if let Some(a) = self.admitted.get_mut(&(key, n)) {
            a.last_heard = now;
        }
        self.note_cache();
        if complete && !was_complete {
            if let Some(up) = upstream {
                self.block_completed(ctx, key, n, up);
                // Answer the upstream at once: it is waiting for this BACK.
                self.send_back_checked(ctx, key, n, up);
            }
            self.service_waiting(ctx);
        } else if !rx.overheard && !complete {
            // A deferred BACK goes as soon as the packets its BSYN announced are here;
            // otherwise its deadline stays `back_quiet` after the newest packet.
            let quiet = self.cfg.back_quiet;
            let held = self
                .flows
                .get(&key)
                .and_then(|f| f.blocks.get(&n))
                .map(|b| b.have.count())
                .unwrap_or(0);
            let mut answer = None;
            if let Some(f) = self.flows.get_mut(&key) {
                if let Some(d) = f.deferred.get_mut(&n) {
                    if held >= u32::from(d.2) {
                        answer = Some(d.0);
                    } else {
                        d.1 = now + quiet;
                    }
                }
                if answer.is_some() {
                    f.deferred.remove(&n);
                }
            }
            if let Some(up) = answer {
                self.send_back(key, n, up, now);
            }
        }
        self.evict();
    }

    fn on_back(
        &mut self,
        ctx: &mut Ctx<'_>,
        from: NodeId,
        h: &HopHeader,
        packets: u16,
        duplicates: u16,
        bitmap: &[u8],
    ) {
        let now = ctx.now;
        let key = FlowKey {
            src: h.src,
            id: h.flow_id,
        };
        let n = h.block_num;
        let Some(f) = self.flows.get_mut(&key) else {
            return;
        };
        f.last_activity = now;
        if let Some(s) = f.source.as_mut() {
            s.last_progress = now;
        }
        let Some(b) = f.blocks.get_mut(&n) else {
            f.outs.remove(&n);
            return;
        };
        let Some(x) = f.outs.get_mut(&n) else {
            return;
        };
        if x.next_hop != from {
            return;
        }
        if h.flags & FLAG_WAIT != 0 {
            // The next hop holds our BSYN and will answer when our turn comes: ask again only
            // after `wait_hold`, in case that answer is lost or the next hop forgets us.
            if matches!(x.state, OutState::AwaitBack { .. }) {
                let hold = self.cfg.wait_hold;
                let jitter = u64::try_from(hold.as_nanos() / 4).unwrap_or(u64::MAX);
                let hold = hold + Duration::from_nanos(ctx.rng.gen_range(0..=jitter));
                x.state = OutState::AwaitBack {
                    deadline: now + hold,
                };
                x.told_wait = true;
                bump(&mut self.stats.extra, "waits_heard");
            }
            return;
        }
        let complete = h.flags & FLAG_COMPLETE != 0;
        if !complete && u32::from(packets) != b.geom.packets() {
            return;
        }
        x.told_wait = false;
        b.last_used = now;
        if duplicates > 0 {
            *self.stats.extra.entry("duplicates_reported").or_insert(0) += u64::from(duplicates);
            if self.cfg.duplicate_feedback && self.cfg.queue_aware {
                // The next hop got copies of packets it already held: the tail rule gave up
                // packets that were only queued. Wait one delivery delay longer before the
                // next such judgement, at most once per delivery delay (RACK's reordering
                // window grows the same way on D-SACKs, RFC 8985 §6.2 step 4).
                let step = self.delivery_delay.unwrap_or(self.cfg.bsyn_timeout);
                if self.tail_ext == 0 || now >= self.tail_ext_at + step {
                    self.tail_ext = self.tail_ext.saturating_add(1);
                    self.tail_ext_at = now;
                    bump(&mut self.stats.extra, "tail_age_raised");
                }
                self.tail_clean = 0;
            }
        }
        // Packets of ours in flight before and after this BACK: the difference arrived (a
        // block the next hop completes from elsewhere adds only what we had sent).
        let none = Bitmap::new(0);
        let in_flight_before = x.sent_round.count_in_not(&x.peer, &none);
        if complete {
            x.peer.fill();
        } else if matches!(x.state, OutState::AwaitBack { .. }) {
            // The answer to our BSYN is authoritative (a restarted next hop may hold less).
            x.peer.clear();
            x.peer.union_bytes(bitmap);
        } else {
            // A late duplicate BACK: it can only add information.
            x.peer.union_bytes(bitmap);
        }
        let in_flight_after = x.sent_round.count_in_not(&x.peer, &none);
        let newly = u64::from(in_flight_before.saturating_sub(in_flight_after));
        self.lw.note(&self.cfg, now, newly);
        if x.attempts == 1 && matches!(x.state, OutState::AwaitBack { .. }) {
            // Answer to a BSYN sent once (Karn's rule): a round-trip sample.
            let r = now.saturating_duration_since(x.bsyn_at);
            let e = RttEstimate::update(self.bsyn_rtt.get(&from).copied(), r);
            self.bsyn_rtt.insert(from, e);
        }
        x.attempts = 0;
        // The newest of our packets the next hop now holds: every data packet handed to the
        // link before it has left the link's FIFO queue; its age is a delivery-delay sample.
        // A packet sent more than once gives no sample (the copy that arrived may be an old
        // one), but it still proves that its oldest live copy has left the queue.
        let mut newest: Option<(u64, Instant)> = None;
        let mut floor = 0u64;
        let mut progress = false;
        for p in 0..x.sent_seq.len() as u32 {
            if !(x.sent_round.get(p) && x.peer.get(p)) {
                continue;
            }
            progress = true;
            if x.resent.get(p) {
                floor = floor.max(x.live_seq[p as usize]);
                continue;
            }
            let sq = x.sent_seq[p as usize];
            if sq > 0 && newest.map_or(true, |(q, _)| sq > q) {
                newest = Some((sq, x.sent_at[p as usize]));
            }
        }
        if floor > 0 {
            self.left_seq = self.left_seq.max(floor);
            self.arrived_seq = self.arrived_seq.max(floor);
        }
        if progress || x.progress_at == Instant::ZERO {
            x.progress_at = now;
        }
        if self.cfg.queue_aware {
            // Arrived packets are no longer in flight (a late BACK counts too).
            for p in 0..x.sent_seq.len() as u32 {
                if x.peer.get(p) {
                    x.sent_round.unset(p);
                }
            }
        }
        if let Some((sq, at)) = newest {
            self.left_seq = self.left_seq.max(sq);
            self.arrived_seq = self.arrived_seq.max(sq);
            // A delay sample only when the BSYN followed the packet at once: the next hop
            // then answered when the packet arrived, not whenever it was asked.
            if x.bsyn_at.saturating_duration_since(at) <= self.cfg.back_quiet {
                let sample = now.saturating_duration_since(at);
                // Rises at once, decays slowly: a packet is not judged lost while packets
                // sent as long ago are still being delivered.
                self.delivery_delay = Some(match self.delivery_delay {
                    Some(d) if d > sample => (d * 7 + sample) / 8,
                    _ => sample,
                });
            }
        }
        if x.peer.is_full() {
            // The next hop holds the whole block: custody moves downstream (§3.1, §3.3).
            f.outs.remove(&n);
            b.moved = true;
            b.vtx_fwd = None;
            let relay = f.source.is_none();
            if relay && b.custody {
                b.custody = false;
                self.store.release(key, n);
            }
            self.expire_tail_held(now);
            self.service_waiting(ctx);
            self.pump_flow(ctx, key);
            return;
        }
        if matches!(x.state, OutState::AwaitBack { .. }) {
            x.state = OutState::Sending;
            x.cursor = 0;
            x.not_before = None;
            if self.cfg.queue_aware {
                // Missing packets handed to the link before one that arrived are lost: the
                // link's data queue is FIFO (RACK, RFC 8985 §6.2, with the send order in
                // place of time). The rest are probably still queued here and are not sent
                // again; only when nothing arrived since the last BACK are those older than
                // the loss age given up (the tail, RFC 8985 §7).
                // The tail also needs the transfer to have stalled that long: while the queue
                // drains, a BACK without news only means the next hop heard a pause.
                let age = tail_age(self.delivery_delay, self.tail_ext, &self.cfg);
                let stalled = now >= x.progress_at + age;
                let left = self.left_seq;
                let mut lost_upto = 0u64;
                let (mut fifo, mut tail, mut kept) = (0u64, 0u64, 0u64);
                for p in 0..x.sent_seq.len() as u32 {
                    if !x.sent_round.get(p) {
                        continue;
                    }
                    let (sq, at) = (x.sent_seq[p as usize], x.sent_at[p as usize]);
                    if x.peer.get(p) {
                        x.sent_round.unset(p);
                        continue;
                    }
                    if sq < left || (!progress && stalled && now >= at + age) {
                        x.sent_round.unset(p);
                        if sq < left {
                            fifo += 1;
                            lost_upto = lost_upto.max(sq);
                        } else {
                            tail += 1;
                            if self.cfg.hold_tail_losses {
                                // Maybe still queued here: it keeps its place in the window,
                                // and says nothing of the packets handed over before it.
                                x.tail_held.push((p, sq, at));
                            } else {
                                lost_upto = lost_upto.max(sq);
                            }
                        }
                        if sq < self.arrived_seq {
                            x.lost_known.set(p);
                        }
                        continue;
                    }
                    kept += 1;
                    if !progress {
                        // Nothing arrived since the last BACK: ask again when the oldest
                        // packet in flight is due, not at once.
                        let t = (at + age).max(x.progress_at + age);
                        x.not_before = Some(x.not_before.map_or(t, |u| u.min(t)));
                    }
                }
                self.left_seq = self.left_seq.max(lost_upto);
                if tail > 0 && duplicates == 0 && self.tail_ext > 0 {
                    // Tail losses without duplicates: after enough of them the loss age
                    // returns to twice the delivery delay.
                    self.tail_clean += 1;
                    if self.tail_clean >= TAIL_EXT_RESET_AFTER {
                        self.tail_ext = 0;
                        self.tail_clean = 0;
                    }
                }
                for (k, v) in [
                    ("lost_after_newer", fifo),
                    ("lost_tail", tail),
                    ("kept_in_flight", kept),
                ] {
                    if v > 0 {
                        *self.stats.extra.entry(k).or_insert(0) += v;
                    }
                }
            } else {
                x.sent_round.clear();
            }
        }
        self.expire_tail_held(now);
        self.pump_flow(ctx, key);
    }

    fn on_e2e(&mut self, ctx: &mut Ctx<'_>, h: &HopHeader, cum: u32) {
        let now = ctx.now;
        let key = FlowKey {
            src: h.src,
            id: h.flow_id,
        };
        let fin = h.flags & FLAG_FIN != 0;
        let n = h.block_num;
        let Some(f) = self.flows.get_mut(&key) else {
            // Still pass it on toward the source.
            if key.src != ctx.local {
                self.forward_e2e(ctx, h, cum);
            }
            return;
        };
        f.last_activity = now;
        // Round-trip time of the block (§3.2: the most recent block RTT is the timeout).
        if let Some(s) = f.source.as_mut() {
            s.last_progress = now;
            if let Some(b) = f.blocks.get(&n) {
                if b.vtx_count == 0 {
                    if let Some(t0) = b.first_sent {
                        s.rto = (now - t0).max(self.cfg.bsyn_timeout);
                    }
                }
            }
        }
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
        if let Some(s) = f.source.as_mut() {
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
                self.remove_flow(key);
                self.stats.flows = self.flows.len() as u64;
            } else {
                self.pump_flow(ctx, key);
            }
        } else {
            if fin {
                f.finished = true;
                f.e2e_fin = true;
            }
            f.e2e_cum = f.e2e_cum.max(cum);
            self.forward_e2e(ctx, h, cum);
            self.service_waiting(ctx);
            self.pump_flow(ctx, key);
        }
    }

    fn forward_e2e(&mut self, ctx: &mut Ctx<'_>, h: &HopHeader, cum: u32) {
        if let Some(nh) = ctx.routing.next_hop(h.src) {
            let msg = HopMessage {
                header: *h,
                body: HopBody::E2eBack { cum_blocks: cum },
            };
            self.push_ctrl(nh, &msg);
        }
    }

    fn on_fin(&mut self, ctx: &mut Ctx<'_>, h: &HopHeader, total: u64) {
        let key = FlowKey {
            src: h.src,
            id: h.flow_id,
        };
        let known = self.flows.contains_key(&key);
        self.remove_flow(key);
        self.stats.flows = self.flows.len() as u64;
        if h.dst != ctx.local && known {
            if let Some(nh) = ctx.routing.next_hop(h.dst) {
                let msg = HopMessage {
                    header: *h,
                    body: HopBody::Fin { total_bytes: total },
                };
                self.push_ctrl(nh, &msg);
            }
        }
    }

    /// Ack withholding: the sender of block `n` asks for another round of its turn, having
    /// sent the packets up to `expect`. A turn in which it sent more than
    /// `withhold_turn_sends` blocks' worth, while another sender waits, ends here: the next
    /// sender is served, and this one's BSYN is withheld like any other (its partial block
    /// stays).
    fn end_long_turn(
        &mut self,
        ctx: &mut Ctx<'_>,
        key: FlowKey,
        n: u32,
        from: NodeId,
        geom: BlockGeom,
        expect: u16,
    ) {
        let budget = self.cfg.withhold_turn_sends;
        if !self.cfg.ack_withholding || budget == 0 {
            return;
        }
        let Some(a) = self.admitted.get_mut(&(key, n)) else {
            return;
        };
        // Several BSYNs of one round (a repeat, an early one) count what is new once.
        a.sent = a
            .sent
            .saturating_add(u32::from(expect).saturating_sub(a.base));
        a.base = a.base.max(u32::from(expect));
        let spent = u64::from(a.sent) > u64::from(budget) * u64::from(geom.packets());
        let others = self
            .waiting
            .iter()
            .any(|w| w.from != from && w.reason == Withhold::AckWithholding);
        if !spent || !others {
            return;
        }
        let turn = *a;
        self.admitted.remove(&(key, n));
        let holder = self.last_holder.replace(from);
        self.service_waiting(ctx);
        if self.admitted.is_empty() {
            // Nobody could take the turn (their blocks wait for room): keep serving this
            // sender, for another turn.
            self.last_holder = holder;
            self.admitted.insert((key, n), Admitted { sent: 0, ..turn });
        } else {
            self.extra("turns_ended");
        }
    }

    /// Answer withheld BSYNs whose reason cleared: smallest block first (§3.6), then the
    /// senders other than the one just served, then in the order they first asked (§3.5).
    fn service_waiting(&mut self, ctx: &mut Ctx<'_>) {
        if self.waiting.is_empty() {
            return;
        }
        let mut list = std::mem::take(&mut self.waiting);
        let last = self.last_holder;
        list.sort_by_key(|w| (w.geom.block_len, Some(w.from) == last, w.since));
        let mut keep = Vec::new();
        for w in list {
            // Evaluate against the remaining waiters only.
            self.waiting = keep.clone();
            if self
                .may_admit(w.key, w.block, w.from, w.geom, w.flags & !FLAG_MICRO)
                .is_ok()
            {
                let h = Self::header(w.key, w.dst, w.block, w.flags & !FLAG_MICRO, w.ttl);
                self.extra("turns_given");
                self.on_bsyn(ctx, w.from, &h, w.offset, w.geom, 0, 0, &[], true);
                let k = w.key;
                self.pump_flow(ctx, k);
            } else {
                keep.push(w);
            }
        }
        self.waiting = keep;
    }

    // ----- timers -----

    fn housekeeping(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        // Silent senders release ack withholding.
        let silence = self.cfg.withhold_timeout;
        let before = self.admitted.len();
        self.admitted.retain(|_, a| a.last_heard + silence > now);
        for _ in self.admitted.len()..before {
            self.extra("released_silent");
        }
        // Withheld BSYNs are refreshed by the sender's retries: those of a sender told to
        // wait come every `wait_hold` (plus a quarter of jitter), so an entry outlives two
        // of them lost.
        let mut stale = self.cfg.bsyn_max_backoff * 3;
        if self.cfg.wait_notice {
            stale = stale.max(self.cfg.wait_hold * 3);
        }
        self.waiting.retain(|w| w.at + stale > now);
        if self.admitted.len() != before {
            self.service_waiting(ctx);
        }
        let idle = self.cfg.flow_idle_timeout;
        let expiry = self.cfg.custody_expiry;
        let give_up = self.cfg.give_up_after;
        let dest_idle = self.cfg.unfinished_flow_idle_timeout();
        let mut remove = Vec::new();
        let mut failed = Vec::new();
        let mut expired = Vec::new();
        for (k, f) in &self.flows {
            if let Some(s) = &f.source {
                // Only a source with work outstanding can fail; one waiting for its
                // application is idle, not stuck.
                let outstanding = !f.blocks.is_empty() || s.pending_bytes > 0 || s.finish;
                if outstanding && s.last_progress + give_up <= now {
                    failed.push((
                        *k,
                        if s.had_route {
                            FailReason::Timeout
                        } else {
                            FailReason::NoRoute
                        },
                    ));
                }
                continue;
            }
            for (n, b) in &f.blocks {
                if b.custody && !b.moved && b.custody_since + expiry <= now {
                    expired.push((*k, *n));
                }
            }
            let limit = if f.dest.as_ref().is_some_and(|d| !d.finished) {
                dest_idle
            } else {
                idle
            };
            if f.last_activity + limit <= now && !f.has_custody() {
                remove.push(*k);
            }
        }
        for (k, n) in expired {
            self.extra("custody_expired");
            self.drop_block(k, n);
        }
        for k in remove {
            self.extra("flows_reclaimed");
            self.remove_flow(k);
        }
        for (k, reason) in failed {
            self.abort_flow(ctx, k);
            self.events.push_back(Event::SendFailed { flow: k, reason });
        }
        self.stats.flows = self.flows.len() as u64;
    }

    fn abort_flow(&mut self, ctx: &mut Ctx<'_>, key: FlowKey) {
        if let Some(f) = self.flows.get(&key) {
            let dst = f.dst;
            let total = f.source.as_ref().map(|s| s.next_offset).unwrap_or(0);
            let msg = HopMessage {
                header: Self::header(key, dst, 0, FLAG_ABORT, 0),
                body: HopBody::Fin { total_bytes: total },
            };
            if let Some(nh) = ctx.routing.next_hop(dst) {
                self.push_ctrl(nh, &msg);
            }
        }
        self.remove_flow(key);
        self.stats.flows = self.flows.len() as u64;
    }

    fn refresh_timer(&mut self, now: Instant) {
        let mut t: Option<Instant> = None;
        let mut min = |x: Instant| {
            t = Some(t.map_or(x, |y: Instant| y.min(x)));
        };
        for f in self.flows.values() {
            for x in f.outs.values() {
                match x.state {
                    OutState::AwaitBack { deadline } => min(deadline),
                    OutState::NeedBsyn => min(now + self.cfg.bsyn_timeout),
                    OutState::Sending => {
                        if let Some(t) = x.not_before.filter(|t| *t > now) {
                            min(t);
                        }
                    }
                }
                // A held tail loss leaves the window at the latest after the queue's lifetime.
                if let Some(at) = x.tail_held.iter().map(|&(_, _, at)| at).min() {
                    min((at + self.cfg.link_queue_lifetime).max(now));
                }
            }
            for (_, due, _) in f.deferred.values() {
                min(*due);
            }
            if f.source.is_some() {
                for b in f.blocks.values() {
                    if let Some(d) = b.vtx_deadline {
                        if self.cfg.virtual_retransmission {
                            min(d);
                        }
                    }
                }
            }
        }
        if self.flows.is_empty() && self.waiting.is_empty() && self.admitted.is_empty() {
            self.housekeeping_at = None;
        } else {
            let h = match self.housekeeping_at {
                Some(h) if h > now => h,
                _ => now + HOUSEKEEPING_INTERVAL,
            };
            self.housekeeping_at = Some(h);
            min(h);
        }
        self.timer = t;
    }

    /// Next data packet to send: round robin over flows, one txop per flow per turn (§3.6).
    fn next_data(&mut self, ctx: &mut Ctx<'_>) -> Option<Outgoing> {
        let full = self.window_full();
        if full && !self.cfg.txop_past_full_window {
            return None;
        }
        let none = Bitmap::new(0);
        let mid_round = self.mid_round();
        let mut tries = self.rr.len();
        while tries > 0 {
            let &key = self.rr.front()?;
            let txop = self.txop_pkts;
            let pipelining = self.cfg.pipelining;
            let half = self.early_bsyn_at();
            let early = half > 0;
            let mut produced = None;
            let mut exhausted = true;
            let mut ask = false;
            let mut behind_round = false;
            if let Some(f) = self.flows.get_mut(&key) {
                let dst = f.dst;
                for (n, x) in f.outs.iter_mut() {
                    // With early BSYNs a transfer keeps sending while its first BSYN of the
                    // round is answered; not after a BSYN timeout (the next hop may be gone),
                    // not before the next hop has answered for the block at all (it may be
                    // serving another sender, §3.5), and not once it said to wait.
                    let sending = x.state == OutState::Sending
                        || (early
                            && x.attempts == 1
                            && !x.told_wait
                            && x.ever_sent.count() > 0
                            && matches!(x.state, OutState::AwaitBack { .. }));
                    if !sending || x.micro {
                        continue;
                    }
                    // A full window still takes packets from a transfer with less than a
                    // txop in it, up to a txop (`txop_past_full_window`).
                    if full
                        && (x.sent_round.count_in_not(&x.peer, &none) as usize)
                            >= self.txop_pkts as usize
                    {
                        continue;
                    }
                    // Another block's round to this next hop goes first (`round_per_next_hop`).
                    if mid_round.get(&x.next_hop).is_some_and(|o| *o != (key, *n)) {
                        behind_round = true;
                        continue;
                    }
                    let Some(b) = f.blocks.get(n) else { continue };
                    let left = b.have.count_in_not(&x.peer, &x.sent_round);
                    if left == 0 {
                        continue;
                    }
                    // A turn starts only with a full txop of new packets, unless the block
                    // is complete here (pipelining threshold, §3.1).
                    if self.turn_left == 0 && left < txop && !b.complete() && pipelining {
                        continue;
                    }
                    let Some(p) = b
                        .have
                        .next_in_not(&x.peer, &x.sent_round, x.cursor)
                        .or_else(|| b.have.next_in_not(&x.peer, &x.sent_round, 0))
                    else {
                        continue;
                    };
                    x.cursor = p + 1;
                    x.sent_round.set(p);
                    x.sent_since_bsyn = x.sent_since_bsyn.saturating_add(1);
                    ask =
                        early && x.state == OutState::Sending && x.sent_since_bsyn as usize == half;
                    self.link_seq += 1;
                    x.sent_seq[p as usize] = self.link_seq;
                    x.sent_at[p as usize] = ctx.now;
                    if !x.ever_sent.set(p) {
                        self.stats.data_retransmissions += 1;
                        // Ambiguous only while an earlier copy may still arrive.
                        if x.lost_known.get(p) {
                            x.resent.unset(p);
                            x.live_seq[p as usize] = self.link_seq;
                        } else {
                            x.resent.set(p);
                        }
                    } else {
                        x.live_seq[p as usize] = self.link_seq;
                    }
                    x.lost_known.unset(p);
                    let mut flags = if b.fin { FLAG_FIN } else { 0 };
                    if x.vtx {
                        flags |= FLAG_VTX;
                    }
                    let msg = HopMessage {
                        header: Self::header(key, dst, *n, flags, 0),
                        body: HopBody::Data {
                            offset: b.offset,
                            geom: b.geom,
                            packet_num: p as u16,
                            payload: b.packet(p),
                        },
                    };
                    let mut body = Vec::with_capacity(msg.encoded_len());
                    if msg.emit(&mut body).is_ok() {
                        produced = Some(Outgoing {
                            next_hop: x.next_hop,
                            class: Class::Data,
                            body,
                        });
                    }
                    exhausted = left <= 1;
                    break;
                }
            }
            if let Some(out) = produced {
                bump(&mut self.stats.sent_by_type, "data");
                if self.turn_left == 0 {
                    self.turn_left = txop;
                }
                self.turn_left -= 1;
                if self.turn_left == 0 || exhausted {
                    self.turn_left = 0;
                    self.rr.pop_front();
                    self.rr.push_back(key);
                }
                if exhausted || ask {
                    // The round is over (or half a window went out, `early_bsyn`): the next
                    // BSYN asks what is still missing.
                    self.pump_flow(ctx, key);
                    self.refresh_timer(ctx.now);
                }
                if self.window_full() {
                    // The transfers with packets in the window ask for BACKs to open it.
                    let keys: Vec<FlowKey> = self.flows.keys().copied().collect();
                    for k in keys {
                        self.pump_flow(ctx, k);
                    }
                    self.refresh_timer(ctx.now);
                }
                return Some(out);
            }
            self.turn_left = 0;
            self.rr.pop_front();
            if behind_round {
                // It keeps its place in the rotation: its round starts in turn.
                self.rr.push_back(key);
            }
            tries -= 1;
        }
        None
    }
}

impl Transport for HopTransport {
    fn id(&self) -> TransportId {
        TransportId::Hop
    }

    fn custody_persisted(&mut self, ctx: &mut Ctx<'_>, flow: FlowKey, block: u32, ok: bool) {
        self.tick(ctx.now);
        self.on_custody_persisted(ctx, flow, block, ok);
    }

    fn open(&mut self, ctx: &mut Ctx<'_>, key: FlowKey, dst: NodeId) -> Result<(), AppError> {
        self.tick(ctx.now);
        if dst == ctx.local {
            return Err(AppError::SelfDestination);
        }
        if self.flows.len() >= self.cfg.max_flows {
            return Err(AppError::TooManyFlows(self.cfg.max_flows));
        }
        let mut f = Flow::new(dst, ctx.now);
        f.source = Some(SourceState {
            rto: self.cfg.vtx_initial_timeout,
            last_progress: ctx.now,
            had_route: ctx.routing.next_hop(dst).is_some(),
            ..SourceState::default()
        });
        self.flows.insert(key, f);
        self.stats.flows = self.flows.len() as u64;
        self.refresh_timer(ctx.now);
        Ok(())
    }

    fn send(
        &mut self,
        ctx: &mut Ctx<'_>,
        flow: FlowKey,
        mut data: Bytes,
    ) -> Result<usize, AppError> {
        self.tick(ctx.now);
        let limit = self.cfg.source_buffer_bytes.max(self.cfg.block_bytes());
        let f = self
            .flows
            .get_mut(&flow)
            .ok_or(AppError::UnknownFlow(flow))?;
        let s = f.source.as_mut().ok_or(AppError::UnknownFlow(flow))?;
        if s.finish {
            return Err(AppError::FlowFinished(flow));
        }
        let room = limit.saturating_sub(s.pending_bytes);
        let take = room.min(data.len());
        if take < data.len() {
            s.blocked = true;
        }
        if take > 0 {
            s.pending.push_back(data.split_to(take));
            s.pending_bytes += take;
            self.cache_bytes += take as u64;
            self.note_cache();
            // Blocks are cut when the link asks for data (poll_transmit), so bytes and a
            // finish offered together travel in one block.
            if !self.to_form.contains(&flow) {
                self.to_form.push(flow);
            }
        }
        let _ = ctx;
        Ok(take)
    }

    fn finish(&mut self, ctx: &mut Ctx<'_>, flow: FlowKey) -> Result<(), AppError> {
        self.tick(ctx.now);
        let f = self
            .flows
            .get_mut(&flow)
            .ok_or(AppError::UnknownFlow(flow))?;
        let s = f.source.as_mut().ok_or(AppError::UnknownFlow(flow))?;
        if s.finish {
            return Err(AppError::FlowFinished(flow));
        }
        s.finish = true;
        if !self.to_form.contains(&flow) {
            self.to_form.push(flow);
        }
        let _ = ctx;
        Ok(())
    }

    fn abort(&mut self, ctx: &mut Ctx<'_>, flow: FlowKey) -> Result<(), AppError> {
        self.tick(ctx.now);
        if !self.flows.get(&flow).is_some_and(|f| f.source.is_some()) {
            return Err(AppError::UnknownFlow(flow));
        }
        self.abort_flow(ctx, flow);
        self.refresh_timer(ctx.now);
        Ok(())
    }

    fn handle(&mut self, ctx: &mut Ctx<'_>, rx: Received<'_>) -> Result<(), hop_wire::Error> {
        self.tick(ctx.now);
        let msg = HopMessage::parse(rx.body)?;
        let h = msg.header;
        if !rx.overheard {
            bump(
                &mut self.stats.received_by_type,
                name_of(msg.msg_type(), h.flags),
            );
        }
        match msg.body {
            HopBody::Data {
                offset,
                geom,
                packet_num,
                payload,
            } => self.on_data(ctx, &rx, &h, offset, geom, packet_num, payload),
            _ if rx.overheard => {}
            HopBody::Bsyn {
                offset,
                geom,
                packet_num,
                expect,
                payload,
            } => {
                self.on_bsyn(
                    ctx,
                    rx.link_src,
                    &h,
                    offset,
                    geom,
                    packet_num,
                    expect,
                    payload,
                    false,
                );
                let key = FlowKey {
                    src: h.src,
                    id: h.flow_id,
                };
                self.pump_flow(ctx, key);
            }
            HopBody::Back {
                packets,
                duplicates,
                bitmap,
                ..
            } => self.on_back(ctx, rx.link_src, &h, packets, duplicates, bitmap),
            HopBody::E2eBack { cum_blocks } => self.on_e2e(ctx, &h, cum_blocks),
            HopBody::Fin { total_bytes } => self.on_fin(ctx, &h, total_bytes),
        }
        if matches!(msg.body, HopBody::Data { .. }) && !rx.overheard {
            let key = FlowKey {
                src: h.src,
                id: h.flow_id,
            };
            self.pump_flow(ctx, key);
        }
        self.refresh_timer(ctx.now);
        Ok(())
    }

    fn handle_timeout(&mut self, ctx: &mut Ctx<'_>) {
        self.tick(ctx.now);
        let now = ctx.now;
        // BSYN retransmissions (§3.1): an unanswered BSYN is sent again with backoff. Only the
        // BSYN is repeated: the data it followed is not judged lost for want of an answer
        // (the BSYN or its BACK may be what was lost); the next BACK's bitmap says what is
        // missing (§3), and the BACK's loss rules decide what is sent again.
        for f in self.flows.values_mut() {
            for x in f.outs.values_mut() {
                if let OutState::AwaitBack { deadline } = x.state {
                    if deadline <= now {
                        x.state = OutState::NeedBsyn;
                    }
                }
            }
        }
        if self.housekeeping_at.is_some_and(|h| h <= now) {
            self.housekeeping_at = None;
            self.housekeeping(ctx);
        }
        self.expire_tail_held(now);
        // Deliveries the store refused are retried (room may have been freed).
        let blocked: Vec<FlowKey> = self
            .flows
            .iter()
            .filter(|(_, f)| f.dest.as_ref().is_some_and(|d| d.blocked))
            .map(|(k, _)| *k)
            .collect();
        for k in blocked {
            self.deliver(ctx, k);
        }
        let keys: Vec<FlowKey> = self.flows.keys().copied().collect();
        for k in keys {
            self.pump_flow(ctx, k);
        }
        self.service_waiting(ctx);
        self.refresh_timer(now);
    }

    fn poll_transmit(&mut self, ctx: &mut Ctx<'_>) -> Option<Outgoing> {
        self.tick(ctx.now);
        if !self.to_form.is_empty() {
            for key in std::mem::take(&mut self.to_form) {
                self.pump_flow(ctx, key);
            }
            self.refresh_timer(ctx.now);
        }
        if let Some(out) = self.ctrl.pop_front() {
            return Some(out);
        }
        let out = self.next_data(ctx);
        if out.is_none() && !self.ctrl.is_empty() {
            return self.ctrl.pop_front();
        }
        out
    }

    fn poll_control(&mut self, _ctx: &mut Ctx<'_>) -> Option<Outgoing> {
        self.ctrl.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.timer
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn received(&self) -> Vec<(FlowKey, u64)> {
        self.flows
            .iter()
            .filter_map(|(k, f)| {
                let d = f.dest.as_ref()?;
                let held: u64 = f
                    .blocks
                    .range(d.next_deliver..)
                    .map(|(_, b)| b.held_bytes())
                    .sum();
                Some((*k, d.delivered + held))
            })
            .collect()
    }

    fn stats(&self) -> TransportStats {
        let mut s = self.stats.clone();
        s.flows = self.flows.len() as u64;
        s.cache_bytes = self.cache_bytes;
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        for (name, d) in SEND_STATE_NAMES.iter().zip(self.clock.spent) {
            s.extra.insert(name, ms(d));
        }
        s.extra.insert(SEND_IDLE_NAME, ms(self.clock.idle));
        for (name, d) in WITHHOLD_NAMES.iter().zip(self.clock.withholding) {
            s.extra.insert(name, ms(d));
        }
        s
    }
}

#[cfg(test)]
mod tests;
