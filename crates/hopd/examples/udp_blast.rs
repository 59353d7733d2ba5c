//! Reference UDP senders for the hopd benchmark (`scripts/bench-hopd.sh`): how fast the same
//! chain carries plain UDP from a sender that batches system calls.
//!
//! ```text
//! udp_blast recv ADDR:PORT SECS                 # count bytes for at most SECS, print JSON
//! udp_blast send ADDR:PORT SECS sendmmsg SIZE   # batches of 64 datagrams of SIZE bytes
//! udp_blast send ADDR:PORT SECS gso SIZE        # 64 KiB buffers cut into SIZE-byte datagrams
//! ```
//!
//! `sendmmsg` hands the kernel 64 datagrams per call; `gso` hands it one buffer per call that
//! the kernel (UDP_SEGMENT) or the device cuts into datagrams of SIZE bytes, as hopd's data
//! socket does. The receiver asks for UDP GRO, so a burst that stays aggregated on a veth is
//! read whole, reads up to 64 datagrams per recvmmsg call, and reports the bytes of datagram payload it received between its first
//! datagram and its last, as `{"bytes": .., "secs": .., "mbps": ..}`. Not a tool for users:
//! run by the benchmark only.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

const BATCH: usize = 64;
/// `UDP_SEGMENT` and `UDP_GRO` (linux/udp.h).
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage =
        "usage: udp_blast recv ADDR:PORT SECS | udp_blast send ADDR:PORT SECS sendmmsg|gso SIZE";
    let (Some(cmd), Some(addr), Some(secs)) = (args.get(1), args.get(2), args.get(3)) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let addr: SocketAddr = addr.parse().unwrap_or_else(|e| {
        eprintln!("{addr}: {e}");
        std::process::exit(2)
    });
    let secs = Duration::from_secs_f64(secs.parse().unwrap_or(5.0));
    let result = match cmd.as_str() {
        "recv" => recv(addr, secs),
        "send" => {
            let mode = args.get(4).map(String::as_str).unwrap_or("sendmmsg");
            let size: usize = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(1400);
            send(addr, secs, mode, size)
        }
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("udp_blast: {e}");
        std::process::exit(1);
    }
}

fn recv(addr: SocketAddr, limit: Duration) -> std::io::Result<()> {
    let sock = UdpSocket::bind(addr)?;
    let one: libc::c_int = 1;
    // SAFETY: setsockopt on a socket we own with a correctly sized int.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            UDP_GRO,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        let size: libc::c_int = 64 << 20;
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            &size as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    sock.set_read_timeout(Some(Duration::from_millis(500)))?;
    // Up to BATCH datagrams (or GRO aggregates) per recvmmsg call, so that the receiver is
    // not what limits a batching sender.
    let mut bufs = vec![0u8; 65_536 * BATCH];
    let (mut bytes, mut first, mut last) = (0u64, None::<Instant>, Instant::now());
    let start = Instant::now();
    while start.elapsed() < limit {
        let mut iov: Vec<libc::iovec> = bufs
            .chunks_mut(65_536)
            .map(|c| libc::iovec {
                iov_base: c.as_mut_ptr() as *mut libc::c_void,
                iov_len: c.len(),
            })
            .collect();
        // SAFETY: zeroed mmsghdrs, each pointing at one iovec of `iov`, which outlives the
        // call; blocking (SO_RCVTIMEO applies) until at least one datagram.
        let mut msgs: Vec<libc::mmsghdr> = iov
            .iter_mut()
            .map(|v| {
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_iov = v as *mut libc::iovec;
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();
        // SAFETY: as above.
        let n = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut
            {
                if first.is_some() {
                    break; // the sender stopped
                }
                continue;
            }
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let now = Instant::now();
        first.get_or_insert(now);
        last = now;
        bytes += msgs[..n as usize]
            .iter()
            .map(|m| u64::from(m.msg_len))
            .sum::<u64>();
    }
    let secs = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    let mbps = if secs > 0.0 {
        bytes as f64 * 8.0 / secs / 1e6
    } else {
        0.0
    };
    println!("{{\"bytes\": {bytes}, \"secs\": {secs:.3}, \"mbps\": {mbps:.1}}}");
    Ok(())
}

fn send(addr: SocketAddr, limit: Duration, mode: &str, size: usize) -> std::io::Result<()> {
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse().unwrap()
    } else {
        "[::]:0".parse().unwrap()
    };
    let sock = UdpSocket::bind(bind)?;
    sock.connect(addr)?;
    let fd = sock.as_raw_fd();
    let payload = vec![0x5au8; size * BATCH];
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < limit {
        let sent = match mode {
            "sendmmsg" => {
                let mut iov: Vec<libc::iovec> = (0..BATCH)
                    .map(|i| libc::iovec {
                        iov_base: payload[i * size..].as_ptr() as *mut libc::c_void,
                        iov_len: size,
                    })
                    .collect();
                // SAFETY: zeroed mmsghdr is valid; each points at one iovec of `iov`, which
                // outlives the call.
                let mut msgs: Vec<libc::mmsghdr> = (0..BATCH)
                    .map(|i| {
                        let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                        m.msg_hdr.msg_iov = &mut iov[i] as *mut libc::iovec;
                        m.msg_hdr.msg_iovlen = 1;
                        m
                    })
                    .collect();
                // SAFETY: `msgs` holds BATCH initialised headers on a connected socket.
                unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), BATCH as libc::c_uint, 0) }
            }
            "gso" => {
                let len = (size * BATCH).min(65_507 / size * size);
                let mut iov = libc::iovec {
                    iov_base: payload.as_ptr() as *mut libc::c_void,
                    iov_len: len,
                };
                let mut cbuf = [0u8; 64];
                // SAFETY: a msghdr with one iovec and a control buffer large enough for one
                // u16 cmsg (CMSG_SPACE(2) <= 64), filled through the CMSG macros.
                unsafe {
                    let mut m: libc::msghdr = std::mem::zeroed();
                    m.msg_iov = &mut iov;
                    m.msg_iovlen = 1;
                    m.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
                    m.msg_controllen = libc::CMSG_SPACE(2) as usize;
                    let c = libc::CMSG_FIRSTHDR(&m);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, size as u16);
                    libc::sendmsg(fd, &m, 0) as libc::c_int
                }
            }
            other => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("mode {other}: sendmmsg or gso"),
                ))
            }
        };
        if sent < 0 {
            let e = std::io::Error::last_os_error();
            // A full socket buffer or a refused datagram (no receiver yet): go on.
            if !matches!(
                e.raw_os_error(),
                Some(libc::ENOBUFS) | Some(libc::EAGAIN) | Some(libc::ECONNREFUSED)
            ) {
                return Err(e);
            }
        }
        calls += 1;
    }
    eprintln!(
        "udp_blast: {calls} calls in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
