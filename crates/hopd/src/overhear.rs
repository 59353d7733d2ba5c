//! Overhearing the unicast datagrams neighbours send each other.
//!
//! On a shared wireless medium every node in range receives a unicast frame; the kernel drops
//! those addressed to another MAC before they reach a UDP socket, but a packet socket still
//! sees them (`PACKET_OTHERHOST`). With `overhear = true` hopd opens one (`AF_PACKET`, which
//! needs CAP_NET_RAW) and hands the mesh's datagrams on it to the node as overheard: HxH's
//! passive feedback (HxH §3.2) learns from them that the next hop forwarded a packet, and Hop
//! caches the data it overhears (Hop §3.2). A classic BPF filter in the kernel keeps only UDP
//! datagrams to the mesh port that were meant for another host, so nothing else is copied to
//! user space: IPv4 ones, or IPv6 ones (UDP right after the fixed header) for a node that
//! listens on IPv6.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;

use socket2::{Domain, Protocol, Socket, Type};

/// Largest packet read: an IPv4 packet (or a GSO aggregate of them), its Ethernet header and
/// its virtio header.
const BUF: usize = 65_536 + ETH_HDR + VNET_HDR;
/// The link header of the frames (Ethernet, as Linux presents Wi-Fi, tap and veth devices).
const ETH_HDR: usize = 14;
/// `struct virtio_net_hdr` before each packet (`PACKET_VNET_HDR`): a sender's UDP GSO
/// aggregate crosses a veth or bridge whole, and this header gives its segment size.
const VNET_HDR: usize = 10;
/// `PACKET_VNET_HDR` (linux/if_packet.h).
const PACKET_VNET_HDR: libc::c_int = 15;

// Classic BPF opcodes (linux/filter.h, linux/bpf_common.h).
const BPF_LD: u16 = 0x00;
const BPF_LDX: u16 = 0x01;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_W: u16 = 0x00;
const BPF_H: u16 = 0x08;
const BPF_B: u16 = 0x10;
const BPF_ABS: u16 = 0x20;
const BPF_IND: u16 = 0x40;
const BPF_MSH: u16 = 0xa0;
const BPF_JEQ: u16 = 0x10;
const BPF_JSET: u16 = 0x40;
const BPF_K: u16 = 0x00;
/// `SKF_AD_OFF + SKF_AD_PKTTYPE`: loads the packet type (linux/filter.h).
const AD_PKTTYPE: u32 = 0xffff_f000 + 4;
/// `PACKET_OTHERHOST` (linux/if_packet.h): a frame for another host's link address.
const PACKET_OTHERHOST: u32 = 3;
const IPPROTO_UDP: u32 = 17;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The kernel-side filter: another host's IPv4 packet (after the Ethernet header), UDP, not a
/// later fragment, to `port`.
pub fn filter(port: u16) -> Vec<libc::sock_filter> {
    let ip = ETH_HDR as u32;
    vec![
        /* 0 */ stmt(BPF_LD | BPF_W | BPF_ABS, AD_PKTTYPE),
        /* 1 */ jump(BPF_JMP | BPF_JEQ | BPF_K, PACKET_OTHERHOST, 0, 8),
        /* 2 */ stmt(BPF_LD | BPF_B | BPF_ABS, ip + 9),
        /* 3 */ jump(BPF_JMP | BPF_JEQ | BPF_K, IPPROTO_UDP, 0, 6),
        /* 4 */ stmt(BPF_LD | BPF_H | BPF_ABS, ip + 6),
        /* 5 */ jump(BPF_JMP | BPF_JSET | BPF_K, 0x1fff, 4, 0),
        /* 6 */ stmt(BPF_LDX | BPF_B | BPF_MSH, ip),
        /* 7 */ stmt(BPF_LD | BPF_H | BPF_IND, ip + 2),
        /* 8 */ jump(BPF_JMP | BPF_JEQ | BPF_K, u32::from(port), 0, 1),
        /* 9 */ stmt(BPF_RET | BPF_K, BUF as u32),
        /* 10 */ stmt(BPF_RET | BPF_K, 0),
    ]
}

