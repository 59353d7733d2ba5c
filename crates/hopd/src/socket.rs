//! The daemon's UDP sockets: creation with TOS, buffer sizes and interface binding, and
//! batched sends through Tokio. Used by the daemon core and by the overhearing socket.

use std::net::SocketAddr;

use tokio::net::UdpSocket;

use crate::config::{Config, LinkMode};

/// The IP TOS byte carrying `dscp` (ECN bits clear).
pub(crate) fn tos(dscp: u8) -> u32 {
    u32::from(dscp) << 2
}
/// Socket buffer size requested for both sockets.
pub(crate) const SOCKET_BUFFER: usize = 8 * 1024 * 1024;

pub(crate) fn io_err(context: &str, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{context}: {e}"))
}

pub(crate) fn make_socket(
    cfg: &Config,
    bind: SocketAddr,
    tos: u32,
) -> std::io::Result<std::net::UdpSocket> {
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
    if bind.is_ipv4() && (cfg.link_mode == LinkMode::Broadcast || cfg.discovery_address.is_some()) {
        s.set_broadcast(true)?;
    }
    let groups = multicast_groups(cfg);
    if let Some(SocketAddr::V6(g)) = groups.first() {
        // Multicast leaves on the mesh interface, and this node's own datagrams do not come
        // back to it (as its own IPv4 broadcasts would not either, but for the kernel's loop).
        s.set_multicast_if_v6(g.scope_id())?;
        s.set_multicast_loop_v6(false)?;
    }
    if let Some(ifname) = &cfg.interface {
        s.bind_device(Some(ifname.as_bytes()))
            .map_err(|e| io_err(&format!("binding to interface {ifname}"), e))?;
    }
    s.bind(&bind.into())
        .map_err(|e| io_err(&format!("binding {bind}"), e))?;
    if bind.ip().is_unspecified() && bind.is_ipv6() && bind.port() != 0 {
        // The receiving socket hears the groups hellos and broadcast data go to.
        join_groups(&s, cfg)?;
    }
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// The IPv6 multicast groups this node sends to and hears (`discovery_address`,
/// `broadcast_address`).
pub(crate) fn multicast_groups(cfg: &Config) -> Vec<SocketAddr> {
    [cfg.discovery_address, cfg.broadcast_address]
        .into_iter()
        .flatten()
        .filter(|a| a.is_ipv6() && a.ip().is_multicast())
        .collect()
}

/// Join every IPv6 group of `cfg` on its interface.
pub(crate) fn join_groups(s: &socket2::Socket, cfg: &Config) -> std::io::Result<()> {
    for g in multicast_groups(cfg) {
        if let SocketAddr::V6(g) = g {
            s.join_multicast_v6(g.ip(), g.scope_id())
                .map_err(|e| io_err(&format!("joining multicast group {g}"), e))?;
        }
    }
    Ok(())
}

/// `a` with the index of interface `ifname` as its IPv6 scope (link-local groups and
/// addresses name their link); unchanged for IPv4, a scope already given, or an interface
/// that does not exist here (binding to it then fails with its own message).
pub(crate) fn scoped(a: SocketAddr, ifname: &str) -> SocketAddr {
    match a {
        SocketAddr::V6(mut v6) if v6.scope_id() == 0 => {
            let Ok(name) = std::ffi::CString::new(ifname) else {
                return a;
            };
            // SAFETY: if_nametoindex reads a NUL-terminated name; 0 means no such interface.
            let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
            if index != 0 {
                v6.set_scope_id(index);
            }
            SocketAddr::V6(v6)
        }
        _ => a,
    }
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

/// Batched sends through the tokio sockets, so a full socket clears tokio's write readiness
/// and the daemon waits for it to become writable again.
pub(crate) struct TokioSender<'a> {
    pub(crate) ctrl: &'a UdpSocket,
    pub(crate) data: &'a UdpSocket,
    pub(crate) inner: crate::io::MmsgSender,
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
