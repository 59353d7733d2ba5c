//! Hop's packet size from the path MTU. A datagram larger than the path MTU is fragmented
//! by IP, and on a lossy radio a fragmented datagram is lost when either fragment is; UDP GSO
//! also refuses such datagrams. The default payload (1,380 bytes) fits an IPv4 path of
//! 1,500 bytes but not IPv6 on the same link (40-byte header) nor a tunnel of 1,420. So
//! unless `[hop] packet_payload_bytes` is set, hopd asks the kernel for the MTU of the route
//! to each neighbour (and the broadcast address) and lowers the payload until the largest
//! Hop datagram fits the smallest of them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use socket2::{Domain, Socket, Type};

use crate::auth::TRAILER_LEN;
use crate::config::Config;

/// Bytes a Hop datagram adds to its payload at most: envelope, Hop header, the larger of
/// the BSYN and DATA fields, checksum, authentication trailer (docs/wire-format.md, size
/// budget).
pub const HOP_OVERHEAD: usize = hop_wire::envelope::HEADER_LEN
    + hop_wire::hop::HEADER_LEN
    + if hop_wire::hop::BSYN_FIXED_LEN > hop_wire::hop::DATA_FIXED_LEN {
        hop_wire::hop::BSYN_FIXED_LEN
    } else {
        hop_wire::hop::DATA_FIXED_LEN
    }
    + hop_wire::envelope::CRC_LEN
    + TRAILER_LEN;

const UDP_HEADER: usize = 8;

/// IP and UDP header bytes for a datagram to `to`.
fn ip_udp_overhead(to: &SocketAddr) -> usize {
    UDP_HEADER + if to.is_ipv4() { 20 } else { 40 }
}

/// The largest Hop payload whose datagrams to `to` fit `mtu`.
pub fn payload_for(mtu: u32, to: &SocketAddr) -> usize {
    (mtu as usize).saturating_sub(ip_udp_overhead(to) + HOP_OVERHEAD)
}

/// The kernel's MTU for datagrams from `local` to `to` (the route's device MTU, or a
/// smaller path MTU it learned).
pub fn path_mtu(local: IpAddr, to: SocketAddr) -> std::io::Result<u32> {
    let s = Socket::new(Domain::for_address(to), Type::DGRAM, None)?;
    let bind_ip = match (local, to) {
        (IpAddr::V4(_), SocketAddr::V4(_)) | (IpAddr::V6(_), SocketAddr::V6(_)) => local,
        (_, SocketAddr::V4(_)) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        (_, SocketAddr::V6(_)) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    s.bind(&SocketAddr::new(bind_ip, 0).into())?;
    if to.ip().is_ipv4() && is_broadcast(&to.ip()) {
        s.set_broadcast(true)?;
    }
    s.connect(&to.into())?;
    let (level, name) = if to.is_ipv4() {
        (libc::IPPROTO_IP, libc::IP_MTU)
    } else {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU)
    };
    let mut mtu: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `mtu`, an int, on an open socket.
    let r = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            level,
            name,
            (&mut mtu as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(mtu.max(0) as u32)
}

fn is_broadcast(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_broadcast() || v4.octets()[3] == 255,
        IpAddr::V6(_) => false,
    }
}

/// What [`fit`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fitted {
    pub payload: usize,
    pub mtu: u32,
    pub to: SocketAddr,
}

/// Lower `cfg.hop.packet_payload_bytes` to fit the smallest path MTU to the neighbours and
/// the broadcast address, unless the file sets it. Returns what limited it, if anything did.
pub fn fit(cfg: &mut Config) -> Option<Fitted> {
    if cfg.packet_payload_given {
        return None;
    }
    let mut targets: Vec<SocketAddr> = cfg.neighbours.iter().map(|n| n.addr).collect();
    targets.extend(cfg.broadcast_address);
    let smallest = targets
        .into_iter()
        .filter_map(|to| {
            let mtu = path_mtu(cfg.listen.ip(), to).ok()?;
            Some((payload_for(mtu, &to), mtu, to))
        })
        .min()?;
    let (payload, mtu, to) = smallest;
    if payload >= cfg.hop.packet_payload_bytes {
        return None;
    }
    cfg.hop.packet_payload_bytes = payload.max(MIN_PAYLOAD);
    Some(Fitted {
        payload: cfg.hop.packet_payload_bytes,
        mtu,
        to,
    })
}

/// The smallest payload hopd accepts (`[hop] packet_payload_bytes`).
pub const MIN_PAYLOAD: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_payload_fits_ipv4_at_1500_but_not_ipv6() {
        let v4: SocketAddr = "10.0.0.2:7470".parse().unwrap();
        let v6: SocketAddr = "[fd00::2]:7470".parse().unwrap();
        assert_eq!(HOP_OVERHEAD, 89);
        assert_eq!(payload_for(1500, &v4), 1383);
        assert_eq!(payload_for(1500, &v6), 1363);
        assert_eq!(payload_for(1420, &v4), 1303);
        assert!(payload_for(1500, &v6) < hop_proto::hop::DEFAULT_PACKET_PAYLOAD_BYTES);
    }

    #[test]
    fn loopback_reports_its_mtu() {
        let to: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mtu = path_mtu("127.0.0.1".parse().unwrap(), to).unwrap();
        assert!(mtu >= 1500, "{mtu}");
    }
}
