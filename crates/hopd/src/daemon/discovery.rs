//! Neighbour discovery: with `discovery_address` set, a node says hello every
//! `hello_interval` (an authenticated datagram to the IPv4 broadcast address of its mesh
//! link), and learns its neighbours and their addresses from the hellos it hears, so that
//! `[[neighbours]]` becomes an optional override. A neighbour not heard for three and a half
//! intervals is forgotten. Two nodes with the same node id are detected by the random boot
//! nonce each puts in its hellos. Hellos go through the same authentication as everything
//! else: a node without the mesh key is not learned.
//!
//! Hello body: `"HELO"` | version 1 | listening port (u16) | boot nonce (u64). A node with a
//! key (identity.rs) sends version 2: the same, then its Ed25519 public key (32 bytes) and
//! its signature (64 bytes) of `"hop hello v2"` | node id (u32) | the first 15 bytes. A hello
//! whose signature fails, or whose node id is not its key's, is dropped; with a members file
//! so is one whose key is not a member's, or that has no key.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hop_proto::NodeId;
use hop_wire::{EnvelopeRepr, TransportId};
use tracing::{info, warn};

use super::{merged_routes, Daemon};

const MAGIC: &[u8; 4] = b"HELO";
const VERSION: u8 = 1;
const VERSION_SIGNED: u8 = 2;
const HEAD: usize = 15;
const SIGNED_LEN: usize = HEAD + 32 + crate::identity::SIGNATURE_LEN;

/// What a version 2 hello's signature covers.
fn signed_part(id: NodeId, head: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(12 + 4 + HEAD);
    m.extend_from_slice(b"hop hello v2");
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(head);
    m
}

/// A parsed hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hello {
    pub(super) port: u16,
    pub(super) nonce: u64,
    /// Version 2: the sender's public key, and whether its signature holds for `id`.
    pub(super) key: Option<(crate::identity::PublicKey, bool)>,
}

/// A neighbour learned from its hellos.
#[derive(Debug, Clone, Copy)]
pub(super) struct Discovered {
    pub(super) addr: SocketAddr,
    pub(super) last: Instant,
}

/// The socket that hears hellos on the broadcast address `a` when the event socket is bound
/// to one address. Several daemons on one host (tests, a second node id) may each have one:
/// the address is shared (`SO_REUSEADDR`: every such socket gets each broadcast).
pub(super) fn bind(
    cfg: &crate::config::Config,
    a: SocketAddr,
) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let domain = if a.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    if a.is_ipv4() {
        s.set_broadcast(true)?;
    } else {
        s.set_only_v6(true)?;
    }
    if let Some(ifname) = &cfg.interface {
        s.bind_device(Some(ifname.as_bytes()))?;
    }
    s.bind(&a.into()).map_err(|e| {
        std::io::Error::new(e.kind(), format!("binding discovery_address {a}: {e}"))
    })?;
    if a.is_ipv6() {
        crate::socket::join_groups(&s, cfg)?;
    }
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// A random number from the system's generator (hello nonces and jitter).
pub(super) fn random_u64() -> u64 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8];
    let _ = ring::rand::SystemRandom::new().fill(&mut b);
    u64::from_be_bytes(b)
}

/// The hello of node `id`, listening on `port`, this boot's `nonce`; signed with `key`.
pub(super) fn hello(
    id: NodeId,
    port: u16,
    nonce: u64,
    key: Option<&crate::identity::NodeKey>,
) -> Vec<u8> {
    let mut body = Vec::with_capacity(SIGNED_LEN);
    body.extend_from_slice(MAGIC);
    body.push(if key.is_some() {
        VERSION_SIGNED
    } else {
        VERSION
    });
    body.extend_from_slice(&port.to_be_bytes());
    body.extend_from_slice(&nonce.to_be_bytes());
    if let Some(k) = key {
        let sig = k.sign(&signed_part(id, &body));
        body.extend_from_slice(k.public());
        body.extend_from_slice(&sig);
    }
    let repr = EnvelopeRepr {
        transport: TransportId::Hello,
        flags: 0,
        link_src: id,
        link_dst: hop_wire::envelope::BROADCAST_NODE,
    };
    let mut out = Vec::new();
    let _ = repr.emit(&body, &mut out);
    out
}

/// The hello body `body` of node `id` (version 1 or 2).
pub(super) fn parse(id: NodeId, body: &[u8]) -> Option<Hello> {
    if body.len() < HEAD || &body[..4] != MAGIC {
        return None;
    }
    let port = u16::from_be_bytes([body[5], body[6]]);
    let nonce = u64::from_be_bytes(body[7..HEAD].try_into().ok()?);
    let key = match body[4] {
        VERSION => None,
        VERSION_SIGNED if body.len() >= SIGNED_LEN => {
            let key: crate::identity::PublicKey = body[HEAD..HEAD + 32].try_into().ok()?;
            let sig = &body[HEAD + 32..SIGNED_LEN];
            let ok = crate::identity::verify(&key, &signed_part(id, &body[..HEAD]), sig);
            Some((key, ok))
        }
        _ => return None,
    };
    Some(Hello { port, nonce, key })
}

