//! Hop parameters: one [`HopConfig`], read by hopd, the simulator and the lab alike (the
//! `[hop]` table of a hopd configuration, `[transports.hop]` of a simulator scenario), in one
//! convention: sizes in bytes or packets, durations as durations (`"200ms"`, `"60s"`, `"1h"`).
//!
//! Two presets: [`HopConfig::paper`] is the Hop paper's configuration (§4.1 MAC parameters,
//! §4.2 parameters, every mechanism of §3 on, none of this implementation's extensions), and
//! [`HopConfig::default`] is what ships: the paper plus the extensions that pay on the links
//! this implementation runs over (docs/design/hop.md says what each one is for and what it
//! was measured to give). Values the paper leaves open are chosen here and justified next to
//! each constant.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Maximum block size: 1 MiB (§4.2 "we set the default maximum block size to 1MB").
pub const DEFAULT_MAX_BLOCK_BYTES: usize = 1 << 20;

/// Payload bytes per data packet. A DATA datagram is envelope header (16) + Hop header (20) +
/// DATA fields (18) + payload + crc (4) + optional auth trailer (24) = 82 + payload bytes; a
/// micro-block BSYN is 89 + payload. With 1380 bytes the largest datagram is 1469 bytes, within
/// the 1472-byte UDP payload of a 1500-byte IP datagram (§5: "same default packet size as TCP
/// (1.5KB)").
pub const DEFAULT_PACKET_PAYLOAD_BYTES: usize = 1380;

/// Bytes per txop: the 802.11e background-queue txop of 8160 µs, "roughly 8KB of data" at
/// 11 Mb/s (§4.1). Rounded up to whole packets (6 packets of 1380 bytes).
pub const DEFAULT_TXOP_BYTES: usize = 8192;

/// BSYN batch threshold below which a block is a micro-block sent on the BSYN itself (§4.2:
/// 16KB).
pub const DEFAULT_MICRO_BLOCK_THRESHOLD: usize = 16 * 1024;

/// A flow's first block under the block ramp (not in the paper): twice the micro-block
/// threshold, so that it takes a turn like any block (§3.5, §3.6) but crosses a busy relay in
/// a thirty-second of a whole block's time. Where the first hop reports no shared turns the
/// block is cut again whole before any of it leaves (`ramp_while_shared`).
pub const DEFAULT_INITIAL_BLOCK_BYTES: usize = 32 * 1024;

/// A flow's opening block under the block ramp (not in the paper): one packet, a micro-block
/// (§3.6) that rides on its BSYN and no turn (§3.5) holds back, so that every flow's first
/// bytes cross a busy mesh within seconds; the ramp goes on from
/// [`DEFAULT_INITIAL_BLOCK_BYTES`]. On the lab's lossy §5.3 mesh 28-30 of 30 flows started in
/// four draws instead of 11-19, with as many bytes
/// (docs/notebook/2026-12-04-flows-opened-by-a-micro-block.md).
pub const DEFAULT_OPENING_BLOCK_PACKETS: usize = 1;

/// Backpressure limit H, complete blocks per flow not yet moved downstream (§3.3, §4.2: 1).
pub const DEFAULT_BACKPRESSURE_LIMIT: usize = 1;

/// Initial virtual retransmission timeout (§4.2: 60 seconds), afterwards reset to the most
/// recent block round-trip time.
pub const DEFAULT_VTX_INITIAL_TIMEOUT: Duration = Duration::from_secs(60);

/// BSYNs the destination's last hop sends at most to ask for the end-to-end BACK that
/// finishes a flow (fin_probe.rs): 1, 2, 4 and 8 s after the destination took the last
/// block, 15 s of asking, a quarter of the source's first virtual retransmission timeout.
/// Not in the paper.
pub const DEFAULT_FIN_PROBES: u8 = 4;

/// The wait before the first of those BSYNs: longer than an 802.11 link takes to deliver
/// a control frame through its retries (up to tens of ms each behind a hidden sender), and
/// than a destination takes to write a block durably on slow flash, so that a BACK that is
/// late, not lost, is rarely asked for; short next to the 60 s the loss costs without it.
pub const DEFAULT_FIN_PROBE_AFTER: Duration = Duration::from_secs(1);

/// TTL of a virtual retransmission (§4.2: 50 hops).
pub const DEFAULT_VTX_TTL: u8 = 50;

/// Per-hop BSYN retransmission timer. BSYN and BACK are control datagrams sent with link-layer
/// ARQ at top priority (§3.1, §4.1), so a BACK normally returns within one txop of the
/// receiver's current burst (8.2 ms at 11 Mb/s, §4.1) plus queueing; 200 ms covers the
/// receiver's BACK deferral (below) and a full interface queue of data ahead of it, while a
/// lost BSYN/BACK costs at most 200 ms. Not in the paper.
pub const DEFAULT_BSYN_TIMEOUT: Duration = Duration::from_millis(200);

