//! The daemon: one task owns the node core and drives it from UDP sockets, timers, the local
//! API and route updates.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hop_proto::{
    AppError, Class, Event, FlowKey, Instant, Node, NodeId, StaticRoutes, TransportId,
};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use crate::api::ErrorCode;
use crate::auth::{AuthError, Authenticator, Stream};
use crate::config::{Config, LinkMode};
use crate::flowfmt::{self, FlowHeader, HASH_LEN};
use crate::metrics::Counters;

/// The IP TOS byte carrying `dscp` (ECN bits clear).
fn tos(dscp: u8) -> u32 {
    u32::from(dscp) << 2
}
/// Socket buffer size requested for both sockets.
const SOCKET_BUFFER: usize = 8 * 1024 * 1024;
/// Datagrams read per wake-up before other work is served.
const RX_BATCH: usize = 256;
/// Datagrams sent per loop iteration before receiving again (the daemon's link queue).
const TX_BATCH: usize = 128;

/// An update about a local outgoing flow, for the API client that opened it.
#[derive(Debug)]
pub enum FlowUpdate {
    Complete { bytes: u64 },
    Failed { reason: String },
}

/// A verified file waiting for a receiving application.
#[derive(Debug, Clone)]
pub struct InboxEntry {
    pub flow: String,
    pub from: NodeId,
    pub path: PathBuf,
    pub name: String,
    pub size: u64,
    pub content_offset: u64,
    pub blake3: String,
}

/// A flow the daemon opened for a sending client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub flow: FlowKey,
    /// File bytes to gather before handing the first of them to the transport: Hop cuts a
    /// block from whatever the source holds and never waits for more (§4.2), so a file's
    /// first block is only as large as the first hand-over. The client has announced the
    /// whole file and streams it over a local socket, so gathering costs a few copies, not a
    /// wait for data that may never come. 0: hand bytes over as they arrive.
    pub first_bytes: usize,
}

/// Commands from API clients to the core task.
pub enum Cmd {
    Open {
        to: NodeId,
        reply: oneshot::Sender<Result<Opened, (ErrorCode, String)>>,
        updates: mpsc::UnboundedSender<FlowUpdate>,
    },
    /// Application bytes for a flow; `last`: no more follow, the flow finishes after them.
    /// The last bytes and the finish come as one command so that the transport cuts the
    /// flow's last block with them: a finish handed over after the transport had already
    /// formed that block would cost a further, empty block (a BSYN/BACK round per hop, and
    /// for a small file a second round before the destination delivers it).
    Data {
        flow: FlowKey,
        data: Bytes,
        done: oneshot::Sender<()>,
        last: bool,
    },
    Abort {
        flow: FlowKey,
    },
    Subscribe {
        tx: mpsc::UnboundedSender<InboxEntry>,
    },
    Ack {
        flow: String,
    },
    /// Files offered to a receiving client that it did not acknowledge (it left, or took
    /// fewer files than it was offered): offered to the other clients again.
    Return {
        entries: Vec<InboxEntry>,
    },
    Status {
        reply: oneshot::Sender<serde_json::Value>,
    },
    Metrics {
        reply: oneshot::Sender<String>,
    },
    Routes {
        kernel: BTreeMap<NodeId, NodeId>,
    },
}

struct OutFlow {
    updates: mpsc::UnboundedSender<FlowUpdate>,
    pending: VecDeque<(Bytes, Option<oneshot::Sender<()>>)>,
    bytes_accepted: u64,
    to: NodeId,
    /// The application finished; `finish` is passed on once `pending` is empty.
    finish: bool,
}

/// An incoming flow being spooled (its bytes are in `incoming/`, see [`crate::custody::Spool`]).
struct InFlow {
    bytes: u64,
}

/// The daemon's state; owned by one task.
pub struct Daemon {
    cfg: Config,
    custody: Arc<std::sync::Mutex<crate::custody::CustodyUsage>>,
    /// Custody writes finished on the store's writer thread.
    custody_done: Arc<crate::custody::CustodyDone>,
    transport_id: TransportId,
    /// See [`Opened::first_bytes`]: `[hop] first_block_bytes` (a block by default) for Hop, 0 for
    /// the other transports.
    first_bytes: usize,
    node: Node,
    clock: std::time::Instant,
    auth: Authenticator,
    ctrl: Arc<UdpSocket>,
    data: Arc<UdpSocket>,
    addrs: HashMap<NodeId, SocketAddr>,
    counters: Counters,
    out: HashMap<FlowKey, OutFlow>,
    inflows: HashMap<FlowKey, InFlow>,
    /// Writes delivered bytes for transports whose store does not (HxH, ATP); Hop's custody
    /// store writes and fsyncs them itself before the end-to-end BACK.
    spool: crate::custody::Spool,
    inbox: BTreeMap<String, InboxEntry>,
    subscribers: Vec<mpsc::UnboundedSender<InboxEntry>>,
    /// Inbox files offered to a client and not yet acknowledged or returned by it: each
    /// file is offered to one client at a time.
    offered: BTreeSet<String>,
    kernel_routes: BTreeMap<NodeId, NodeId>,
    last_heard: HashMap<NodeId, std::time::Instant>,
    /// Receive buffers; taken out while their datagrams are handled.
    rx: Option<Box<crate::io::RxBatch>>,
    /// Sealed datagrams not yet taken by the kernel (the socket was full).
    txq: crate::io::TxQueue,
    /// The packet socket of `overhear = true`.
    overhear: Option<crate::overhear::Overhear>,
    /// The link's transmit backlog (`link_status_socket`).
    link: Option<crate::linkstatus::LinkStatus>,
}

