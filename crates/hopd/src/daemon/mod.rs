//! The daemon: one task owns the node core and drives it from UDP sockets, timers, the local
//! API and route updates.

pub mod cmd;
mod datapath;
mod directory;
mod discovery;
mod inbox;
mod outgoing;
mod persist;
pub mod reload;
mod sessions;
mod status;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hop_proto::{AppError, Event, FlowKey, Instant, Node, NodeId, StaticRoutes, TransportId};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use crate::api::ErrorCode;
use crate::auth::Authenticator;
use crate::config::{Config, LinkMode};
use crate::metrics::Counters;
use crate::socket::{io_err, make_socket, tos};
use cmd::{Cmd, FlowUpdate, InboxEntry, Opened};
use inbox::InFlow;
use outgoing::OutFlow;
use sessions::SESSION_TICK;

/// The daemon's state; owned by one task.
pub struct Daemon {
    cfg: Config,
    /// Neighbours learned from their hellos (discovery.rs).
    discovered: HashMap<NodeId, discovery::Discovered>,
    /// Every node's addresses as the nodes say them (directory.rs), for kernel routes.
    directory: HashMap<NodeId, directory::Entry>,
    /// The sequence number of this node's last record.
    directory_seq: u64,
    /// Each neighbour's hellos heard, from its record's sequence numbers (link quality).
    hello_windows: HashMap<NodeId, directory::HelloWindow>,
    /// The last other node's record sent: the next directory datagram goes on from there.
    directory_cursor: NodeId,
    /// This run's random nonce in hellos (tells a node with the same id from an echo).
    boot_nonce: u64,
    warn_hello: datapath::RateLimited,
    warn_duplicate: datapath::RateLimited,
    /// Hellos to the discovery address when the event socket does not receive broadcasts.
    discovery_rx: Option<Arc<UdpSocket>>,
    /// Authenticated datagrams and bytes received per sender (metrics).
    rx_by_peer: HashMap<NodeId, (u64, u64)>,
    /// Datagrams and bytes handed to the socket for each next hop.
    tx_by_peer: HashMap<NodeId, (u64, u64)>,
    /// How long transfers from this node took to complete (seconds).
    completions: prometheus_client::metrics::histogram::Histogram,
    /// The file `cfg` was read from, re-read on SIGHUP / `hop reload`.
    config_path: Option<std::path::PathBuf>,
    /// What happens to transfers and files, for the HTTP API's event stream.
    events: tokio::sync::broadcast::Sender<serde_json::Value>,
    /// The core's own command channel, for tasks that feed kept transfers from disk.
    cmds: Option<mpsc::Sender<Cmd>>,
    /// systemd's watchdog: the event loop tells it it is alive this often.
    watchdog: Option<std::time::Duration>,
    /// The authentication counter's lease on disk.
    lease: crate::counter::CounterLease,
    /// Rate-limited warnings of datagrams that fail authentication, and of replays.
    warn_auth: datapath::RateLimited,
    warn_version: datapath::RateLimited,
    warn_replay: datapath::RateLimited,
    warn_lease: datapath::RateLimited,
    warn_unknown: datapath::RateLimited,
    /// Hellos and datagrams from nodes that are not members, or signed wrongly.
    warn_member: datapath::RateLimited,
    /// After a failed lease write, the next attempt waits until then.
    lease_retry_at: Option<std::time::Instant>,
    custody: Arc<std::sync::Mutex<crate::custody::CustodyUsage>>,
    /// Custody writes finished on the store's writer thread.
    custody_done: Arc<crate::custody::CustodyDone>,
    /// Joins, verifies and moves finished incoming files off the event loop.
    finisher: inbox::Finisher,
    transport_id: TransportId,
    /// See [`Opened::first_bytes`]: `[hop] first_block_bytes` (a block by default) for Hop, 0 for
    /// the other transports.
    first_bytes: usize,
    node: Node,
    clock: std::time::Instant,
    auth: Authenticator,
    /// Per-neighbour sessions (`[security] sessions`), which give `auth` the neighbours' keys.
    sessions: Option<crate::session::Sessions>,
    /// Handshakes refused (not a member, a bad certificate).
    warn_session: datapath::RateLimited,
    /// Where received encrypted datagrams are decrypted (reused).
    rx_plain: Vec<u8>,
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
    /// Receiving clients, newest first, each with its service (none: the default inbox).
    subscribers: Vec<(Option<String>, mpsc::UnboundedSender<InboxEntry>)>,
    /// Inbox files offered to a client and not yet acknowledged or returned by it: each
    /// file is offered to one client at a time.
    offered: BTreeSet<String>,
    kernel_routes: BTreeMap<NodeId, NodeId>,
    /// The kernel's routes as last read (`kernel_routes` maps them with the current
    /// neighbours).
    kernel_raw: Vec<crate::netlink::Route>,
    /// batman-adv's originator table as last read, and the next hops it gives (batman.rs).
    batman_raw: Vec<crate::batman::Originator>,
    batman_routes: BTreeMap<NodeId, NodeId>,
    /// Whether the link retries control frames, and why hopd thinks so (linkkind.rs): what
    /// Hop's `control_copies = "auto"` followed. Hop only.
    link_retries: Option<crate::linkkind::LinkRetries>,
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

/// Wall-clock nanoseconds, the first authentication counter after a start.
fn first_counter() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
}