/// Ceiling of the BSYN retransmission backoff (repeats grow linearly with the adaptive timer,
/// double with the fixed one, see `adaptive_bsyn_timeout`). Bounds how long
/// a block waits after a partitioned next hop comes back (§3.4) while keeping an unreachable
/// next hop to one control datagram per 2 s. Not in the paper.
pub const DEFAULT_BSYN_MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Floor of the adaptive BSYN timer (`adaptive_bsyn_timeout`): several 802.11b txop bursts
/// of the next hop (8.2 ms each at 11 Mb/s, §4.1) plus its BACK deferral (`back_quiet`), so
/// that a BACK deferred while data still arrives is not asked for again. In the simulator a
/// 20 ms floor made BSYNs overtake queued data and re-asked BACKs declare it lost (a deep
/// queue chain retransmitted 1134 of 1450 packets; 33 with 50 ms). Not in the paper.
pub const DEFAULT_BSYN_MIN_TIMEOUT: Duration = Duration::from_millis(50);

/// A BSYN announces how many packets its sender handed to the link (`expect`); a receiver
/// holding fewer answers only once they are here or after the data has paused this long: the
/// BSYN is a control datagram and overtakes data still queued at the sender, and answering at
/// once would report packets in flight as missing. About seven 1500-byte frames at 11 Mb/s.
/// Not in the paper.
pub const DEFAULT_BACK_QUIET: Duration = Duration::from_millis(10);

/// Data packets a node hands to its link and does not yet know to have left the link's
/// queue (reported by a BACK, or judged lost), summed over all its transfers. Not in the
/// paper: there Hop sits on the MAC and the driver's queue pushes back (§4.1, the Click/
/// MadWifi implementation); a user-space daemon writing datagrams into a socket or tap
/// cannot see that queue, and an 802.11 MAC queue (ns-3's WifiMacQueue: 500 frames per
/// access category, 500 ms delay limit) silently drops what overflows while the BSYN, sent
/// on the voice queue (§3.6), overtakes up to the whole queue of data. The bound must cover
/// the control round trip (one BSYN and one BACK on the voice queue, a few ms) at the link's
/// rate so the link does not idle between rounds, and keep the queue far below such a
/// queue's capacity and delay limit: 32 packets are about 5 txops of §4.1 (44 KB, ~80 ms
/// of a single 802.11b hop's ~5 Mb/s), so queue overflow needs a link slower than 64
/// packets per second.
pub const DEFAULT_LINK_WINDOW_PACKETS: usize = 32;

/// Ceiling of the link window when the link is fast (see [`DEFAULT_LINK_QUEUE_TARGET`]): half
/// of an 802.11 MAC queue of 500 frames per access category (ns-3's `WifiMacQueue`, the lab's
/// medium), so that even a wrong rate estimate cannot overflow such a queue. Not in the paper.
pub const DEFAULT_LINK_WINDOW_MAX_PACKETS: usize = 256;

/// The link window grows above `link_window_packets` to the packets the node's links
/// delivered in this much time (rate measured from BACKs, see `link_window_max_packets`):
/// on a fast link (Ethernet, veth, 802.11g/n) 32 packets drain within one control round and
/// the link idles between rounds, while on 802.11b (at most ~550 packets/s, §5) the window
/// stays at its floor. 50 ms of queued data is a tenth of an 802.11 MAC queue's delay limit
/// (500 ms in ns-3's `WifiMacQueue`). Not in the paper.
pub const DEFAULT_LINK_QUEUE_TARGET: Duration = Duration::from_millis(50);

/// How long a data packet may sit in the node's link queue: the tail rule (see `queue_aware`)
/// never waits longer than this for a packet, however much duplicate feedback grew its loss
/// age, since an 802.11 MAC queue drops what waited longer (ns-3's `WifiMacQueue`, the lab's
/// medium: `MaxDelay` 500 ms; Linux's mac80211 drops far sooner under its CoDel). Not in the
/// paper.
pub const DEFAULT_LINK_QUEUE_LIFETIME: Duration = Duration::from_millis(500);

/// BACKs with tail losses and no duplicate data after which the tail rule's loss age returns
/// to twice the delivery delay (`duplicate_feedback`): RACK resets its reordering window
/// after 16 loss recoveries without a D-SACK (RFC 8985 §6.2 step 4). Not in the paper.
pub(crate) const TAIL_EXT_RESET_AFTER: u32 = 16;

/// Ack withholding releases a receiver from its current sender after this long without hearing
/// from it (§3.5 leaves it open; the sender "goes silent"): five BSYN timeouts.
pub const DEFAULT_WITHHOLD_TIMEOUT: Duration = Duration::from_secs(1);

/// A next hop silent this long is deemed unreachable and probed (`neighbour_silence`): three
/// times `bsyn_max_backoff`, so a next hop that answers a BSYN in three is never probed, and
/// one that is down costs its neighbours one BSYN per probe interval instead of one per
/// transfer per `bsyn_max_backoff`. Not in the paper.
pub const DEFAULT_NEIGHBOUR_SILENCE: Duration = Duration::from_secs(6);