/// A link status report waiting; never, without the socket.
async fn link_report(l: &Option<crate::linkstatus::LinkStatus>) -> std::io::Result<()> {
    match l {
        Some(l) => l.readable().await,
        None => std::future::pending().await,
    }
}

/// Readiness of the overhearing socket; never, without one.
async fn overheard(o: &Option<crate::overhear::Overhear>) -> std::io::Result<()> {
    match o {
        Some(o) => o.readable().await,
        None => std::future::pending().await,
    }
}

fn io_err(context: &str, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{context}: {e}"))
}

fn make_socket(cfg: &Config, bind: SocketAddr, tos: u32) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let domain = if bind.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    force_buffers(&s);
    if bind.is_ipv4() {
        s.set_tos(tos)?;
    } else {
        s.set_tclass_v6(tos)?;
    }
    if cfg.link_mode == LinkMode::Broadcast {
        s.set_broadcast(true)?;
    }
    if let Some(ifname) = &cfg.interface {
        s.bind_device(Some(ifname.as_bytes()))
            .map_err(|e| io_err(&format!("binding to interface {ifname}"), e))?;
    }
    s.bind(&bind.into())
        .map_err(|e| io_err(&format!("binding {bind}"), e))?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// Large socket buffers absorb a block's burst; as root (CAP_NET_ADMIN) the FORCE options go
/// past net.core.{r,w}mem_max, otherwise the kernel caps the request.
pub(crate) fn force_buffers(s: &socket2::Socket) {
    use std::os::fd::AsRawFd;
    let size = SOCKET_BUFFER as libc::c_int;
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        for opt in [force, plain] {
            if crate::io::set_int_option(s.as_raw_fd(), libc::SOL_SOCKET, opt, size) == 0 {
                break;
            }
        }
    }
}

/// Wall-clock nanoseconds, the first authentication counter after a start.
fn first_counter() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
}