impl Daemon {
    /// Whether a hello signed by `key` may be learned: always without a members file, else
    /// only a member's key.
    fn is_member_key(&self, key: Option<crate::identity::PublicKey>) -> bool {
        match (&self.cfg.members, key) {
            (None, _) => true,
            (Some(m), Some(k)) => m.iter().any(|m| m.key == k),
            (Some(_), None) => false,
        }
    }

    /// Whether datagrams from node `id` are taken: always without a members file, else
    /// only from members' ids.
    pub(super) fn is_member_id(&self, id: NodeId) -> bool {
        match &self.cfg.members {
            None => true,
            Some(m) => id == self.cfg.node_id || m.iter().any(|m| m.id == id),
        }
    }

    /// Send this node's hello now.
    pub(super) fn say_hello(&mut self) {
        if self.cfg.discovery_addresses.is_empty() {
            return;
        }
        let mut dg = hello(
            self.cfg.node_id,
            self.cfg.listen.port(),
            self.boot_nonce,
            self.cfg.node_key.as_deref(),
        );
        // With sessions hellos go unsealed (signed): a neighbour hears them before it has
        // this node's key.
        if self.sessions.is_none()
            && self
                .auth
                .seal(&mut dg, crate::auth::Stream::Control)
                .is_err()
        {
            return;
        }
        for to in self.cfg.discovery_addresses.clone() {
            match self.ctrl.try_send_to(&dg, to) {
                Ok(_) => {
                    self.counters.tx_datagrams += 1;
                    self.counters.tx_bytes += dg.len() as u64;
                }
                Err(e) => {
                    if let Some(n) = self.warn_hello.due(Instant::now()) {
                        warn!(to = %to, error = %e, failures = n, "cannot send hellos (discovery_address)");
                    }
                }
            }
        }
    }

    /// An authenticated hello from node `src` at `from`.
    pub(super) fn on_hello(&mut self, src: NodeId, from: Option<SocketAddr>, body: &[u8]) {
        if super::directory::is_directory(body) {
            // The directory travels with the hellos (directory.rs).
            self.on_directory(src, body);
            return;
        }
        let Some(Hello { port, nonce, key }) = parse(src, body) else {
            self.counters.auth_malformed += 1;
            return;
        };
        let Some(from) = from else { return };
        let now = Instant::now();
        match key {
            Some((k, false)) => {
                self.counters.auth_bad_hello += 1;
                if let Some(n) = self.warn_member.due(now) {
                    warn!(node = src, from = %from, key = %crate::identity::hex(&k), hellos = n,
                        "hello with a bad signature: dropped (a node with the mesh key but not this key)");
                }
                return;
            }
            Some((k, true)) if crate::identity::id_of(&k) != src => {
                self.counters.auth_bad_hello += 1;
                if let Some(n) = self.warn_member.due(now) {
                    warn!(node = src, from = %from, key_id = crate::identity::id_of(&k), hellos = n,
                        "hello whose node id is not its key's id: dropped; remove node_id from that node's configuration");
                }
                return;
            }
            _ => {}
        }
        if src != self.cfg.node_id && !self.is_member_key(key.map(|(k, _)| k)) {
            self.counters.auth_not_member += 1;
            if let Some(n) = self.warn_member.due(now) {
                match key {
                    Some((k, _)) => warn!(node = src, from = %from, hellos = n,
                        "hello from a node that is not a member: admit it with `hop admit {}` (and `hop reload`) if it belongs to the mesh",
                        crate::identity::hex(&k)),
                    None => warn!(node = src, from = %from, hellos = n,
                        "hello without a node key while members_file is set: give that node a key (`hop keygen`) and admit it"),
                }
            }
            return;
        }
        if src == self.cfg.node_id {
            if nonce != self.boot_nonce {
                if let Some(n) = self.warn_duplicate.due(Instant::now()) {
                    warn!(node = src, other = %from, hellos = n, "another node uses this node's id: give each node its own node_id");
                }
            }
            return;
        }
        if self.cfg.neighbours.iter().any(|n| n.id == src) {
            // Configured neighbours keep their configured address.
            return;
        }
        let addr = SocketAddr::new(from.ip(), port);
        let known = self.discovered.insert(src, Discovered { addr, last: now });
        match known {
            None => info!(neighbour = src, %addr, "neighbour discovered"),
            Some(d) if d.addr != addr => {
                info!(neighbour = src, %addr, old = %d.addr, "neighbour's address changed")
            }
            Some(_) => return,
        }
        self.addrs.insert(src, addr);
        if self.cfg.kernel_routes {
            // A learned neighbour may be the gateway of kernel routes (IPv6 link-local).
            self.refresh_kernel_routes();
        }
        self.apply_routes();
    }