/// First interval between probes of a silent next hop (`probe_interval`): at most one probe
/// per second, doubling up to `bsyn_max_backoff`. Not in the paper.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Bytes of blocks a node keeps (custody, in-progress and cache). §4.2 keeps every block in
/// memory; this bounds it. Cached (non-custody) blocks are evicted least recently used first.
pub const DEFAULT_CACHE_LIMIT_BYTES: u64 = 64 << 20;

/// Flows with state on one node; further flows are refused so bogus flows cannot exhaust
/// memory.
pub const DEFAULT_MAX_FLOWS: usize = 1024;

/// A node's own flows sending at once; flows opened beyond it wait (admission.rs). A quarter
/// of [`DEFAULT_MAX_FLOWS`]: a node busy with its own flows still has room to relay.
pub const DEFAULT_MAX_SENDING_FLOWS: usize = 256;

/// A node's own flows sending at once to one destination (admission.rs). A flow beyond it
/// waits until one of them ends, so an application that keeps more flows than this open
/// without end to one destination starves the rest. 10,000 small flows (1 B to 16 KB) to a
/// destination two hops away finish in 333 s with 4, 419 s with 32, 604 s with 64 (BSYNs
/// withheld by the relay and repeated, docs/notebook/2026-11-28-admission-and-scale.md).
pub const DEFAULT_MAX_SENDING_FLOWS_PER_DESTINATION: usize = 32;

/// A node's own flows waiting to start; an open beyond it is refused (a waiting flow costs
/// about 100 bytes plus the bytes the application handed it, within the cache budget).
pub const DEFAULT_MAX_WAITING_FLOWS: usize = 1 << 20;

/// Flow state on a relay or destination without activity for this long and without blocks in
/// custody is reclaimed. Long enough to outlast the partitions of §5.7 between two blocks.
pub const DEFAULT_FLOW_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// A block in custody that could not be moved downstream for this long expires (§3.2, case 3:
/// "a cached block eventually expires because no next-hop node is available for a long
/// duration"); the source recovers it by virtual retransmission.
pub const DEFAULT_CUSTODY_EXPIRY: Duration = Duration::from_secs(3600);

/// A source gives up a flow after this long without any progress (no BACK from its next hop
/// and no end-to-end BACK).
pub const DEFAULT_GIVE_UP_AFTER: Duration = Duration::from_secs(3600);

/// Interval of housekeeping (idle flows, silent senders, expired custody).
pub(crate) const HOUSEKEEPING_INTERVAL: Duration = Duration::from_millis(250);