/// The IPv6 filter: another host's IPv6 packet whose next header is UDP (no extension
/// headers: Hop's datagrams carry none), to `port`.
pub fn filter_v6(port: u16) -> Vec<libc::sock_filter> {
    let ip = ETH_HDR as u32;
    vec![
        /* 0 */ stmt(BPF_LD | BPF_W | BPF_ABS, AD_PKTTYPE),
        /* 1 */ jump(BPF_JMP | BPF_JEQ | BPF_K, PACKET_OTHERHOST, 0, 5),
        /* 2 */ stmt(BPF_LD | BPF_B | BPF_ABS, ip + 6),
        /* 3 */ jump(BPF_JMP | BPF_JEQ | BPF_K, IPPROTO_UDP, 0, 3),
        /* 4 */ stmt(BPF_LD | BPF_H | BPF_ABS, ip + 40 + 2),
        /* 5 */ jump(BPF_JMP | BPF_JEQ | BPF_K, u32::from(port), 0, 1),
        /* 6 */ stmt(BPF_RET | BPF_K, BUF as u32),
        /* 7 */ stmt(BPF_RET | BPF_K, 0),
    ]
}

/// The source and the datagrams of one frame read with its virtio header: one UDP payload,
/// or the segments of a GSO aggregate (`gso_size` bytes each, the last one shorter).
pub fn datagrams(read: &[u8], port: u16) -> Option<(SocketAddr, Vec<&[u8]>)> {
    if read.len() < VNET_HDR + ETH_HDR {
        return None;
    }
    let v6 = match read[VNET_HDR + 12..VNET_HDR + 14] {
        [0x08, 0x00] => false,
        [0x86, 0xdd] => true,
        _ => return None,
    };
    let gso_type = read[1];
    let gso_size = usize::from(u16::from_ne_bytes([read[4], read[5]]));
    let pkt = &read[VNET_HDR + ETH_HDR..];
    let header = if v6 { udp_header_v6 } else { udp_header };
    if gso_type == 0 {
        if !v6 {
            let (src, body) = udp_payload(pkt, port)?;
            return Some((src, vec![body]));
        }
        let (src, udp) = header(pkt, port)?;
        let ulen = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
        if ulen < 8 || ulen > udp.len() {
            return None;
        }
        return Some((src, vec![&udp[8..ulen]]));
    }
    // An aggregate: its IP and UDP lengths describe the whole; the segments follow the UDP
    // header back to back.
    if gso_size == 0 {
        return None;
    }
    let (src, udp) = header(pkt, port)?;
    Some((src, udp[8..].chunks(gso_size).collect()))
}

/// The source and the UDP packet (header included) of an IPv6 packet to `port` whose next
/// header is UDP, up to the payload length.
fn udp_header_v6(pkt: &[u8], port: u16) -> Option<(SocketAddr, &[u8])> {
    if pkt.len() < 48 || pkt[0] >> 4 != 6 || u32::from(pkt[6]) != IPPROTO_UDP {
        return None;
    }
    let payload = usize::from(u16::from_be_bytes([pkt[4], pkt[5]]));
    // An aggregate's payload length may be 0: then the packet as read.
    let end = if payload == 0 {
        pkt.len()
    } else {
        40 + payload
    };
    if end < 48 || end > pkt.len() {
        return None;
    }
    let udp = &pkt[40..end];
    if u16::from_be_bytes([udp[2], udp[3]]) != port {
        return None;
    }
    let src: [u8; 16] = pkt[8..24].try_into().ok()?;
    let sport = u16::from_be_bytes([udp[0], udp[1]]);
    Some((
        SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::from(src)), sport),
        udp,
    ))
}