    /// Hellos that reached the discovery socket.
    pub(super) fn receive_discovery(&mut self) {
        let Some(s) = self.discovery_rx.clone() else {
            return;
        };
        let mut buf = [0u8; 256];
        for _ in 0..64 {
            match s.try_recv_from(&mut buf) {
                Ok((n, from)) => self.receive_one(Some(from), &buf[..n], false),
                Err(_) => break,
            }
        }
    }

    /// Forget discovered neighbours not heard for three and a half hello intervals.
    pub(super) fn expire_discovered(&mut self) {
        let limit = self.cfg.hello_interval.mul_f32(3.5);
        let now = Instant::now();
        let gone: Vec<NodeId> = self
            .discovered
            .iter()
            .filter(|(_, d)| now.duration_since(d.last) > limit)
            .map(|(id, _)| *id)
            .collect();
        for id in &gone {
            self.discovered.remove(id);
            self.addrs.remove(id);
            self.hello_windows.remove(id);
            info!(
                neighbour = id,
                "neighbour lost: no hello for {:.0} s",
                limit.as_secs_f64()
            );
        }
        if !gone.is_empty() {
            if self.cfg.kernel_routes {
                self.refresh_kernel_routes();
            }
            self.apply_routes();
        }
    }

    /// Map the kernel's routes as last read to next hops with the current neighbours; the
    /// routing table is rebuilt if that changed them.
    pub(super) fn refresh_kernel_routes(&mut self) {
        let learned: Vec<(NodeId, std::net::IpAddr)> = self
            .discovered
            .iter()
            .map(|(id, d)| (*id, d.addr.ip()))
            .collect();
        let kernel = crate::netlink::next_hops(
            &self.cfg,
            &self.kernel_raw,
            &learned,
            &self.directory_hosts(),
        );
        if kernel != self.kernel_routes {
            info!(routes = kernel.len(), "kernel routes changed");
            self.kernel_routes = kernel;
            self.apply_routes();
        }
    }

    /// The core's routes: configured neighbours and routes, kernel routes, and discovered
    /// neighbours as their own next hops.
    pub(super) fn apply_routes(&mut self) {
        // batman-adv's next hops over the kernel's (which on bat0 name no gateway).
        let mut learned = self.kernel_routes.clone();
        learned.extend(self.batman_routes.iter().map(|(d, n)| (*d, *n)));
        let mut r = merged_routes(&self.cfg, &learned);
        for id in self.discovered.keys() {
            if hop_proto::routing::Routing::next_hop(&r, *id).is_none() {
                r.insert(*id, *id);
            }
        }
        self.node.set_routing(Box::new(r));
    }

    /// When the next hello goes: the interval, less up to a tenth at random so that nodes
    /// started together do not stay in step.
    pub(super) fn next_hello(&self) -> Duration {
        let i = self.cfg.hello_interval;
        let jitter = (random_u64() % 1000) as f64 / 10_000.0;
        i.mul_f64(1.0 - jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_round_trips() {
        let dg = hello(7, 7470, 42, None);
        let env = hop_wire::Envelope::parse(&dg).unwrap();
        assert_eq!(env.repr.transport, TransportId::Hello);
        assert_eq!(env.repr.link_src, 7);
        let h = parse(7, env.body).unwrap();
        assert_eq!((h.port, h.nonce, h.key), (7470, 42, None));
        assert_eq!(parse(7, &env.body[..10]), None);
    }

    #[test]
    fn a_signed_hello_is_bound_to_its_key_and_id() {
        let k = crate::identity::NodeKey::from_seed(&[3; 32]).unwrap();
        let id = k.node_id();
        let dg = hello(id, 7470, 42, Some(&k));
        let env = hop_wire::Envelope::parse(&dg).unwrap();
        let h = parse(id, env.body).unwrap();
        assert_eq!(h.key, Some((*k.public(), true)));
        // Claimed by another id, or with a bit changed, the signature fails.
        assert_eq!(
            parse(id ^ 1, env.body).unwrap().key,
            Some((*k.public(), false))
        );
        let mut body = env.body.to_vec();
        body[8] ^= 1;
        assert_eq!(parse(id, &body).unwrap().key, Some((*k.public(), false)));
        assert_eq!(parse(id, &env.body[..40]), None, "cut short");
    }
}