/// Configuration of [`HopTransport`](super::HopTransport). Every mechanism of the paper can be
/// tuned or switched off for experiments. Fields left out of a configuration file keep the
/// value of the preset it names (see [`HopConfig::from_toml`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HopConfig {
    /// Largest block (§4.2). Smaller blocks are formed when less data is ready.
    pub max_block_bytes: usize,
    /// Payload bytes per packet (see [`DEFAULT_PACKET_PAYLOAD_BYTES`]).
    pub packet_payload_bytes: usize,
    /// Bytes per txop, the scheduler's quantum and the pipelining threshold (§3.1, §3.6).
    pub txop_bytes: usize,
    /// Blocks smaller than this ride on the BSYN (§3.6). 0 disables micro-blocks.
    pub micro_block_threshold: usize,
    /// A flow's first block holds at most this many bytes, each next one twice as many, up
    /// to `max_block_bytes` (docs/design/hop.md#block-ramp); a flow whose rest fits one block
    /// is cut whole. 0: every block as large as the data ready allows (the paper, §4.2).
    /// Not in the paper; see [`DEFAULT_INITIAL_BLOCK_BYTES`].
    pub initial_block_bytes: usize,
    /// Under the block ramp (`initial_block_bytes`), a flow's first block holds at most this
    /// many packets and block n ≥ 1 at most `initial_block_bytes` × 2^(n − 1). Below
    /// `micro_block_threshold` the first block is a micro-block (§3.6): its packets ride on
    /// its BSYNs and no turn holds it back (§3.5). 0: the first block is
    /// `initial_block_bytes`. Not in the paper; see [`DEFAULT_OPENING_BLOCK_PACKETS`].
    pub opening_block_packets: usize,
    /// With `initial_block_bytes`, blocks after a flow's first double only while its path
    /// reports turns shared with other flows (a BACK's `block_hint_kib`, shared_turns.rs);
    /// a flow alone on its path cuts whole blocks after its first, and a first block whose
    /// first hop answers its BSYN without reporting shared turns is cut again whole before
    /// any of it leaves. The ramp shortens the turns of a busy relay (§3.5) while a flow
    /// starts; a flow alone has no turns to shorten and would pay a round and a tail on
    /// every hop for every extra block. Not in the paper (docs/design/hop.md#block-ramp).
    pub ramp_while_shared: bool,
    /// A source cuts its flow's next block once every packet of the block in transfer has
    /// been sent once, so that the new block's packets use the air while the previous
    /// block's losses are repaired (at most two blocks of a flow in transfer at the source).
    /// Not in the paper, whose source transfers one block at a time (§3.1).
    pub overlap_block_tails: bool,
    /// Blocks paced by the flow's rate: a source sizes each next block to what its flow moved
    /// over its first hop in about this long (the last block's bytes over the time it took
    /// to be taken), between `initial_block_bytes` (or 1/16 of the block size when that is
    /// 0) and `max_block_bytes`. The first block is `initial_block_bytes` when set. A relay gives its upstreams turns of one block (§3.5)
    /// and takes one block per next hop at a time (§3.3), so with n flows through it every
    /// flow waits n blocks for its next one: sized to the flow's share, a block takes about
    /// this long wherever it waits, and so does every flow's turn. A flow alone on its path
    /// keeps whole blocks wherever the path moves a block within this time. 0: off (blocks
    /// as large as the data ready allows, §4.2). Not in the paper
    /// (docs/design/hop.md#blocks-paced-by-rate).
    #[serde(with = "humantime_serde")]
    pub block_time: Duration,
    /// Blocks sized to shared turns: a node that receives BSYNs of k > 1 flows asks their
    /// sources, in its BACKs, for blocks of at most `max_block_bytes` / k (at least 1/16 of
    /// it), and a relay passes on the smallest ask it hears from downstream; a source cuts
    /// no larger block than its flow's first hop asks for. A flow's first block, cut before
    /// any ask can have come, holds 1/16 of `max_block_bytes`; a flow asked for nothing cuts
    /// whole blocks after it. Off by default. Not in the paper
    /// (docs/design/hop.md#blocks-sized-to-shared-turns).
    pub shared_turn_blocks: bool,
    /// Control copies, for links without link-layer retries (Ethernet, tunnels, a driver
    /// that drops after the MAC): where 5 % or more of this node's BSYNs and BACKs are lost
    /// toward the neighbour it sends to (by the neighbour's report, or this node's count of
    /// the neighbour's), and until a few have crossed each way, each goes twice, back to back
    /// (three times from 17 %; a micro-block's BSYNs, which carry its packets, once). A block
    /// moves in BSYN/BACK rounds (§3.1) and each lost BSYN or BACK costs the sender a timer's
    /// wait with nothing sent:
    /// over a link that loses a share p of its datagrams about 2p of the rounds wait, with
    /// two copies about 2p². The paper's 802.11 MAC retries control frames (§4.1), so what a
    /// mesh still loses of them is collisions and dead neighbours, where copies add load (the
    /// simulator's 802.11 meshes moved 20-35 % less with them). `Auto`, the default, sends
    /// them where the link does not retry control frames, which the runtime knows and gives
    /// with [`HopConfig::for_link`] (hopd from its interface, the simulator from its medium);
    /// unresolved, `Auto` sends none, the paper's assumption. The numbers, the loss reports
    /// and the `echo` that tells a round's BACK from a late one are always on. Not in the
    /// paper (docs/design/hop.md#control-copies).
    pub control_copies: ControlCopies,
    /// Rounds behind their data: a sender that has learnt from its next hop's BACKs that its
    /// BSYNs reach it behind the data sent before them (16 rounds, each overtaken round
    /// owing 16 more) marks them `BEHIND`; the next hop answers at once instead of waiting
    /// for the data to pause (`back_quiet`), and the sender takes what the BACK lacks of the
    /// round as lost instead of waiting a loss age. On 802.11, where the BSYN travels in the
    /// voice queue and overtakes the data (§3.6), the BSYNs are seldom so marked. Not in the
    /// paper (docs/design/hop.md#rounds-behind-their-data).
    pub rounds_behind: bool,
    /// H: complete blocks per flow held and not yet moved downstream (§3.3).
    pub backpressure_limit: usize,
    /// Enable hop-by-hop backpressure (§3.3).
    pub backpressure: bool,
    /// H bounds, besides each flow's blocks (§3.3), the complete blocks a relay holds and has
    /// not moved for each next hop, over all flows. §3.3 bounds each flow alone, so a relay
    /// crossed by many flows to one next hop takes H blocks of each while that next hop takes
    /// one at a time: its upstream's data then fills the air the relay needs to move them,
    /// and the BACKs it waits for from downstream collide with that data
    /// (docs/design/hop.md#backpressure-per-next-hop). Off: per flow only (the paper). Not in
    /// the paper.
    pub next_hop_backpressure: bool,
    /// Turns (§3.5) go first to the blocks nearest their destination: a receiver serves the
    /// waiting blocks it is the destination of, then those whose next hop is their
    /// destination, then the others, each group in the order §3.5 gives. A block that leaves
    /// the mesh sooner frees the air and the relays' quotas it would hold on further hops;
    /// 2- and 3-hop flows beside a busy hub, which TCP serves and Hop's turns in order of
    /// asking hold behind blocks bound for the hub, get the air. It raises the mean and costs
    /// long flows their share (docs/design/hop.md#nearest-exit-first). Off (the default):
    /// the paper's order. Not in the paper.
    pub nearest_exit_first: bool,
    /// With `nearest_exit_first`, a block withheld this long takes its turn in the order
    /// asked, whatever its distance, so that no flow waits at a receiver much longer than
    /// this for blocks nearer their exit. Zero: never.
    #[serde(with = "humantime_serde")]
    pub nearest_exit_age: Duration,
    /// Enable ack withholding (§3.5).
    pub ack_withholding: bool,
    /// Silence after which ack withholding moves on to another sender.
    #[serde(with = "humantime_serde")]
    pub withhold_timeout: Duration,
    /// A receiver's turn (§3.5) whose block would need longer than this to complete, at the
    /// rate its packets have arrived since the turn began, goes to the senders waiting for it
    /// (judged after twice `withhold_timeout`). §3.5 ends a turn only when the block completes
    /// or its sender goes silent; a sender behind a link that loses most frames is never
    /// silent (its BSYNs cross with link ARQ) while its data barely moves, and every other
    /// sender waits. Zero (the default): the paper's turns. 30 s, issue 46's bound on how
    /// long a flow may go without a byte while its path is up, is the value measured. Not in
    /// the paper (docs/design/hop.md#turn-horizon).
    #[serde(with = "humantime_serde")]
    pub turn_horizon: Duration,
    /// Enable spatial pipelining (§3.1); otherwise a relay forwards only complete blocks.
    pub pipelining: bool,
    /// Cache packets overheard on a shared medium (§3.2).
    pub cache_overheard: bool,
    /// Enable end-to-end virtual retransmissions (§3.2).
    pub virtual_retransmission: bool,
    /// Initial virtual retransmission timeout (§4.2).
    #[serde(with = "humantime_serde")]
    pub vtx_initial_timeout: Duration,
    /// TTL of a virtual retransmission (§4.2).
    pub vtx_ttl: u8,
    /// The node before a flow's destination, once the destination took the flow's last
    /// block whole, asks it again (a BSYN for that block) when the end-to-end BACK that
    /// finishes the flow does not pass within `fin_probe_after`, then after twice as long
    /// each time, up to this many times (see [`DEFAULT_FIN_PROBES`]). That BACK is the one
    /// end-to-end BACK no later one covers; lost, it costs the source its virtual
    /// retransmission timeout (60 s for a one-block flow). Where control copies are on, every
    /// node that handed the last block whole asks its next hop the same way (each hop loses
    /// it on its own there), and each node sends it at least twice. 0: not asked (the
    /// paper).
    pub fin_probes: u8,
    /// See [`DEFAULT_FIN_PROBE_AFTER`].
    #[serde(with = "humantime_serde")]
    pub fin_probe_after: Duration,
    /// Per-hop BSYN retransmission timer.
    #[serde(with = "humantime_serde")]
    pub bsyn_timeout: Duration,
    /// Ceiling of the BSYN retransmission backoff.
    #[serde(with = "humantime_serde")]
    pub bsyn_max_backoff: Duration,
    /// The BSYN timer follows the measured BSYN-to-BACK round trip of each next hop (smoothed
    /// as TCP's RTO, RFC 6298 §2, sampled only from BSYNs answered at the first try, Karn's
    /// rule; until the first sample `bsyn_timeout` where the link retries control frames and
    /// `bsyn_min_timeout` where it does not; never below `bsyn_min_timeout`), and
    /// grows linearly per unanswered BSYN up to `bsyn_max_backoff`. A lost BSYN or BACK then
    /// costs about one round trip, which keeps Hop working on links that lose a large share
    /// of all frames, control included (§5.1.2: "operational until the loss rate is about
    /// 80%"). Off: the fixed `bsyn_timeout`, doubled per unanswered BSYN. Not in the paper,
    /// which gives no BSYN timer.
    pub adaptive_bsyn_timeout: bool,
    /// Floor of the adaptive BSYN timer.
    #[serde(with = "humantime_serde")]
    pub bsyn_min_timeout: Duration,
    /// BACK deferral while data for the block is still arriving.
    #[serde(with = "humantime_serde")]
    pub back_quiet: Duration,
    /// Packets missing in a BACK are retransmitted only when probably lost, not when
    /// probably still queued at this node: lost when a packet handed to the link after them
    /// arrived (the link's data queue is FIFO; RACK, RFC 8985 §6.2), or, when a BACK shows
    /// nothing new, when they are older than twice the measured delivery delay (the tail
    /// loss probe timeout, RFC 8985 §7.2). Off: every packet a BACK reports missing is sent
    /// again (the paper, §3.1).
    pub queue_aware: bool,
    /// With `queue_aware`: when a next hop reports data it received twice (the `duplicates`
    /// of a BACK), the tail rule waits one more delivery delay before giving up a packet,
    /// up to `link_queue_lifetime`, and returns to twice the delivery delay after
    /// [`TAIL_EXT_RESET_AFTER`] BACKs with tail losses and no duplicates (RACK's reordering
    /// window, RFC 8985 §6.2 step 4, grown by D-SACKs). A lossy link's tail losses are real
    /// and make no duplicates; a relay whose queue drains more slowly than the delivery
    /// delay it measured (the delay is sampled only when a round arrives at once) gives up
    /// packets that arrive after all, and their copies are the duplicates. Off: the loss
    /// age is always twice the delivery delay. Not in the paper.
    pub duplicate_feedback: bool,
    /// See [`DEFAULT_LINK_QUEUE_LIFETIME`].
    #[serde(with = "humantime_serde")]
    pub link_queue_lifetime: Duration,
    /// Bound on data packets handed to the link and not yet known to have left it (see
    /// [`DEFAULT_LINK_WINDOW_PACKETS`]); 0 = unbounded (the paper).
    pub link_window_packets: usize,
    /// Largest link window: the window grows from `link_window_packets` up to this to hold
    /// `link_queue_target` of the node's measured delivery rate (see
    /// [`DEFAULT_LINK_QUEUE_TARGET`]). Equal to `link_window_packets` (or below it): fixed.
    pub link_window_max_packets: usize,
    /// Time of delivery the link window may hold above its floor.
    #[serde(with = "humantime_serde")]
    pub link_queue_target: Duration,
    /// Rounds to a next hop carry more than a few packets when many flows share it (not in
    /// the paper, whose scheduler interleaves a txop of every flow, §3.6): at most one
    /// transfer per next hop is in the middle of a round (has handed packets of the round
    /// to the link and can send more), so flows sharing a next hop take turns by rounds
    /// while flows to different next hops still interleave by txops; a round ends at half
    /// the link window when another transfer waits for the same next hop; and a full window
    /// asks for a BACK only after the transfer has handed a txop (or half the window) to
    /// the link since its last BSYN, or a loss age after it. Interleaving many blocks to one
    /// next hop otherwise splits the link window among them, and every BSYN/BACK round
    /// carries a few packets (docs/design/hop.md#rounds-per-next-hop). Off: the paper's
    /// scheduler.
    pub round_per_next_hop: bool,
    /// A next hop that has answered nothing for this long since it was first asked is probed
    /// by one BSYN per `probe_interval` instead of one per transfer
    /// (docs/design/hop.md#dead-neighbours); zero: every transfer repeats its own BSYN (the
    /// paper). Not in the paper.
    #[serde(with = "humantime_serde")]
    pub neighbour_silence: Duration,
    /// The first interval between probes of a silent next hop; it doubles up to
    /// `bsyn_max_backoff`, so traffic resumes at most that long after the next hop returns.
    #[serde(with = "humantime_serde")]
    pub probe_interval: Duration,
    /// Bytes of blocks kept on a node.
    pub cache_limit_bytes: u64,
    /// Flows with state on a node.
    pub max_flows: usize,
    /// This node's own flows that send at once; the ones opened beyond it wait, first
    /// opened first started (not in the paper, which sends every open flow at once).
    pub max_sending_flows: usize,
    /// This node's own flows that send at once to one destination.
    pub max_sending_flows_per_destination: usize,
    /// After a flow of this node's own with less than a block's worth of bytes, the next one
    /// to the same destination waits until it ends, or this long at most, unless a long flow
    /// of the node's is sending there (admission.rs). A burst of small flows over an idle
    /// path then moves faster (10,000 over two hops 1.4 times faster with 1 s), but beside
    /// other traffic each waits its turn at the relays one after the other, and fewer finish
    /// (docs/notebook/2026-12-02-small-flows-one-at-a-time.md). Zero, the default: flows start
    /// at once, up to the limits above (the paper). Not in the paper.
    #[serde(with = "humantime_serde")]
    pub flow_start_hold: Duration,
    /// This node's own flows that may wait to start; an open beyond it is refused.
    pub max_waiting_flows: usize,
    /// Idle flow reclamation on relays and destinations (an unfinished incoming flow: see
    /// [`HopConfig::unfinished_flow_idle_timeout`]).
    #[serde(with = "humantime_serde")]
    pub flow_idle_timeout: Duration,
    /// Expiry of a block in custody that cannot move (§3.2).
    #[serde(with = "humantime_serde")]
    pub custody_expiry: Duration,
    /// A source abandons a flow after this long without progress.
    #[serde(with = "humantime_serde")]
    pub give_up_after: Duration,
    /// Application bytes a source buffers beyond its blocks (at least one block's worth).
    pub source_buffer_bytes: usize,
    /// Whether this node's links retry control frames at the link layer, as the runtime says
    /// with [`HopConfig::for_link`] (hopd from its interface, the simulator from its medium);
    /// `None` until it says, which the paper's 802.11 assumption covers. Not a setting of its
    /// own: `link_retries` in hopd's configuration and the simulator's medium give it.
    #[serde(skip)]
    pub link_retries: Option<bool>,
}

