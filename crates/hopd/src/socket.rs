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
    if cfg.link_mode == LinkMode::Broadcast || cfg.discovery_address.is_some() {
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