impl Daemon {
    /// Bind sockets and build the node; `transport` is the transport the node hosts.
    pub fn new(cfg: Config, built: crate::transport::Built) -> std::io::Result<Daemon> {
        let transport = built.transport;
        for sub in ["incoming", "inbox", "rejected"] {
            std::fs::create_dir_all(cfg.storage_dir.join(sub))
                .map_err(|e| io_err(&format!("creating {}", cfg.storage_dir.display()), e))?;
        }
        let recv_bind = match cfg.link_mode {
            LinkMode::Unicast => cfg.listen,
            // Broadcasts only reach sockets bound to the wildcard address.
            LinkMode::Broadcast => {
                SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), cfg.listen.port())
            }
        };
        let ctrl = make_socket(&cfg, recv_bind, tos(cfg.control_dscp))?;
        let gro = {
            use std::os::fd::AsRawFd;
            crate::io::enable_gro(ctrl.as_raw_fd())
        };
        debug!(gro, "receive socket ready");
        let data = make_socket(
            &cfg,
            SocketAddr::new(cfg.listen.ip(), 0),
            tos(cfg.data_dscp),
        )?;
        let overhear = if cfg.overhear {
            let o = crate::overhear::Overhear::open(cfg.interface.as_deref(), cfg.listen.port())?;
            debug!("overhearing the neighbours' datagrams");
            Some(o)
        } else {
            None
        };
        let link = match &cfg.link_status_socket {
            Some(p) => {
                let l =
                    crate::linkstatus::LinkStatus::bind(p, cfg.link_queue_frames).map_err(|e| {
                        io_err(&format!("binding link_status_socket {}", p.display()), e)
                    })?;
                debug!(path = %p.display(), limit = cfg.link_queue_frames, "link status socket ready");
                Some(l)
            }
            None => None,
        };
        let routes = merged_routes(&cfg, &BTreeMap::new());
        let transport_id = transport.id();
        let first_bytes = if transport_id == TransportId::Hop {
            crate::transport::first_block_bytes(&cfg)
        } else {
            0
        };
        let mut node = Node::new(cfg.node_id, Box::new(routes), first_counter());
        node.add_transport(transport);
        let auth = Authenticator::new(&cfg.mesh_key, cfg.node_id, first_counter(), cfg.max_peers);
        let spool = crate::custody::Spool::new(&cfg.storage_dir.join("incoming"))
            .map_err(|e| io_err("opening the spool", e))?;
        let addrs = cfg.neighbours.iter().map(|n| (n.id, n.addr)).collect();
        let mut d = Daemon {
            custody: built.custody,
            custody_done: built.custody_done.unwrap_or_default(),
            transport_id,
            first_bytes,
            node,
            clock: std::time::Instant::now(),
            auth,
            ctrl: Arc::new(UdpSocket::from_std(ctrl)?),
            data: Arc::new(UdpSocket::from_std(data)?),
            addrs,
            counters: Counters::default(),
            out: HashMap::new(),
            inflows: HashMap::new(),
            spool,
            inbox: BTreeMap::new(),
            subscribers: Vec::new(),
            offered: BTreeSet::new(),
            kernel_routes: BTreeMap::new(),
            last_heard: HashMap::new(),
            rx: Some(Box::new(crate::io::RxBatch::new())),
            txq: crate::io::TxQueue::new(true),
            overhear,
            link,
            cfg,
        };
        d.scan_inbox();
        d.resume_incoming();
        d.publish_inbox();
        Ok(d)
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.ctrl.local_addr()
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(self.clock.elapsed().as_nanos() as u64)
    }

    fn to_instant(&self, t: Instant) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.clock + Duration::from_nanos(t.as_nanos()))
    }

    /// Run until `shutdown` fires.
    pub async fn run(
        mut self,
        mut cmds: mpsc::Receiver<Cmd>,
        mut shutdown: oneshot::Receiver<()>,
    ) -> std::io::Result<()> {
        info!(node = self.cfg.node_id, listen = %self.cfg.listen, "hopd running");
        loop {
            self.flush_tx();
            self.drain_events();
            let deadline = self.node.poll_timeout().map(|t| self.to_instant(t));
            let blocked = self.txq.blocked();
            let link_full = self.link.as_ref().is_some_and(|l| l.backlog.full());
            let stale = self
                .link
                .as_ref()
                .and_then(|l| l.backlog.stale_at())
                .map(tokio::time::Instant::from_std);
            let more_tx = blocked.is_none() && self.counters.tx_budget_exhausted && !link_full;
            let ctrl = self.ctrl.clone();
            let done = self.custody_done.clone();
            let wsock = match blocked {
                Some(true) => self.data.clone(),
                _ => self.ctrl.clone(),
            };
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                r = ctrl.readable() => {
                    r?;
                    self.receive_batch();
                }
                r = overheard(&self.overhear) => {
                    r?;
                    self.receive_overheard();
                }
                r = link_report(&self.link) => {
                    r?;
                    if let Some(l) = self.link.as_mut() {
                        l.drain();
                    }
                }
                _ = sleep_opt(stale), if stale.is_some() => {
                    if let Some(l) = self.link.as_mut() {
                        l.backlog.expire(std::time::Instant::now());
                    }
                }
                Some(cmd) = cmds.recv() => self.handle_cmd(cmd),
                _ = done.notify.notified() => self.custody_written(),
                r = wsock.writable(), if blocked.is_some() => {
                    r?;
                    self.send_queued();
                }
                _ = async {}, if more_tx => {}
                _ = sleep_opt(deadline) => {
                    let now = self.now();
                    self.node.handle_timeout(now);
                }
            }
        }
        info!("hopd stopping");
        self.spool.sync_all();
        Ok(())
    }

    /// Hand the custody writes the store's writer finished to the transport (it sends the
    /// completing BACKs).
    fn custody_written(&mut self) {
        let now = self.now();
        for (flow, block, ok) in self.custody_done.take() {
            let _ = self
                .node
                .custody_persisted(now, self.transport_id, flow, block, ok);
        }
    }

    fn receive_batch(&mut self) {
        use std::os::fd::AsRawFd;
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let fd = self.ctrl.as_raw_fd();
        let mut budget = RX_BATCH;
        while budget > 0 {
            let n = match self
                .ctrl
                .try_io(tokio::io::Interest::READABLE, || rx.recv(fd))
            {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    warn!(error = %e, "receive failed");
                    break;
                }
            };
            for i in 0..n {
                let (from, segments) = rx.datagrams(i);
                if rx.truncated(i) {
                    self.counters.auth_malformed += 1;
                    debug!(?from, "datagram larger than the receive buffer; dropped");
                    continue;
                }
                for dg in segments {
                    budget = budget.saturating_sub(1);
                    self.receive_one(from, dg, false);
                }
            }
        }
        self.rx = Some(rx);
    }

    /// Datagrams the packet socket holds (neighbours' unicast to each other), up to
    /// [`RX_BATCH`] at a time.
    fn receive_overheard(&mut self) {
        let Some(mut ov) = self.overhear.take() else {
            return;
        };
        let r = ov.drain(RX_BATCH, |from, dg| {
            self.counters.rx_overheard += 1;
            self.receive_one(Some(from), dg, true);
        });
        if let Err(e) = r {
            warn!(error = %e, "overhearing failed");
        }
        self.overhear = Some(ov);
    }

    fn receive_one(&mut self, from: Option<SocketAddr>, dg: &[u8], overheard: bool) {
        let n = dg.len();
        if !overheard {
            self.counters.rx_datagrams += 1;
            self.counters.rx_bytes += n as u64;
        }
        // Our own broadcasts come back to us: drop them before authentication.
        if n >= 12 && dg[8..12] == self.cfg.node_id.to_be_bytes() {
            return;
        }
        match self.auth.open(dg) {
            Ok(src) => {
                self.last_heard.insert(src, std::time::Instant::now());
                let now = Instant::from_nanos(self.clock.elapsed().as_nanos() as u64);
                if let Err(e) = self.node.handle_datagram(now, dg) {
                    self.counters.rx_rejected += 1;
                    debug!(?from, error = %e, "datagram rejected by the core");
                }
            }
            Err(e) => {
                match e {
                    AuthError::Replay(_) => self.counters.auth_replays += 1,
                    AuthError::TooManyPeers(_) => self.counters.auth_peer_limit += 1,
                    AuthError::Malformed(_) => self.counters.auth_malformed += 1,
                    _ => self.counters.auth_failures += 1,
                }
                debug!(?from, error = %e, "datagram dropped");
            }
        }
    }

    fn dest_addr(&self, next_hop: NodeId, class: Class) -> Option<SocketAddr> {
        if class == Class::Data && self.cfg.link_mode == LinkMode::Broadcast {
            return self.cfg.broadcast_address;
        }
        self.addrs.get(&next_hop).copied()
    }

    /// Move up to [`TX_BATCH`] datagrams from the core to the sockets. The core is polled only
    /// while the previous ones have all been taken by the kernel (the pull model: a full
    /// socket is a full link queue).
    fn flush_tx(&mut self) {
        self.counters.tx_budget_exhausted = false;
        if !self.send_queued() {
            return;
        }
        let mut polled = 0;
        while polled < TX_BATCH {
            // A full link takes no data; with `link_control_when_full` it still takes the
            // control the transport has queued.
            let mut control_only = false;
            if let Some(l) = self.link.as_mut() {
                if !l.backlog.room(std::time::Instant::now()) {
                    if !self.cfg.link_control_when_full {
                        break;
                    }
                    control_only = true;
                }
            }
            let now = self.now();
            let polled_out = if control_only {
                self.node.poll_control(now)
            } else {
                self.node.poll_transmit(now)
            };
            let Some(t) = polled_out else {
                tracing::trace!(stats = ?self.node.stats(), timeout = ?self.node.poll_timeout(), now = ?now, "nothing to transmit");
                break;
            };
            polled += 1;
            tracing::trace!(next_hop = t.next_hop, class = ?t.class, len = t.payload.len(), "transmit");
            let Some(addr) = self.dest_addr(t.next_hop, t.class) else {
                self.counters.tx_no_address += 1;
                debug!(next_hop = t.next_hop, "no address for next hop; dropped");
                continue;
            };
            let mut payload = t.payload;
            let stream = match t.class {
                Class::Data => Stream::Data,
                Class::Control => Stream::Control,
            };
            if self.auth.seal(&mut payload, stream).is_err() {
                self.counters.tx_errors += 1;
                continue;
            }
            self.txq.push(crate::io::Datagram {
                dest: addr,
                data: t.class == Class::Data,
                payload,
            });
            if let Some(l) = self.link.as_mut() {
                l.backlog.sent();
            }
        }
        if self.send_queued() && polled == TX_BATCH {
            self.counters.tx_budget_exhausted = true;
        }
    }

    /// Send the queued datagrams in batches; false if a socket is full (the rest stays
    /// queued until it is writable).
    fn send_queued(&mut self) -> bool {
        use std::os::fd::AsRawFd;
        if self.txq.is_empty() {
            return true;
        }
        let mut sender = TokioSender {
            ctrl: &self.ctrl,
            data: &self.data,
            inner: crate::io::MmsgSender {
                ctrl: self.ctrl.as_raw_fd(),
                data: self.data.as_raw_fd(),
            },
        };
        let mut st = crate::io::TxStats::default();
        let r = self.txq.flush(&mut sender, &mut st);
        self.counters.tx_datagrams += st.datagrams;
        self.counters.tx_bytes += st.bytes;
        self.counters.tx_errors += st.errors;
        r == crate::io::Flush::Done
    }

    fn drain_events(&mut self) {
        while let Some(ev) = self.node.poll_event() {
            match ev.event {
                Event::Writable { flow } => self.feed(flow),
                Event::SendComplete { flow, bytes } => {
                    info!(%flow, bytes, "send complete");
                    self.counters.flows_completed += 1;
                    if let Some(f) = self.out.remove(&flow) {
                        let _ = f.updates.send(FlowUpdate::Complete { bytes });
                    }
                }
                Event::SendFailed { flow, reason } => {
                    warn!(%flow, ?reason, "send failed");
                    self.counters.flows_failed += 1;
                    if let Some(f) = self.out.remove(&flow) {
                        let _ = f.updates.send(FlowUpdate::Failed {
                            reason: format!("{reason:?}"),
                        });
                    }
                }
                Event::FlowOpened { flow } => {
                    debug!(%flow, "incoming flow");
                }
                Event::Delivered { flow, offset, data } => self.deliver(flow, offset, &data),
                Event::FlowFinished { flow, bytes } => self.finish_incoming(flow, bytes),
                Event::FlowAbandoned { flow } => {
                    // Hop's store deleted the flow's spool files itself (and returned its
                    // bytes to the disk budget); the other transports' are the daemon's.
                    if self.transport_id != TransportId::Hop {
                        self.spool.abandon(flow);
                    }
                    if self.inflows.remove(&flow).is_some() {
                        info!(%flow, "incoming flow abandoned by its source or idle");
                        self.counters.flows_abandoned += 1;
                    }
                }
            }
        }
    }

    fn deliver(&mut self, flow: FlowKey, offset: u64, data: &[u8]) {
        // Hop's store has written (and fsynced) the bytes already; the others' are written
        // here, at their offset, which makes a repeated delivery harmless.
        if self.transport_id != TransportId::Hop {
            if let Err(e) = self.spool.write(flow, offset, data) {
                warn!(%flow, error = %e, "cannot write spool file");
                self.counters.storage_errors += 1;
                return;
            }
        }
        let f = self.inflows.entry(flow).or_insert(InFlow { bytes: 0 });
        f.bytes = f.bytes.max(offset + data.len() as u64);
        self.counters.delivered_bytes += data.len() as u64;
    }

    /// Incoming flows an earlier run left in the spool: a finished one not yet moved to the
    /// inbox (stopped in between) is verified now; unfinished ones resume (the transport
    /// restored their progress) and show in the status.
    fn resume_incoming(&mut self) {
        if self.transport_id != TransportId::Hop {
            return;
        }
        let incoming = self.cfg.storage_dir.join("incoming");
        for (flow, path, _) in crate::custody::state_records(&incoming) {
            let Some(p) = crate::custody::read_state(&path, flow) else {
                continue;
            };
            let part = crate::custody::part_path(&incoming, flow);
            if !part.exists() {
                continue;
            }
            self.inflows.insert(flow, InFlow { bytes: p.bytes });
            if p.finished {
                self.finish_incoming(flow, p.bytes);
            }
        }
    }

    /// Tell the custody store how many bytes the inbox holds (they count against the disk
    /// budget).
    fn publish_inbox(&self) {
        let bytes = self
            .inbox
            .values()
            .map(|e| e.size + e.content_offset + HASH_LEN as u64)
            .sum();
        if let Ok(mut u) = self.custody.lock() {
            u.inbox_bytes = bytes;
        }
    }

    fn finish_incoming(&mut self, flow: FlowKey, bytes: u64) {
        let name = format!("{}-{:08x}", flow.src, flow.id);
        if self.inflows.remove(&flow).is_none() {
            warn!(%flow, "finished flow without data");
            self.counters.integrity_failures += 1;
            return;
        }
        self.spool.close(flow);
        let part = crate::custody::part_path(&self.cfg.storage_dir.join("incoming"), flow);
        let checked = match File::open(&part) {
            Ok(mut file) => {
                let r = verify_spool(&mut file, bytes);
                let _ = file.sync_all();
                r
            }
            Err(_) => Err(flowfmt::FlowFormatError::Incomplete),
        };
        match checked {
            Ok((header, content_offset, hash)) => {
                let dst = self
                    .cfg
                    .storage_dir
                    .join("inbox")
                    .join(format!("{name}.flow"));
                if let Err(e) = std::fs::rename(&part, &dst) {
                    warn!(%flow, error = %e, "cannot move file to inbox");
                    self.counters.storage_errors += 1;
                    return;
                }
                info!(%flow, name = %header.name, size = header.size, "file received and verified");
                self.counters.files_received += 1;
                let entry = InboxEntry {
                    flow: name.clone(),
                    from: flow.src,
                    path: dst,
                    name: header.name,
                    size: header.size,
                    content_offset,
                    blake3: hash,
                };
                self.inbox.insert(name, entry.clone());
                self.publish_inbox();
                if self.transport_id == TransportId::Hop {
                    // Progress records are kept after the finish (a restarted destination
                    // answers late retransmissions with the end-to-end BACK) until the
                    // transport would have forgotten the flow anyway.
                    let idle = crate::transport::hop_config(&self.cfg).flow_idle_timeout;
                    self.spool.prune_finished(idle);
                }
                self.offer(entry);
            }
            Err(e) => {
                warn!(%flow, error = %e, "received file failed its integrity check");
                self.counters.integrity_failures += 1;
                let _ = std::fs::rename(
                    &part,
                    self.cfg
                        .storage_dir
                        .join("rejected")
                        .join(format!("{name}.flow")),
                );
            }
        }
    }

    /// Offers an inbox file to the newest client waiting for files, unless a client holds it
    /// already. With no client, or none left, it waits in the inbox for the next one.
    fn offer(&mut self, entry: InboxEntry) {
        if self.offered.contains(&entry.flow) {
            return;
        }
        self.subscribers.retain(|s| !s.is_closed());
        let flow = entry.flow.clone();
        let mut entry = entry;
        for s in &self.subscribers {
            match s.send(entry) {
                Ok(()) => {
                    self.offered.insert(flow);
                    return;
                }
                // That client left since the retain above: try the next.
                Err(mpsc::error::SendError(back)) => entry = back,
            }
        }
    }

    fn scan_inbox(&mut self) {
        let dir = self.cfg.storage_dir.join("inbox");
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return;
        };
        for e in rd.flatten() {
            let path = e.path();
            let Some(stem) = path
                .file_stem()
                .and_then(|s| s.to_str())
                .map(str::to_string)
            else {
                continue;
            };
            let Some(from) = stem.split('-').next().and_then(|s| s.parse().ok()) else {
                continue;
            };
            let Ok(mut file) = File::open(&path) else {
                continue;
            };
            let len = file.metadata().map(|m| m.len()).unwrap_or(0);
            if let Ok((header, content_offset, hash)) = verify_spool(&mut file, len) {
                self.inbox.insert(
                    stem.clone(),
                    InboxEntry {
                        flow: stem,
                        from,
                        path,
                        name: header.name,
                        size: header.size,
                        content_offset,
                        blake3: hash,
                    },
                );
            }
        }
    }

    /// Hand queued application bytes to the transport, then the finish once all are taken.
    fn feed(&mut self, flow: FlowKey) {
        let now = self.now();
        let Some(f) = self.out.get_mut(&flow) else {
            return;
        };
        while let Some((data, _)) = f.pending.front_mut() {
            match self.node.send(now, flow, data.clone()) {
                Ok(n) => {
                    f.bytes_accepted += n as u64;
                    if n >= data.len() {
                        if let Some((_, Some(done))) = f.pending.pop_front() {
                            let _ = done.send(());
                        }
                    } else {
                        *data = data.slice(n..);
                        return;
                    }
                }
                Err(e) => {
                    warn!(%flow, error = %e, "send rejected");
                    return;
                }
            }
        }
        if std::mem::take(&mut f.finish) {
            if let Err(e) = self.node.finish(now, flow) {
                warn!(%flow, error = %e, "finish failed");
            }
        }
    }

    fn handle_cmd(&mut self, cmd: Cmd) {
        let now = self.now();
        match cmd {
            Cmd::Open { to, reply, updates } => {
                let known = self.addrs.contains_key(&to)
                    || self.cfg.routes.contains_key(&to)
                    || self.kernel_routes.contains_key(&to);
                if !known {
                    let _ = reply.send(Err((
                        ErrorCode::UnknownNode,
                        format!("node {to} is neither a neighbour nor reachable by a route"),
                    )));
                    return;
                }
                match self.node.open(now, self.transport_id, to) {
                    Ok(flow) => {
                        info!(%flow, to, "flow opened");
                        self.out.insert(
                            flow,
                            OutFlow {
                                updates,
                                pending: VecDeque::new(),
                                bytes_accepted: 0,
                                to,
                                finish: false,
                            },
                        );
                        let _ = reply.send(Ok(Opened {
                            flow,
                            first_bytes: self.first_bytes,
                        }));
                    }
                    Err(e) => {
                        let code = match e {
                            AppError::TooManyFlows(_) => ErrorCode::NoSpace,
                            AppError::SelfDestination => ErrorCode::BadRequest,
                            _ => ErrorCode::Internal,
                        };
                        let _ = reply.send(Err((code, e.to_string())));
                    }
                }
            }
            Cmd::Data {
                flow,
                data,
                done,
                last,
            } => {
                if let Some(f) = self.out.get_mut(&flow) {
                    f.pending.push_back((data, Some(done)));
                    f.finish |= last;
                    self.feed(flow);
                }
            }
            Cmd::Abort { flow } => {
                if self.out.remove(&flow).is_some() {
                    let _ = self.node.abort(now, flow);
                    info!(%flow, "flow aborted by the application");
                }
            }
            Cmd::Subscribe { tx } => {
                // The new client gets every file no other client holds; what it does not
                // take comes back (`Return`) for the others.
                self.subscribers.insert(0, tx);
                let waiting: Vec<InboxEntry> = self.inbox.values().cloned().collect();
                for e in waiting {
                    self.offer(e);
                }
            }
            Cmd::Ack { flow } => {
                self.offered.remove(&flow);
                if let Some(e) = self.inbox.remove(&flow) {
                    let _ = std::fs::remove_file(&e.path);
                    self.counters.files_handed_over += 1;
                    self.publish_inbox();
                }
            }
            Cmd::Return { entries } => {
                for e in entries {
                    self.offered.remove(&e.flow);
                    if let Some(e) = self.inbox.get(&e.flow).cloned() {
                        if !e.path.exists() {
                            // Deleted behind the daemon's back: nothing left to hand over.
                            warn!(flow = %e.flow, path = %e.path.display(), "inbox file vanished");
                            self.inbox.remove(&e.flow);
                            self.counters.storage_errors += 1;
                            self.publish_inbox();
                            continue;
                        }
                        self.offer(e);
                    }
                }
            }
            Cmd::Status { reply } => {
                let _ = reply.send(self.status());
            }
            Cmd::Metrics { reply } => {
                let _ = reply.send(self.metrics_text());
            }
            Cmd::Routes { kernel } => {
                if kernel != self.kernel_routes {
                    info!(routes = kernel.len(), "kernel routes changed");
                    self.kernel_routes = kernel;
                    let merged = merged_routes(&self.cfg, &self.kernel_routes);
                    self.node.set_routing(Box::new(merged));
                }
            }
        }
    }

    fn storage_bytes(&self) -> u64 {
        let inflight: u64 = self.inflows.values().map(|f| f.bytes).sum();
        let inbox: u64 = self
            .inbox
            .values()
            .map(|e| e.size + e.content_offset + HASH_LEN as u64)
            .sum();
        inflight + inbox
    }

    fn status(&self) -> serde_json::Value {
        let stats = self.node.stats();
        let now = std::time::Instant::now();
        let neighbours: Vec<_> = self
            .cfg
            .neighbours
            .iter()
            .map(|n| {
                serde_json::json!({
                    "id": n.id,
                    "address": n.addr.to_string(),
                    "last_heard_ms": self.last_heard.get(&n.id).map(|t| now.duration_since(*t).as_millis() as u64),
                })
            })
            .collect();
        let outgoing: Vec<_> = self
            .out
            .iter()
            .map(|(k, f)| serde_json::json!({"flow": k.to_string(), "to": f.to, "bytes_accepted": f.bytes_accepted}))
            .collect();
        // `bytes`: delivered in order and spooled; `received_bytes`: unique payload bytes
        // the transport holds for the flow, including packets of blocks not complete yet
        // (what a transfer cut off before its end has achieved).
        let mut received: HashMap<FlowKey, u64> = self.node.received().into_iter().collect();
        let mut incoming: Vec<_> = self
            .inflows
            .iter()
            .map(|(k, f)| {
                let got = received.remove(k).unwrap_or(0).max(f.bytes);
                serde_json::json!({"flow": k.to_string(), "bytes": f.bytes, "received_bytes": got})
            })
            .collect();
        incoming.extend(received.into_iter().map(|(k, got)| {
            serde_json::json!({"flow": k.to_string(), "bytes": 0, "received_bytes": got})
        }));
        serde_json::json!({
            "node_id": self.cfg.node_id,
            "listen": self.cfg.listen.to_string(),
            "uptime_s": self.clock.elapsed().as_secs(),
            "neighbours": neighbours,
            "outgoing": outgoing,
            "incoming": incoming,
            "inbox": self.inbox.len(),
            "storage_bytes": self.storage_bytes(),
            "storage_limit_bytes": self.cfg.max_disk_bytes,
            "kernel_routes": self.kernel_routes.len(),
            "kernel_next_hops": self
                .kernel_routes
                .iter()
                .map(|(d, n)| (d.to_string(), serde_json::json!(n)))
                .collect::<serde_json::Map<_, _>>(),
            "custody": self.custody_json(),
            "spool": self.spool_json(),
            "counters": self.counters,
            "link_status": self.link.as_ref().map(|l| l.backlog.counters),
            "node": stats,
        })
    }

    fn custody_json(&self) -> serde_json::Value {
        let u = self.custody.lock().map(|u| *u).unwrap_or_default();
        serde_json::json!({"blocks": u.blocks, "bytes": u.bytes, "limit_bytes": u.limit,
            "stored_total": u.stored_total, "full_total": u.full_events,
            "writes_timed": u.writes_timed, "write_wait_us": u.write_wait_us,
            "write_wait_max_us": u.write_wait_max_us})
    }

    fn spool_json(&self) -> serde_json::Value {
        let u = self.custody.lock().map(|u| *u).unwrap_or_default();
        serde_json::json!({"full": u.spool_full, "full_total": u.spool_full_events,
            "incoming_bytes": u.incoming_bytes, "inbox_bytes": u.inbox_bytes,
            "disk_bytes": u.disk_bytes(), "limit_bytes": self.cfg.max_disk_bytes,
            "deliveries_timed": u.deliveries_timed, "deliver_us": u.deliver_us,
            "deliver_max_us": u.deliver_max_us})
    }

    fn metrics_text(&self) -> String {
        let u = self.custody.lock().map(|u| *u).unwrap_or_default();
        crate::metrics::render(
            &u,
            &self.node.stats(),
            &self.counters,
            self.out.len() as u64,
            self.inflows.len() as u64,
            self.storage_bytes(),
            self.auth.peers() as u64,
        )
    }
}