impl Default for HopConfig {
    fn default() -> Self {
        HopConfig {
            max_block_bytes: DEFAULT_MAX_BLOCK_BYTES,
            packet_payload_bytes: DEFAULT_PACKET_PAYLOAD_BYTES,
            txop_bytes: DEFAULT_TXOP_BYTES,
            micro_block_threshold: DEFAULT_MICRO_BLOCK_THRESHOLD,
            initial_block_bytes: DEFAULT_INITIAL_BLOCK_BYTES,
            opening_block_packets: DEFAULT_OPENING_BLOCK_PACKETS,
            ramp_while_shared: true,
            overlap_block_tails: false,
            block_time: Duration::ZERO,
            shared_turn_blocks: false,
            control_copies: ControlCopies::Auto,
            rounds_behind: true,
            backpressure_limit: DEFAULT_BACKPRESSURE_LIMIT,
            backpressure: true,
            next_hop_backpressure: true,
            nearest_exit_first: false,
            nearest_exit_age: Duration::ZERO,
            ack_withholding: true,
            withhold_timeout: DEFAULT_WITHHOLD_TIMEOUT,
            turn_horizon: Duration::ZERO,
            pipelining: true,
            cache_overheard: true,
            virtual_retransmission: true,
            vtx_initial_timeout: DEFAULT_VTX_INITIAL_TIMEOUT,
            vtx_ttl: DEFAULT_VTX_TTL,
            fin_probes: DEFAULT_FIN_PROBES,
            fin_probe_after: DEFAULT_FIN_PROBE_AFTER,
            bsyn_timeout: DEFAULT_BSYN_TIMEOUT,
            bsyn_max_backoff: DEFAULT_BSYN_MAX_BACKOFF,
            adaptive_bsyn_timeout: true,
            bsyn_min_timeout: DEFAULT_BSYN_MIN_TIMEOUT,
            back_quiet: DEFAULT_BACK_QUIET,
            queue_aware: true,
            duplicate_feedback: true,
            link_queue_lifetime: DEFAULT_LINK_QUEUE_LIFETIME,
            link_window_packets: DEFAULT_LINK_WINDOW_PACKETS,
            link_window_max_packets: DEFAULT_LINK_WINDOW_MAX_PACKETS,
            link_queue_target: DEFAULT_LINK_QUEUE_TARGET,
            round_per_next_hop: true,
            neighbour_silence: DEFAULT_NEIGHBOUR_SILENCE,
            probe_interval: DEFAULT_PROBE_INTERVAL,
            cache_limit_bytes: DEFAULT_CACHE_LIMIT_BYTES,
            max_flows: DEFAULT_MAX_FLOWS,
            max_sending_flows: DEFAULT_MAX_SENDING_FLOWS,
            max_sending_flows_per_destination: DEFAULT_MAX_SENDING_FLOWS_PER_DESTINATION,
            flow_start_hold: Duration::ZERO,
            max_waiting_flows: DEFAULT_MAX_WAITING_FLOWS,
            flow_idle_timeout: DEFAULT_FLOW_IDLE_TIMEOUT,
            custody_expiry: DEFAULT_CUSTODY_EXPIRY,
            give_up_after: DEFAULT_GIVE_UP_AFTER,
            source_buffer_bytes: DEFAULT_MAX_BLOCK_BYTES,
            link_retries: None,
        }
    }
}

