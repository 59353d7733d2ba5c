//! The daemon's side of per-neighbour sessions (`[security] sessions`, session.rs): start
//! handshakes with member neighbours, answer theirs, hand the keys they give to the
//! authenticator, and replace this node's key when a member is revoked.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hop_proto::NodeId;
use tracing::{debug, info, warn};

use super::Daemon;
use crate::session::SessionError;

/// How often handshakes due are started and unanswered ones given up.
pub(super) const SESSION_TICK: Duration = Duration::from_millis(250);
/// How long a neighbour's previous key is still taken once it gave a new one (datagrams
/// sealed before the change and still on their way).
pub const SESSION_KEY_GRACE: Duration = Duration::from_secs(10);

impl Daemon {
    /// Member neighbours and the addresses their handshakes go to.
    fn session_neighbours(&self) -> Vec<(NodeId, SocketAddr)> {
        let mut v: Vec<(NodeId, SocketAddr)> = self
            .addrs
            .iter()
            .filter(|(id, _)| **id != self.cfg.node_id && self.is_member_id(**id))
            .map(|(id, a)| (*id, *a))
            .collect();
        v.sort();
        v
    }

    /// Start the handshakes that are due.
    pub(super) fn session_tick(&mut self) {
        let Some(mut s) = self.sessions.take() else {
            return;
        };
        let neighbours = self.session_neighbours();
        let auth = &self.auth;
        let out = s.poll(Instant::now(), &neighbours, &|id| auth.has_peer_key(id));
        self.counters.sessions_completed = s.stats.completed;
        self.counters.sessions_timed_out = s.stats.timed_out;
        self.sessions = Some(s);
        for (to, dg) in out {
            self.send_session(&dg, to);
        }
    }

    fn send_session(&mut self, dg: &[u8], to: SocketAddr) {
        match self.ctrl.try_send_to(dg, to) {
            Ok(_) => {
                self.counters.tx_datagrams += 1;
                self.counters.tx_bytes += dg.len() as u64;
            }
            Err(e) => debug!(to = %to, error = %e, "cannot send a session handshake"),
        }
    }

    /// A handshake datagram from `from`.
    pub(super) fn on_session(&mut self, from: Option<SocketAddr>, dg: &[u8]) {
        let Some(mut s) = self.sessions.take() else {
            self.counters.auth_failures += 1;
            return;
        };
        self.handle_session(&mut s, from, dg);
        self.counters.sessions_completed = s.stats.completed;
        self.sessions = Some(s);
    }

    fn handle_session(
        &mut self,
        s: &mut crate::session::Sessions,
        from: Option<SocketAddr>,
        dg: &[u8],
    ) {
        let Ok(env) = hop_wire::Envelope::parse(dg) else {
            self.counters.auth_malformed += 1;
            return;
        };
        let src = env.repr.link_src;
        if env.repr.link_dst != self.cfg.node_id {
            return;
        }
        let members = self.cfg.members.clone().unwrap_or_default();
        let is_member = |k: &crate::identity::PublicKey| members.iter().any(|m| m.key == *k);
        match s.handle(Instant::now(), src, env.body, &is_member) {
            Ok(r) => {
                if let (Some(reply), Some(to)) = (r.reply, from) {
                    self.send_session(&reply, to);
                }
                if let Some(k) = r.key {
                    if self.auth.set_peer_key(src, k.id, &k.key, SESSION_KEY_GRACE) {
                        info!(neighbour = src, key = %format!("{:08x}", k.id), "session: neighbour's key received");
                    }
                }
            }
            Err(e @ SessionError::Unexpected) => {
                // A late or repeated message of a handshake already over.
                debug!(node = src, from = ?from, error = %e, "session message dropped");
            }
            Err(e @ SessionError::Malformed) => {
                self.counters.auth_malformed += 1;
                debug!(node = src, from = ?from, error = %e, "session message dropped");
            }
            Err(e) => {
                self.counters.sessions_refused += 1;
                if let Some(n) = self.warn_session.due(Instant::now()) {
                    let hint = match &e {
                        SessionError::NotMember(k) => format!(
                            "admit it with `hop admit {}` if it belongs to the mesh",
                            crate::identity::hex(k)
                        ),
                        _ => "check that node's key and members file".into(),
                    };
                    warn!(node = src, from = ?from, error = %e, refused = n, "session handshake refused: {hint}");
                }
            }
        }
    }

    /// After the members changed: forget the keys of nodes no longer members, and if any
    /// was held, seal with a new key from now on, given to the remaining members by new
    /// handshakes, so the revoked node cannot open what this node sends next.
    pub(super) fn revoke_sessions(&mut self) {
        let Some(s) = self.sessions.as_mut() else {
            return;
        };
        let keyed: Vec<NodeId> = self.auth.keyed_peers().collect();
        let revoked: Vec<NodeId> = keyed
            .into_iter()
            .filter(|id| {
                !self
                    .cfg
                    .members
                    .as_ref()
                    .is_some_and(|m| m.iter().any(|m| m.id == *id))
            })
            .collect();
        if revoked.is_empty() {
            return;
        }
        for id in &revoked {
            self.auth.forget_peer(*id);
            s.forget(*id);
        }
        match s.rotate() {
            Ok(k) => {
                self.auth.set_own(k.id, &k.key);
                info!(
                    revoked = ?revoked,
                    key = %format!("{:08x}", k.id),
                    "session: new sender key after a revocation; giving it to the members"
                );
            }
            Err(e) => {
                warn!(error = %e, "cannot make a new sender key; the revoked node can still read this node's datagrams")
            }
        }
    }

    /// A datagram from a member under a key this node does not hold (a neighbour that
    /// restarted or changed its key): redo the handshake with it soon.
    pub(super) fn session_key_missing(&mut self, src: NodeId) {
        if !self.is_member_id(src) {
            return;
        }
        if let Some(s) = self.sessions.as_mut() {
            s.suspect_stale(src, Instant::now());
        }
    }
}