/// Batched sends through the tokio sockets, so a full socket clears tokio's write readiness
/// and the daemon waits for it to become writable again.
struct TokioSender<'a> {
    ctrl: &'a UdpSocket,
    data: &'a UdpSocket,
    inner: crate::io::MmsgSender,
}

impl crate::io::BatchSend for TokioSender<'_> {
    fn send_batch(
        &mut self,
        data: bool,
        items: &[crate::io::Datagram],
        spans: &[crate::io::Span],
    ) -> std::io::Result<usize> {
        let sock = if data { self.data } else { self.ctrl };
        let inner = &mut self.inner;
        sock.try_io(tokio::io::Interest::WRITABLE, || {
            inner.send_batch(data, items, spans)
        })
    }
}

/// Routing table: every neighbour is its own next hop, kernel routes override that, and static
/// routes from the configuration override both.
pub fn merged_routes(cfg: &Config, kernel: &BTreeMap<NodeId, NodeId>) -> StaticRoutes {
    let mut r = StaticRoutes::new();
    for n in &cfg.neighbours {
        r.insert(n.id, n.id);
    }
    for (d, n) in kernel {
        r.insert(*d, *n);
    }
    for (d, n) in &cfg.routes {
        r.insert(*d, *n);
    }
    r
}

async fn sleep_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Check a completed spool file of `len` bytes: header, size and BLAKE3 trailer.
fn verify_spool(
    file: &mut File,
    len: u64,
) -> Result<(FlowHeader, u64, String), flowfmt::FlowFormatError> {
    use flowfmt::FlowFormatError as E;
    file.seek(SeekFrom::Start(0)).map_err(|_| E::Incomplete)?;
    let mut head = vec![0u8; (len as usize).min(15 + flowfmt::MAX_NAME)];
    file.read_exact(&mut head).map_err(|_| E::Incomplete)?;
    let (header, hlen) = FlowHeader::decode(&head)?;
    // The size is the sender's word: checked, so that no size can overflow the sum.
    let expect = (hlen as u64 + HASH_LEN as u64).checked_add(header.size);
    if expect != Some(len) {
        return Err(E::Length {
            have: len,
            size: header.size,
        });
    }
    file.seek(SeekFrom::Start(hlen as u64))
        .map_err(|_| E::Incomplete)?;
    let mut hasher = blake3::Hasher::new();
    let mut left = header.size;
    let mut buf = vec![0u8; 1 << 16];
    while left > 0 {
        let n = (left as usize).min(buf.len());
        file.read_exact(&mut buf[..n]).map_err(|_| E::Incomplete)?;
        hasher.update(&buf[..n]);
        left -= n as u64;
    }
    let mut trailer = [0u8; HASH_LEN];
    file.read_exact(&mut trailer).map_err(|_| E::Incomplete)?;
    if hasher.finalize().as_bytes() != &trailer {
        return Err(E::HashMismatch);
    }
    Ok((header, hlen as u64, flowfmt::hex(&trailer)))
}