impl HopConfig {
    /// The Hop paper's configuration: §4.2's parameters (1 MB blocks, 8 KB txops, 16 KB
    /// micro-block threshold, H = 1, a 60 s first virtual retransmission timeout and a TTL of
    /// 50), every mechanism of §3 on, and none of this implementation's extensions: a fixed
    /// BSYN timer doubled per unanswered BSYN, every packet a BACK reports missing sent again
    /// (§3.1), no link window, and the scheduler's txop round robin over all transfers
    /// (§3.6), every open flow of a node sending at once (up to `max_flows`), and no probe
    /// for a flow's last end-to-end BACK. Resource
    /// bounds the paper does not have (cache, flows, expiry) are the shipped ones.
    pub fn paper() -> Self {
        HopConfig {
            next_hop_backpressure: false,
            neighbour_silence: Duration::ZERO,
            adaptive_bsyn_timeout: false,
            queue_aware: false,
            duplicate_feedback: false,
            link_window_packets: 0,
            round_per_next_hop: false,
            rounds_behind: false,
            fin_probes: 0,
            max_sending_flows: DEFAULT_MAX_FLOWS,
            max_sending_flows_per_destination: DEFAULT_MAX_FLOWS,
            flow_start_hold: Duration::ZERO,
            control_copies: ControlCopies::Off,
            initial_block_bytes: 0,
            opening_block_packets: 0,
            ramp_while_shared: false,
            ..HopConfig::default()
        }
    }