/// The source and the UDP packet (header included) of an IPv4 packet to `port`, up to the
/// IP total length.
fn udp_header(pkt: &[u8], port: u16) -> Option<(SocketAddr, &[u8])> {
    if pkt.len() < 20 || pkt[0] >> 4 != 4 || u32::from(pkt[9]) != IPPROTO_UDP {
        return None;
    }
    let ihl = usize::from(pkt[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([pkt[2], pkt[3]]));
    let frag = u16::from_be_bytes([pkt[6], pkt[7]]);
    // A fragment (more to come, or a later piece) is not a whole datagram. An aggregate's
    // total length may be 0 (larger than 64 KiB is not possible here, but GSO leaves it to
    // the segments): then the packet as read.
    let total = if total == 0 { pkt.len() } else { total };
    if ihl < 20 || frag & 0x3fff != 0 || total < ihl + 8 || total > pkt.len() {
        return None;
    }
    let udp = &pkt[ihl..total];
    if u16::from_be_bytes([udp[2], udp[3]]) != port {
        return None;
    }
    let src = Ipv4Addr::new(pkt[12], pkt[13], pkt[14], pkt[15]);
    let sport = u16::from_be_bytes([udp[0], udp[1]]);
    Some((SocketAddr::new(IpAddr::V4(src), sport), udp))
}

/// The source and UDP payload of an IPv4 packet carrying a datagram to `port`; `None` for
/// anything else (the filter should have dropped it) or a truncated packet.
pub fn udp_payload(pkt: &[u8], port: u16) -> Option<(SocketAddr, &[u8])> {
    if pkt.len() >= 4 && pkt[2..4] == [0, 0] {
        return None; // a whole datagram states its length
    }
    let (src, udp) = udp_header(pkt, port)?;
    let ulen = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    if ulen < 8 || ulen > udp.len() {
        return None;
    }
    Some((src, &udp[8..ulen]))
}

/// A libc call's return value as a result, its error naming what failed.
fn os_result(r: libc::c_int, what: &str) -> io::Result<()> {
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    Err(io::Error::new(
        e.kind(),
        format!("overhearing: {what}: {e}"),
    ))
}

/// A packet socket that receives the mesh's datagrams for other hosts.
pub struct Overhear {
    sock: tokio::io::unix::AsyncFd<Socket>,
    port: u16,
    buf: Box<[u8]>,
}

impl Overhear {
    /// Open on `interface` (every interface when `None`) for datagrams to `port`, IPv6 ones
    /// if `v6`, else IPv4 ones.
    pub fn open(interface: Option<&str>, port: u16, v6: bool) -> io::Result<Overhear> {
        let eth_p = if v6 { libc::ETH_P_IPV6 } else { libc::ETH_P_IP };
        let proto = (eth_p as u16).to_be();
        let sock = Socket::new(
            Domain::PACKET,
            Type::RAW,
            Some(Protocol::from(i32::from(proto))),
        )
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("opening a packet socket to overhear (needs CAP_NET_RAW): {e}"),
            )
        })?;
        // Filter first, so nothing unfiltered queues before the bind.
        sock.attach_filter(&if v6 { filter_v6(port) } else { filter(port) })?;
        // A neighbour's burst must not overflow it (the datagrams would just be unheard).
        crate::socket::force_buffers(&sock);
        let r = crate::io::set_int_option(sock.as_raw_fd(), libc::SOL_PACKET, PACKET_VNET_HDR, 1);
        os_result(r, "PACKET_VNET_HDR")?;
        let ifindex = match interface {
            Some(name) => {
                let c = std::ffi::CString::new(name).map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidInput, "interface name with a NUL")
                })?;
                // SAFETY: a NUL-terminated string we own.
                let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
                if i == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("no interface {name} to overhear on"),
                    ));
                }
                i as i32
            }
            None => 0,
        };
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex;
        // SAFETY: bind with a correctly sized sockaddr_ll on a socket we own.
        let r = unsafe {
            libc::bind(
                sock.as_raw_fd(),
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        os_result(r, "binding the packet socket")?;
        sock.set_nonblocking(true)?;
        // SAFETY: the Socket owns its descriptor and keeps it open, unchanged, until the
        // AsyncFd drops it.
        let sock = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(sock, tokio::io::Interest::READABLE)
        }
        .map_err(io::Error::from)?;
        Ok(Overhear {
            sock,
            port,
            buf: vec![0u8; BUF].into_boxed_slice(),
        })
    }

    /// Wait until datagrams may be queued; [`drain`](Self::drain) clears the readiness
    /// when it finds the socket empty.
    pub async fn readable(&self) -> io::Result<()> {
        self.sock.readable().await.map(|_guard| ())
    }

    /// Hand up to `max` queued datagrams to `f`, without waiting; returns how many.
    /// Packets the filter let through that do not parse are skipped.
    pub fn drain(&mut self, max: usize, mut f: impl FnMut(SocketAddr, &[u8])) -> io::Result<usize> {
        let mut count = 0;
        while count < max {
            let buf = &mut self.buf;
            let got = self.sock.try_io(tokio::io::Interest::READABLE, |s| {
                // SAFETY: recv into a buffer we own, of its length.
                let n = unsafe {
                    libc::recv(
                        s.as_raw_fd(),
                        buf.as_mut_ptr() as *mut libc::c_void,
                        buf.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            let n = match got {
                Ok(n) => n,
                // try_io cleared the readiness: the next wait sleeps until a datagram comes.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if let Some((src, dgs)) = datagrams(&self.buf[..n], self.port) {
                for d in dgs {
                    f(src, d);
                    count += 1;
                }
            }
        }
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(dport: u16, frag: u16, payload: &[u8]) -> Vec<u8> {
        let total = 20 + 8 + payload.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[6..8].copy_from_slice(&frag.to_be_bytes());
        p[8] = 64;
        p[9] = 17;
        p[12..16].copy_from_slice(&[10, 77, 0, 3]);
        p[16..20].copy_from_slice(&[10, 77, 0, 4]);
        p[20..22].copy_from_slice(&40000u16.to_be_bytes());
        p[22..24].copy_from_slice(&dport.to_be_bytes());
        p[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p[28..].copy_from_slice(payload);
        p
    }

    #[test]
    fn parses_a_whole_datagram_to_the_port_and_nothing_else() {
        let p = packet(7470, 0x4000, b"envelope"); // DF set: a whole datagram
        let (src, body) = udp_payload(&p, 7470).unwrap();
        assert_eq!(src, "10.77.0.3:40000".parse().unwrap());
        assert_eq!(body, b"envelope");
        assert!(udp_payload(&p, 7471).is_none(), "another port");
        assert!(
            udp_payload(&packet(7470, 0x2000, b"x"), 7470).is_none(),
            "first fragment"
        );
        assert!(
            udp_payload(&packet(7470, 0x0010, b"x"), 7470).is_none(),
            "later fragment"
        );
        let mut tcp = p.clone();
        tcp[9] = 6;
        assert!(udp_payload(&tcp, 7470).is_none(), "not UDP");
        for cut in [0, 10, 20, 27, p.len() - 1] {
            assert!(udp_payload(&p[..cut], 7470).is_none(), "truncated at {cut}");
        }
        let mut lying = p.clone();
        lying[24..26].copy_from_slice(&500u16.to_be_bytes());
        assert!(
            udp_payload(&lying, 7470).is_none(),
            "UDP length past the packet"
        );
    }

    fn framed(gso_type: u8, gso_size: u16, ip: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; VNET_HDR + ETH_HDR];
        f[1] = gso_type;
        f[4..6].copy_from_slice(&gso_size.to_ne_bytes());
        f[VNET_HDR + 12..VNET_HDR + 14].copy_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(ip);
        f
    }

    #[test]
    fn a_gso_aggregate_is_split_into_its_datagrams() {
        let one = framed(0, 0, &packet(7470, 0, b"abc"));
        let (src, d) = datagrams(&one, 7470).unwrap();
        assert_eq!((src.port(), d), (40000, vec![&b"abc"[..]]));
        // Three segments of 4 bytes and one of 2, as a sender's UDP GSO leaves them.
        let agg = framed(5, 4, &packet(7470, 0, b"aaaabbbbccccdd"));
        let (_, d) = datagrams(&agg, 7470).unwrap();
        assert_eq!(d, vec![&b"aaaa"[..], b"bbbb", b"cccc", b"dd"]);
        assert!(datagrams(&framed(5, 0, &packet(7470, 0, b"x")), 7470).is_none());
        let mut arp = one.clone();
        arp[VNET_HDR + 12..VNET_HDR + 14].copy_from_slice(&[0x08, 0x06]);
        assert!(datagrams(&arp, 7470).is_none(), "not IPv4");
        assert!(datagrams(&one[..VNET_HDR + 5], 7470).is_none());
    }

    fn packet_v6(dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; 48 + payload.len()];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p[6] = 17;
        p[7] = 64;
        p[8..24].copy_from_slice(&"fd00::3".parse::<std::net::Ipv6Addr>().unwrap().octets());
        p[24..40].copy_from_slice(&"fd00::4".parse::<std::net::Ipv6Addr>().unwrap().octets());
        p[40..42].copy_from_slice(&40000u16.to_be_bytes());
        p[42..44].copy_from_slice(&dport.to_be_bytes());
        p[44..46].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p[48..].copy_from_slice(payload);
        p
    }

    #[test]
    fn ipv6_datagrams_and_aggregates_parse_too() {
        let mut one = framed(0, 0, &packet_v6(7470, b"abc"));
        one[VNET_HDR + 12..VNET_HDR + 14].copy_from_slice(&[0x86, 0xdd]);
        let (src, d) = datagrams(&one, 7470).unwrap();
        assert_eq!(src, "[fd00::3]:40000".parse().unwrap());
        assert_eq!(d, vec![&b"abc"[..]]);
        assert!(datagrams(&one, 7471).is_none(), "another port");
        let mut agg = framed(5, 4, &packet_v6(7470, b"aaaabbbbcc"));
        agg[VNET_HDR + 12..VNET_HDR + 14].copy_from_slice(&[0x86, 0xdd]);
        let (_, d) = datagrams(&agg, 7470).unwrap();
        assert_eq!(d, vec![&b"aaaa"[..], b"bbbb", b"cc"]);
        let mut ext = one.clone();
        ext[VNET_HDR + ETH_HDR + 6] = 0; // a hop-by-hop options header first
        assert!(datagrams(&ext, 7470).is_none());
        for cut in [VNET_HDR + ETH_HDR + 10, one.len() - 1] {
            assert!(datagrams(&one[..cut], 7470).is_none(), "truncated at {cut}");
        }
    }

    #[test]
    fn filter_jumps_land_on_its_two_returns() {
        for f in [filter(7470), filter_v6(7470)] {
            filter_lands(&f);
        }
    }

    fn filter_lands(f: &[libc::sock_filter]) {
        let (accept, drop) = (f.len() - 2, f.len() - 1);
        for (i, ins) in f.iter().enumerate() {
            if ins.code & 0x07 == BPF_JMP {
                for off in [ins.jt, ins.jf] {
                    let to = i + 1 + usize::from(off);
                    assert!(to < f.len(), "instruction {i} jumps past the end");
                    if off != 0 {
                        assert!(to == accept || to == drop, "instruction {i} jumps to {to}");
                    }
                }
            }
        }
        assert_eq!(f[accept].k, BUF as u32);
        assert_eq!(f[drop].k, 0);
    }
}