impl Daemon {
    /// Bind sockets and build the node; `transport` is the transport the node hosts.
    pub fn new(mut cfg: Config, built: crate::transport::Built) -> std::io::Result<Daemon> {
        cfg.resolve_discovery().map_err(std::io::Error::other)?;
        if cfg.discovery_auto {
            info!(addresses = ?cfg.discovery_addresses, interface = ?cfg.interface, "discovery addresses found on the interface");
        }
        let transport = built.transport;
        for sub in ["incoming", "inbox", "rejected"] {
            std::fs::create_dir_all(cfg.storage_dir.join(sub))
                .map_err(|e| io_err(&format!("creating {}", cfg.storage_dir.display()), e))?;
        }
        let recv_bind = match cfg.link_mode {
            LinkMode::Unicast => cfg.listen,
            // Broadcasts (and, for IPv6, the multicast group) reach only sockets bound to the
            // wildcard address.
            LinkMode::Broadcast if cfg.listen.is_ipv6() => SocketAddr::new(
                IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                cfg.listen.port(),
            ),
            LinkMode::Broadcast => {
                SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), cfg.listen.port())
            }
        };
        let ctrl = make_socket(&cfg, recv_bind, tos(cfg.control_dscp))?;
        // Hellos are broadcast: a socket bound to one address does not receive them, so one
        // more listens on the discovery address itself.
        let discovery_rx = match cfg.discovery_address {
            Some(a) if !recv_bind.ip().is_unspecified() => {
                Some(Arc::new(UdpSocket::from_std(discovery::bind(&cfg, a)?)?))
            }
            _ => None,
        };
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
            let o = crate::overhear::Overhear::open(
                cfg.interface.as_deref(),
                cfg.listen.port(),
                cfg.listen.is_ipv6(),
            )?;
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
        // Every datagram is sealed before it leaves and opened before the node sees it
        // ([security] is required): the envelope's crc32c is computed once, by `seal`.
        node.set_sealed_link(true);
        // The counter starts past every one used before, also after a restart with the clock
        // behind (counter.rs).
        let (lease, first) = crate::counter::CounterLease::start(&cfg.storage_dir, first_counter())
            .map_err(|e| io_err("writing the authentication counter's lease", e))?;
        // With sessions each node seals with its own key, given to member neighbours by
        // handshakes (session.rs); else with the mesh key.
        let sessions = match (&cfg.node_key, cfg.sessions) {
            (Some(k), true) => Some(
                crate::session::Sessions::new(cfg.node_id, k)
                    .map_err(|e| std::io::Error::other(format!("starting sessions: {e}")))?,
            ),
            _ => None,
        };
        let mut auth = match (&sessions, &cfg.mesh_key) {
            (Some(s), _) => {
                let own = s.own();
                Authenticator::with_sessions(cfg.node_id, first, cfg.max_peers, own.id, &own.key)
            }
            (None, Some(k)) => Authenticator::new(k, cfg.node_id, first, cfg.max_peers),
            (None, None) => {
                return Err(std::io::Error::other(
                    "no mesh key and no sessions: see [security] in docs/hopd.md",
                ))
            }
        };
        auth.set_encrypt(cfg.encrypt);
        auth.set_cipher(cfg.cipher.resolve());
        let spool = crate::custody::Spool::new(&cfg.storage_dir.join("incoming"))
            .map_err(|e| io_err("opening the spool", e))?;
        let finisher = inbox::Finisher::start(&cfg.storage_dir)
            .map_err(|e| io_err("starting the file finisher", e))?;
        let addrs = cfg.neighbours.iter().map(|n| (n.id, n.addr)).collect();
        let mut d = Daemon {
            config_path: None,
            discovered: HashMap::new(),
            directory: HashMap::new(),
            // Grows across restarts with the counter's lease (directory.rs).
            directory_seq: first,
            directory_cursor: 0,
            hello_windows: HashMap::new(),
            boot_nonce: discovery::random_u64(),
            warn_hello: Default::default(),
            warn_duplicate: Default::default(),
            discovery_rx,
            events: tokio::sync::broadcast::channel(256).0,
            cmds: None,
            rx_by_peer: HashMap::new(),
            tx_by_peer: HashMap::new(),
            completions: crate::metrics::completion_histogram(),
            watchdog: None,
            lease,
            warn_auth: Default::default(),
            warn_version: Default::default(),
            warn_replay: Default::default(),
            warn_lease: Default::default(),
            warn_unknown: Default::default(),
            warn_member: Default::default(),
            lease_retry_at: None,
            custody: built.custody,
            custody_done: built.custody_done.unwrap_or_default(),
            finisher,
            transport_id,
            first_bytes,
            node,
            clock: std::time::Instant::now(),
            auth,
            sessions,
            warn_session: Default::default(),
            rx_plain: Vec::new(),
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
            kernel_raw: Vec::new(),
            batman_raw: Vec::new(),
            batman_routes: BTreeMap::new(),
            link_retries: (cfg.transport == crate::config::TransportKind::Hop)
                .then(|| crate::transport::link_retries(&cfg)),
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

    /// Publish an event to the HTTP API's listeners (none: dropped).
    pub(super) fn event(&self, e: serde_json::Value) {
        let _ = self.events.send(e);
    }

    /// Keep the counter's lease ahead of the counter. A failed write (a full disk) is
    /// retried while half a lease remains; past the lease's end hopd stops rather than send
    /// counters a restart could reuse.
    fn renew_lease(&mut self) -> std::io::Result<()> {
        let next = self.auth.next_counter();
        let now = std::time::Instant::now();
        if self.lease_retry_at.is_some_and(|t| now < t) && next < self.lease.end() {
            return Ok(());
        }
        self.lease_retry_at = None;
        if let Err(e) = self.lease.keep_ahead(next) {
            self.lease_retry_at = Some(now + std::time::Duration::from_secs(1));
            if next >= self.lease.end() {
                tracing::error!(error = %e, "cannot renew the authentication counter's lease; stopping");
                return Err(e);
            }
            if let Some(n) = self.warn_lease.due(std::time::Instant::now()) {
                warn!(error = %e, failures = n, "cannot renew the authentication counter's lease (storage full?); retrying");
            }
        }
        Ok(())
    }

    /// Ping systemd's watchdog every `every` from the event loop (so a stuck loop is
    /// restarted).
    pub fn set_watchdog(&mut self, every: std::time::Duration) {
        self.watchdog = Some(every);
    }

    /// The configuration file to re-read on SIGHUP and `hop reload`.
    pub fn set_config_path(&mut self, path: std::path::PathBuf) {
        self.config_path = Some(path);
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
        info!(node = self.cfg.node_id, listen = %self.cfg.listen, cipher = self.auth.cipher().name(), "hopd running");
        if let Some(k) = &self.cfg.node_key {
            info!(
                public_key = %crate::identity::hex(k.public()),
                members = self.cfg.members.as_ref().map(Vec::len),
                "node key loaded"
            );
        }
        let mut watchdog_at = self.watchdog.map(|w| tokio::time::Instant::now() + w);
        let mut hello_at = self
            .cfg
            .discovery_address
            .map(|_| tokio::time::Instant::now());
        let discovery_rx = self.discovery_rx.clone();
        let mut session_at = self.sessions.as_ref().map(|_| tokio::time::Instant::now());
        loop {
            // A deadline that has passed is handled before anything else. The select below
            // prefers the sockets, and under a steady stream a socket is always readable, so
            // the timer branch would never win (a relay's BSYN timers and housekeeping would
            // wait for a pause in its traffic).
            let now = self.now();
            if self.node.poll_timeout().is_some_and(|t| t <= now) {
                self.node.handle_timeout(now);
            }
            self.flush_tx();
            self.renew_lease()?;
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
            let finished = self.finisher.notify.clone();
            let wsock = match blocked {
                Some(true) => self.data.clone(),
                _ => self.ctrl.clone(),
            };
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                // Before the sockets: under a steady stream the socket is always readable,
                // and the BACKs that finished writes release would wait for a pause.
                _ = done.notify.notified() => self.custody_written(),
                _ = finished.notified() => self.files_finished(),
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
                r = wsock.writable(), if blocked.is_some() => {
                    r?;
                    self.send_queued();
                }
                _ = async {}, if more_tx => {}
                _ = sleep_opt(deadline) => {
                    let now = self.now();
                    self.node.handle_timeout(now);
                }
                _ = sleep_opt(hello_at), if hello_at.is_some() => {
                    self.say_hello();
                    self.say_directory();
                    self.expire_discovered();
                    self.expire_directory();
                    hello_at = Some(tokio::time::Instant::now() + self.next_hello());
                }
                _ = sleep_opt(session_at), if session_at.is_some() => {
                    self.session_tick();
                    session_at = Some(tokio::time::Instant::now() + SESSION_TICK);
                }
                r = readable_opt(&discovery_rx), if discovery_rx.is_some() => {
                    r?;
                    self.receive_discovery();
                }
                _ = sleep_opt(watchdog_at), if watchdog_at.is_some() => {
                    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Watchdog]);
                    watchdog_at = self.watchdog.map(|w| tokio::time::Instant::now() + w);
                }
            }
        }
        info!("hopd stopping");
        self.spool.sync_all();
        Ok(())
    }

    /// Hand the custody writes and the deliveries the store's writers finished to the
    /// transport (it sends the completing and the end-to-end BACKs).
    fn custody_written(&mut self) {
        let now = self.now();
        for (flow, block, ok) in self.custody_done.take() {
            let _ = self
                .node
                .custody_persisted(now, self.transport_id, flow, block, ok);
        }
        for (flow, block, ok) in self.custody_done.take_delivered() {
            let _ = self
                .node
                .delivery_persisted(now, self.transport_id, flow, block, ok);
        }
    }

    fn drain_events(&mut self) {
        while let Some(ev) = self.node.poll_event() {
            match ev.event {
                Event::Writable { flow } => self.feed(flow),
                Event::NeighbourSilent { neighbour, flows } => {
                    self.event(
                        serde_json::json!({"event": "neighbour_silent", "neighbour": neighbour}),
                    );
                    self.neighbour_silent(neighbour, &flows)
                }
                Event::NeighbourReturned { neighbour } => {
                    self.event(
                        serde_json::json!({"event": "neighbour_returned", "neighbour": neighbour}),
                    );
                    self.neighbour_returned(neighbour)
                }
                Event::DestinationFull { flow } => self.destination_full(flow),
                Event::Acknowledged { flow, bytes } => {
                    let Some(f) = self.out.get_mut(&flow) else {
                        continue;
                    };
                    if std::mem::take(&mut f.dest_full) {
                        let _ = f.updates.send(FlowUpdate::Waiting { reason: None });
                    }
                    let (to, mut held) = (f.to, bytes);
                    let mut abort = Vec::new();
                    if let Some(p) = f.persisted.as_mut() {
                        (abort, held) = p.acknowledged(bytes);
                    }
                    f.bytes_acked = held;
                    let _ = f.updates.send(FlowUpdate::Acked { bytes: held });
                    self.abort_earlier_flows(&abort, to);
                }
                Event::SendComplete { flow, bytes } => {
                    info!(%flow, bytes, "send complete");
                    self.counters.flows_completed += 1;
                    if let Some(f) = self.end_outgoing(flow) {
                        self.completions.observe(f.opened.elapsed().as_secs_f64());
                        self.event(serde_json::json!({"event": "complete", "flow": flow.to_string(), "to": f.to, "name": f.name, "bytes": f.size}));
                        let _ = f.updates.send(FlowUpdate::Complete { bytes });
                    }
                }
                Event::SendFailed { flow, reason } => {
                    warn!(%flow, %reason, "send failed");
                    self.counters.flows_failed += 1;
                    if let Some(f) = self.end_outgoing(flow) {
                        self.event(serde_json::json!({"event": "failed", "flow": flow.to_string(), "to": f.to, "name": f.name, "reason": reason.to_string()}));
                        let _ = f.updates.send(FlowUpdate::Failed {
                            reason: reason.to_string(),
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

    fn handle_cmd(&mut self, cmd: Cmd) {
        let now = self.now();
        match cmd {
            Cmd::Open {
                to,
                name,
                size,
                lifetime,
                detach,
                service,
                priority,
                reply,
                updates,
            } => {
                let lifetime = lifetime.or(self.cfg.default_lifetime);
                let classed = priority != crate::api::Priority::Normal;
                if (lifetime.is_some() || classed) && self.transport_id != TransportId::Hop {
                    let what = if classed { "a priority" } else { "a lifetime" };
                    let _ = reply.send(Err((
                        ErrorCode::BadRequest,
                        format!("{what} needs transport = \"hop\" (this node runs another)"),
                    )));
                    return;
                }
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
                        let expires = lifetime.map(|l| std::time::Instant::now() + l);
                        if let Some(l) = lifetime {
                            let until = now + l;
                            if let Err(e) = self.node.set_lifetime(now, flow, until) {
                                warn!(%flow, error = %e, "lifetime not set");
                            }
                        }
                        if classed {
                            if let Err(e) = self.node.set_priority(now, flow, priority.wire()) {
                                warn!(%flow, error = %e, "priority not set");
                            }
                        }
                        info!(%flow, to, %name, size, lifetime = ?lifetime, ?priority, "flow opened");
                        self.out.insert(
                            flow,
                            OutFlow {
                                updates,
                                pending: VecDeque::new(),
                                bytes_accepted: 0,
                                to,
                                finish: false,
                                name: name.clone(),
                                size,
                                opened: std::time::Instant::now(),
                                detached: false,
                                expires,
                                bytes_acked: 0,
                                persisted: None,
                                dest_full: false,
                                priority,
                            },
                        );
                        if detach {
                            match self.persist_open(
                                flow,
                                persist::Detached {
                                    to,
                                    name: name.clone(),
                                    size,
                                    service,
                                    lifetime,
                                    priority,
                                },
                            ) {
                                Ok(p) => {
                                    if let Some(f) = self.out.get_mut(&flow) {
                                        f.persisted = Some(p);
                                    }
                                }
                                Err(e) => {
                                    let _ = self.node.abort(now, flow);
                                    self.out.remove(&flow);
                                    let _ = reply.send(Err((
                                        ErrorCode::NoSpace,
                                        format!("cannot keep the detached transfer on disk: {e}"),
                                    )));
                                    return;
                                }
                            }
                        }
                        let _ = reply.send(Ok(Opened {
                            flow,
                            first_bytes: self.first_bytes,
                        }));
                    }
                    Err(e) => {
                        let code = match e {
                            AppError::TooManyFlows(_) | AppError::TooManyWaitingFlows(_) => {
                                ErrorCode::NoSpace
                            }
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
                let Some(f) = self.out.get_mut(&flow) else {
                    return;
                };
                // A detached transfer's bytes go to disk, not to memory: the client may go
                // once they are there, and the transport reads them back from the disk
                // (persist.rs), however long its path is down.
                if let Some(p) = f.persisted.as_mut().filter(|p| p.writing()) {
                    match p.append(&data, last) {
                        Ok(()) => {
                            let _ = done.send(());
                            if last {
                                let (path, len) = p.data_file();
                                self.feed_persisted(flow, path, len);
                            }
                        }
                        Err(e) => {
                            warn!(%flow, error = %e, "cannot keep the detached transfer on disk; aborting it");
                            let _ = self.node.abort(now, flow);
                            if let Some(f) = self.end_outgoing(flow) {
                                let _ = f.updates.send(FlowUpdate::Failed {
                                    reason: format!("cannot keep the transfer on disk: {e}"),
                                });
                            }
                        }
                    }
                    return;
                }
                f.pending.push_back((data, Some(done)));
                f.finish |= last;
                self.feed(flow);
            }
            Cmd::Abort { flow } => {
                if let Some(f) = self.end_outgoing(flow) {
                    let _ = self.node.abort(now, flow);
                    self.counters.flows_cancelled += 1;
                    info!(%flow, to = f.to, name = %f.name, "flow cancelled: its client left before the end");
                }
            }
            Cmd::Detach { flow } => {
                if let Some(f) = self.out.get_mut(&flow) {
                    f.detached = true;
                    info!(%flow, to = f.to, name = %f.name, "flow left to the daemon by its client");
                }
            }
            Cmd::Cancel { flow, reply } => {
                let _ = reply.send(self.cancel(&flow));
            }
            Cmd::Events { reply } => {
                let _ = reply.send(self.events.subscribe());
            }
            Cmd::Inbox { reply } => {
                let _ = reply.send(self.inbox.values().cloned().collect());
            }
            Cmd::List { reply } => {
                let _ = reply.send((self.outgoing_list(), self.held_here()));
            }
            Cmd::Reload { reply } => {
                let r = self.reload();
                if let Err(e) = &r {
                    warn!(error = %e, "configuration not reloaded; the running one stays");
                }
                if let Some(reply) = reply {
                    let _ = reply.send(r);
                }
            }
            Cmd::Subscribe { tx, service } => {
                // The new client gets every file of its service no other client holds; what
                // it does not take comes back (`Return`) for the others.
                self.subscribers.insert(0, (service, tx));
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
            Cmd::Routes { routes } => {
                self.kernel_raw = routes;
                self.refresh_kernel_routes();
            }
            Cmd::Originators { table } => {
                self.batman_raw = table;
                self.refresh_batman_routes();
            }
        }
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

async fn readable_opt(s: &Option<Arc<UdpSocket>>) -> std::io::Result<()> {
    match s {
        Some(s) => s.readable().await,
        None => std::future::pending().await,
    }
}

async fn sleep_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
