//! The datapath: batched receive, overheard datagrams, authentication, and transmission with
//! the link queue's status.

use std::net::SocketAddr;

use hop_proto::{Class, Instant, NodeId};
use tracing::{debug, warn};

use super::Daemon;
use crate::auth::{AuthError, Stream};
use crate::config::LinkMode;
use crate::socket::TokioSender;

/// Datagrams read per wake-up before other work is served.
pub(super) const RX_BATCH: usize = 256;
/// Datagrams sent per loop iteration before receiving again (the daemon's link queue).
pub(super) const TX_BATCH: usize = 128;

impl Daemon {
    pub(super) fn receive_batch(&mut self) {
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

    /// A datagram of another wire version (docs/wire-format.md): nodes of different releases
    /// cannot talk, and without this warning a neighbour would only seem silent.
    fn other_version(&mut self, from: Option<std::net::SocketAddr>, version: u8) {
        if let Some(n) = self.warn_version.due(std::time::Instant::now()) {
            warn!(
                from = ?from,
                version,
                ours = hop_wire::envelope::VERSION,
                datagrams = n,
                "datagrams of another wire version: dropped; its node runs another release of \
                 hopd, so upgrade every node of the mesh to one release"
            );
        }
    }

    /// Datagrams the packet socket holds (neighbours' unicast to each other), up to
    /// [`RX_BATCH`] at a time.
    pub(super) fn receive_overheard(&mut self) {
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

    pub(super) fn receive_one(&mut self, from: Option<SocketAddr>, dg: &[u8], overheard: bool) {
        let n = dg.len();
        if !overheard {
            self.counters.rx_datagrams += 1;
            self.counters.rx_bytes += n as u64;
        }
        // Hellos (neighbour discovery) are the daemon's, not the core's; one with this node's
        // id may be another node's (discovery.rs), so it is not dropped as an echo.
        let hello = n >= 4 && dg[3] == hop_wire::TransportId::Hello as u8;
        // Our own broadcasts come back to us: drop them before authentication.
        if !hello && n >= 12 && dg[8..12] == self.cfg.node_id.to_be_bytes() {
            return;
        }
        // Session handshakes (sessions = true) protect themselves (session.rs); what is
        // overheard of other nodes' handshakes is not this node's.
        if n >= 4 && dg[3] == hop_wire::TransportId::Session as u8 && self.sessions.is_some() {
            if !overheard {
                self.on_session(from, dg);
            }
            return;
        }
        // With sessions, hellos travel unsealed (a neighbour without this node's key must
        // hear them) and signed: `on_hello` checks the signature and the members file.
        if hello && self.sessions.is_some() {
            if let Ok(env) = hop_wire::Envelope::parse(dg) {
                if env.repr.flags & hop_wire::envelope::FLAG_AUTH == 0 {
                    let src = env.repr.link_src;
                    self.on_hello(src, from, env.body);
                    if src != self.cfg.node_id && self.is_member_id(src) {
                        self.last_heard.insert(src, std::time::Instant::now());
                    }
                    return;
                }
            }
        }
        // An encrypted datagram is decrypted into this buffer and handed on from there.
        let mut plain = std::mem::take(&mut self.rx_plain);
        let opened = self.auth.open(dg, &mut plain);
        // Taken under the previous mesh key: a neighbour not yet given the new one.
        self.counters.auth_previous_key = self.auth.opened_with_previous;
        let dg: &[u8] = if plain.is_empty() { dg } else { &plain };
        match opened {
            Ok(src) if hello => {
                if src != self.cfg.node_id {
                    self.last_heard.insert(src, std::time::Instant::now());
                }
                // Opened: the tag covered what the crc would (auth.rs).
                if let Ok(env) = hop_wire::Envelope::parse_authenticated(dg) {
                    self.on_hello(src, from, env.body);
                }
            }
            Ok(src) if !self.is_member_id(src) => {
                self.counters.auth_not_member += 1;
                if let Some(n) = self.warn_member.due(std::time::Instant::now()) {
                    warn!(
                        node = src,
                        from = ?from,
                        datagrams = n,
                        "datagrams from a node that is not in members_file: dropped (admit its key \
                         with `hop admit KEY`, or it was revoked)"
                    );
                }
            }
            Ok(src) => {
                if !overheard
                    && !self.addrs.contains_key(&src)
                    && self.cfg.link_mode == LinkMode::Unicast
                {
                    // An authenticated node this one cannot answer: its address is missing.
                    let now = std::time::Instant::now();
                    if let Some(n) = self.warn_unknown.due(now) {
                        warn!(
                            node = src,
                            from = ?from,
                            datagrams = n,
                            "datagrams from a node that is not among [[neighbours]]: this node cannot \
                             answer it; add it (id and address) to [[neighbours]] and `hop reload`"
                        );
                    }
                }
                // One clock read per datagram serves both.
                let wall = std::time::Instant::now();
                self.last_heard.insert(src, wall);
                let e = self.rx_by_peer.entry(src).or_default();
                e.0 += 1;
                e.1 += n as u64;
                let now = Instant::from_nanos(
                    wall.saturating_duration_since(self.clock).as_nanos() as u64,
                );
                if let Err(e) = self.node.handle_datagram(now, dg) {
                    self.counters.rx_rejected += 1;
                    if let hop_proto::RecvError::Wire(hop_wire::Error::UnsupportedVersion(v)) = e {
                        self.other_version(from, v);
                    }
                    debug!(?from, error = %e, "datagram rejected by the core");
                }
            }
            Err(e) => {
                let now = std::time::Instant::now();
                let from_s = from.map_or("?".to_string(), |a| a.to_string());
                match e {
                    AuthError::Replay(_) => {
                        self.counters.auth_replays += 1;
                        if let Some(n) = self.warn_replay.due(now) {
                            warn!(
                                from = %from_s,
                                dropped = n,
                                "datagrams dropped as replays: their sender's counter went back, \
                                 e.g. it restarted with its clock behind the previous run; set its \
                                 clock (or restart this node) and see docs/hopd.md, Datagrams on the wire"
                            );
                        }
                    }
                    AuthError::TooManyPeers(_) => self.counters.auth_peer_limit += 1,
                    AuthError::NoKey(src) => {
                        self.counters.auth_no_key += 1;
                        self.session_key_missing(src);
                    }
                    AuthError::BadTag if self.sessions.is_some() => {
                        self.counters.auth_failures += 1;
                        let src = u32::from_be_bytes([dg[8], dg[9], dg[10], dg[11]]);
                        self.session_key_missing(src);
                        if let Some(n) = self.warn_auth.due(now) {
                            warn!(
                                from = %from_s,
                                node = src,
                                dropped = n,
                                "datagrams fail authentication under the key their sender gave \
                                 this node: it restarted or changed its key (a new handshake \
                                 follows), or they are forged"
                            );
                        }
                    }
                    AuthError::Malformed(hop_wire::Error::UnsupportedVersion(v)) => {
                        self.counters.auth_malformed += 1;
                        self.other_version(from, v);
                    }
                    AuthError::Malformed(_) => self.counters.auth_malformed += 1,
                    _ => {
                        self.counters.auth_failures += 1;
                        if let Some(n) = self.warn_auth.due(now) {
                            warn!(
                                from = %from_s,
                                dropped = n,
                                "datagrams fail authentication: the sender has another \
                                 [security] mesh_key (or is not a Hop node); give every node the \
                                 same key"
                            );
                        }
                    }
                }
                debug!(?from, error = %e, "datagram dropped");
            }
        }
        self.rx_plain = plain;
    }

    pub(super) fn dest_addr(&self, next_hop: NodeId, class: Class) -> Option<SocketAddr> {
        if class == Class::Data && self.cfg.link_mode == LinkMode::Broadcast {
            return self.cfg.broadcast_address;
        }
        self.addrs.get(&next_hop).copied()
    }

    /// Move up to [`TX_BATCH`] datagrams from the core to the sockets. The core is polled only
    /// while the previous ones have all been taken by the kernel (the pull model: a full
    /// socket is a full link queue).
    pub(super) fn flush_tx(&mut self) {
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
            // `Acked` (the baselines') travels as data, always unicast (`dest_addr`).
            let stream = match t.class {
                Class::Data | Class::Acked => Stream::Data,
                Class::Control => Stream::Control,
            };
            if self.auth.seal(&mut payload, stream).is_err() {
                self.counters.tx_errors += 1;
                continue;
            }
            let e = self.tx_by_peer.entry(t.next_hop).or_default();
            e.0 += 1;
            e.1 += payload.len() as u64;
            self.txq.push(crate::io::Datagram {
                dest: addr,
                data: t.class != Class::Control,
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
    pub(super) fn send_queued(&mut self) -> bool {
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
}

/// A warning logged at most once per [`WARN_INTERVAL`], with the count of its occurrences
/// since the last one: an operator sees the problem without a log line per datagram.
#[derive(Debug, Default)]
pub(super) struct RateLimited {
    last: Option<std::time::Instant>,
    count: u64,
}

/// The shortest time between two of the same warning.
pub(super) const WARN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

impl RateLimited {
    /// Count one occurrence; `Some(occurrences)` when the warning is due now.
    pub(super) fn due(&mut self, now: std::time::Instant) -> Option<u64> {
        self.count += 1;
        if self.last.is_some_and(|t| now < t + WARN_INTERVAL) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}