    /// The configuration a preset names.
    pub fn preset(preset: HopPreset) -> Self {
        match preset {
            HopPreset::Shipped => HopConfig::default(),
            HopPreset::Paper => HopConfig::paper(),
        }
    }

    /// A configuration from a TOML table: an optional `preset = "paper"` or `"default"` (the
    /// base, `"default"` when left out) and any field of [`HopConfig`] to override it, with
    /// durations as strings (`"250ms"`, `"2s"`, `"1h"`). Unknown keys are errors.
    pub fn from_toml(table: &toml::Table) -> Result<Self, HopConfigError> {
        let mut table = table.clone();
        let preset = match table.remove("preset") {
            None => HopPreset::Shipped,
            Some(v) => v
                .try_into::<HopPreset>()
                .map_err(|e| HopConfigError::Preset(e.message().to_string()))?,
        };
        let base = toml::Table::try_from(HopConfig::preset(preset))
            .expect("a HopConfig serialises to a table");
        let read = |overrides: &mut dyn Iterator<Item = (&String, &toml::Value)>| {
            let mut merged = base.clone();
            for (k, v) in overrides {
                merged.insert(k.clone(), v.clone());
            }
            toml::Value::Table(merged).try_into::<HopConfig>()
        };
        if let Some(k) = table.keys().find(|k| !base.contains_key(*k)) {
            return Err(HopConfigError::UnknownKey(k.clone()));
        }
        read(&mut table.iter()).map_err(|e| {
            // Name the key: the first override that cannot be read on its own.
            let key = table
                .iter()
                .find(|kv| read(&mut std::iter::once(*kv)).is_err())
                .map_or_else(String::new, |(k, _)| k.clone());
            HopConfigError::Value {
                key,
                message: e.message().to_string(),
            }
        })
    }

    /// Packet payload size actually used: 1..=65535 bytes.
    pub(crate) fn packet_size(&self) -> u16 {
        self.packet_payload_bytes.clamp(1, usize::from(u16::MAX)) as u16
    }

    /// Block size actually used: at most 65535 packets and at most `u32::MAX` bytes.
    pub fn block_bytes(&self) -> usize {
        let cap = usize::from(self.packet_size()) * hop_wire::hop::MAX_PACKETS_PER_BLOCK as usize;
        self.max_block_bytes.clamp(1, cap.min(u32::MAX as usize))
    }

    /// Packets per txop (at least one).
    pub(crate) fn txop_packets(&self) -> u32 {
        let n = self.txop_bytes.div_ceil(usize::from(self.packet_size()));
        n.clamp(1, u32::MAX as usize) as u32
    }
}

impl HopConfig {
    /// This configuration on a node whose links do (`link_retries`) or do not retry control
    /// frames at the link layer: [`ControlCopies::Auto`] becomes `On` where they do not
    /// (copies repair what the link does not) and `Off` where they do (an 802.11 MAC, §4.1).
    /// An explicit `On` or `Off` stays. The BSYN timer's first wait before any round trip is
    /// measured follows the link too (`bsyn_timeout` where it retries, the floor where not).
    pub fn for_link(mut self, link_retries: bool) -> Self {
        self.link_retries = Some(link_retries);
        if self.control_copies == ControlCopies::Auto {
            self.control_copies = if link_retries {
                ControlCopies::Off
            } else {
                ControlCopies::On
            };
        }
        self
    }
}

/// Whether BSYNs and BACKs go more than once ([`HopConfig::control_copies`]). In a
/// configuration file: `true`, `false` or `"auto"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ControlCopies {
    /// Never (the paper).
    Off,
    /// Where the neighbour reports this node's control datagrams lost.
    On,
    /// `On` over links without link-layer retries of control frames, `Off` over links with
    /// them, as the runtime says ([`HopConfig::for_link`]); `Off` until it says.
    #[default]
    Auto,
}

impl ControlCopies {
    /// Whether copies are sent (an unresolved `Auto` sends none).
    pub fn on(self) -> bool {
        self == ControlCopies::On
    }
}

impl Serialize for ControlCopies {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ControlCopies::Off => s.serialize_bool(false),
            ControlCopies::On => s.serialize_bool(true),
            ControlCopies::Auto => s.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for ControlCopies {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = ControlCopies;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("true, false or \"auto\"")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<ControlCopies, E> {
                Ok(if v {
                    ControlCopies::On
                } else {
                    ControlCopies::Off
                })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ControlCopies, E> {
                match v {
                    "auto" => Ok(ControlCopies::Auto),
                    "true" | "on" => Ok(ControlCopies::On),
                    "false" | "off" => Ok(ControlCopies::Off),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl HopConfig {
    /// How long a destination keeps an unfinished incoming flow that receives nothing: the
    /// idle time, but at least as long as a source keeps trying without progress
    /// (`give_up_after`). A flow starved for minutes by busy relays is slow, not dead, and
    /// one given up at its destination cannot be delivered any more.
    pub fn unfinished_flow_idle_timeout(&self) -> Duration {
        self.flow_idle_timeout.max(self.give_up_after)
    }
}

/// A named starting point for a [`HopConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HopPreset {
    /// [`HopConfig::default`]: the paper plus the extensions that ship.
    #[serde(rename = "default")]
    Shipped,
    /// [`HopConfig::paper`]: the Hop paper's configuration.
    Paper,
}

/// A Hop configuration table that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HopConfigError {
    #[error("unknown Hop parameter `{0}` (the parameters are the fields of HopConfig; see docs/design/hop.md)")]
    UnknownKey(String),
    #[error("preset: {0} (\"paper\" or \"default\")")]
    Preset(String),
    #[error("`{key}`: {message}")]
    Value { key: String, message: String },
}
