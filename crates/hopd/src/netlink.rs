//! Next hops from the kernel routing table (rtnetlink), so hopd runs beside a routing daemon
//! (OLSR, Babel, BATMAN) that installs routes. A thread dumps the IPv4 and IPv6 routes of the
//! main table, maps each known node's address to its route's gateway and the gateway to a
//! neighbour's node id (configured, or learned from its hellos: an IPv6 routing daemon names
//! link-local gateways), and repeats whenever the kernel announces a route change.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use hop_wire::NodeId;
use tokio::sync::mpsc;
use tracing::warn;

use crate::config::Config;
use crate::daemon::cmd::Cmd;

/// Re-read the table at least this often, in case a notification was lost.
const REFRESH: Duration = Duration::from_secs(5);

/// One route: destination prefix and optional gateway (IPv4 or IPv6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub dst: IpAddr,
    pub prefix: u8,
    pub gateway: Option<IpAddr>,
}

fn contains(r: &Route, ip: IpAddr) -> bool {
    match (r.dst, ip) {
        (IpAddr::V4(d), IpAddr::V4(ip)) => {
            let p = u32::from(r.prefix.min(32));
            let mask = u32::MAX.checked_shl(32 - p).unwrap_or(0);
            (u32::from(d) & mask) == (u32::from(ip) & mask)
        }
        (IpAddr::V6(d), IpAddr::V6(ip)) => {
            let p = u32::from(r.prefix.min(128));
            let mask = u128::MAX.checked_shl(128 - p).unwrap_or(0);
            (u128::from(d) & mask) == (u128::from(ip) & mask)
        }
        _ => false,
    }
}

/// Next hop per known node, by longest-prefix match over `routes`. Known nodes are the
/// configured neighbours and `[[hosts]]`, the neighbours learned from hellos (`learned`:
/// id and address) and the nodes of the mesh's directory (`directory`: id and each of its
/// addresses); a gateway is the neighbour with that address.
pub fn next_hops(
    cfg: &Config,
    routes: &[Route],
    learned: &[(NodeId, IpAddr)],
    directory: &[(NodeId, IpAddr)],
) -> BTreeMap<NodeId, NodeId> {
    // The directory first: what is configured or heard directly, mapped later, wins.
    let mut nodes: Vec<(NodeId, IpAddr)> = directory.to_vec();
    nodes.extend(cfg.neighbours.iter().map(|n| (n.id, n.addr.ip())));
    nodes.extend(cfg.hosts.iter().copied());
    nodes.extend(learned.iter().copied());
    let neighbour_by_ip = |ip: IpAddr| {
        cfg.neighbour_by_ip(ip)
            .or_else(|| learned.iter().find(|(_, a)| *a == ip).map(|(id, _)| *id))
    };
    let mut out = BTreeMap::new();
    for (id, ip) in nodes {
        let best = routes
            .iter()
            .filter(|r| contains(r, ip))
            .max_by_key(|r| r.prefix);
        let Some(r) = best else { continue };
        let nh = match r.gateway {
            Some(gw) => neighbour_by_ip(gw),
            None => neighbour_by_ip(ip).filter(|n| *n == id),
        };
        if let Some(nh) = nh {
            out.insert(id, nh);
        }
    }
    out
}

fn nl_socket(groups: u32) -> std::io::Result<i32> {
    // SAFETY: plain socket(2)/bind(2) calls with a zeroed, correctly sized address.
    unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut sa: libc::sockaddr_nl = std::mem::zeroed();
        sa.nl_family = libc::AF_NETLINK as u16;
        sa.nl_groups = groups;
        if libc::bind(
            fd,
            &sa as *const _ as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        ) < 0
        {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        let tv = libc::timeval {
            // libc::time_t is deprecated on musl (its width changed in musl 1.2).
            tv_sec: REFRESH.as_secs() as _,
            tv_usec: 0,
        };
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as u32,
        );
        Ok(fd)
    }
}

fn recv(fd: i32, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: buf is valid for writes of its length.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Parse RTM_NEWROUTE messages of the main table from a netlink buffer; returns the routes
/// and whether the dump is done.
pub fn parse_routes(buf: &[u8], out: &mut Vec<Route>) -> bool {
    let mut off = 0;
    while off + 16 <= buf.len() {
        let len = u32::from_ne_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]]) as usize;
        let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        if len < 16 || off + len > buf.len() {
            return true;
        }
        if ty == libc::NLMSG_DONE as u16 || ty == libc::NLMSG_ERROR as u16 {
            return true;
        }
        if ty == libc::RTM_NEWROUTE && len >= 16 + 12 {
            let m = &buf[off + 16..off + len];
            let (family, dst_len, table, rtype) = (m[0], m[1], m[4], m[7]);
            let v6 = family == libc::AF_INET6 as u8;
            let mut r = Route {
                dst: if v6 {
                    IpAddr::V6(Ipv6Addr::UNSPECIFIED)
                } else {
                    IpAddr::V4(Ipv4Addr::UNSPECIFIED)
                },
                prefix: dst_len,
                gateway: None,
            };
            let addr = |v: &[u8]| -> Option<IpAddr> {
                match (v6, v.len()) {
                    (false, 4) => Some(IpAddr::V4(Ipv4Addr::new(v[0], v[1], v[2], v[3]))),
                    (true, 16) => {
                        let b: [u8; 16] = v.try_into().ok()?;
                        Some(IpAddr::V6(Ipv6Addr::from(b)))
                    }
                    _ => None,
                }
            };
            let mut table_id = u32::from(table);
            let mut a = 12;
            while a + 4 <= m.len() {
                let alen = usize::from(u16::from_ne_bytes([m[a], m[a + 1]]));
                let aty = u16::from_ne_bytes([m[a + 2], m[a + 3]]);
                if alen < 4 || a + alen > m.len() {
                    break;
                }
                let v = &m[a + 4..a + alen];
                match (aty, v.len()) {
                    (libc::RTA_DST, _) => {
                        if let Some(a) = addr(v) {
                            r.dst = a;
                        }
                    }
                    (libc::RTA_GATEWAY, _) => r.gateway = addr(v),
                    (libc::RTA_TABLE, 4) => table_id = u32::from_ne_bytes([v[0], v[1], v[2], v[3]]),
                    _ => {}
                }
                a += (alen + 3) & !3;
            }
            if (family == libc::AF_INET as u8 || v6)
                && table_id == u32::from(libc::RT_TABLE_MAIN)
                && rtype == libc::RTN_UNICAST
            {
                out.push(r);
            }
        }
        off += (len + 3) & !3;
    }
    false
}

/// The main table's unicast routes of both families.
fn dump(seq: u32) -> std::io::Result<Vec<Route>> {
    let mut routes = dump_family(seq, libc::AF_INET as u8)?;
    // A kernel without IPv6 answers with an error: the IPv4 routes stand.
    if let Ok(v6) = dump_family(seq.wrapping_add(1), libc::AF_INET6 as u8) {
        routes.extend(v6);
    }
    Ok(routes)
}

fn dump_family(seq: u32, family: u8) -> std::io::Result<Vec<Route>> {
    let fd = nl_socket(0)?;
    let mut req = [0u8; 16 + 12];
    req[..4].copy_from_slice(&(28u32).to_ne_bytes());
    req[4..6].copy_from_slice(&libc::RTM_GETROUTE.to_ne_bytes());
    req[6..8].copy_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16).to_ne_bytes());
    req[8..12].copy_from_slice(&seq.to_ne_bytes());
    req[16] = family;
    // SAFETY: req is a valid buffer for reads of its length.
    let sent = unsafe { libc::send(fd, req.as_ptr() as *const libc::c_void, req.len(), 0) };
    let mut routes = Vec::new();
    let res = if sent < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match recv(fd, &mut buf) {
                Ok(n) => {
                    if parse_routes(&buf[..n], &mut routes) {
                        break Ok(routes);
                    }
                }
                Err(e) => break Err(e),
            }
        }
    };
    // SAFETY: fd was opened above.
    unsafe { libc::close(fd) };
    res
}

/// Start the watcher thread; it sends [`Cmd::Routes`] on every change. The daemon maps the
/// routes to next hops with the configuration it has then (a reload changes neighbours).
pub fn spawn(cmds: mpsc::Sender<Cmd>) {
    std::thread::spawn(move || {
        let notify = match nl_socket((libc::RTMGRP_IPV4_ROUTE | libc::RTMGRP_IPV6_ROUTE) as u32) {
            Ok(fd) => Some(fd),
            Err(e) => {
                warn!(error = %e, "cannot subscribe to route changes; polling");
                None
            }
        };
        let mut buf = vec![0u8; 64 * 1024];
        let mut seq = 1u32;
        loop {
            match dump(seq) {
                Ok(routes) => {
                    if cmds.blocking_send(Cmd::Routes { routes }).is_err() {
                        return;
                    }
                }
                Err(e) => warn!(error = %e, "reading the kernel routing table failed"),
            }
            seq = seq.wrapping_add(2);
            match notify {
                Some(fd) => {
                    let _ = recv(fd, &mut buf);
                }
                None => std::thread::sleep(REFRESH),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn longest_prefix_and_gateway_mapping() {
        let text = "node_id = 1\nlisten = \"10.0.0.1:7470\"\nkernel_routes = true\n[[neighbours]]\nid = 2\naddress = \"10.0.0.2\"\n[[hosts]]\nid = 3\naddress = \"10.0.1.3\"\n[storage]\ndir = \"/tmp\"\n[security]\nmesh_key = \"0000000000000000000000000000000000000000000000000000000000000000\"\n";
        let cfg = Config::parse("t", text, Path::new("/")).unwrap();
        let routes = [
            Route {
                dst: "10.0.0.0".parse().unwrap(),
                prefix: 24,
                gateway: None,
            },
            Route {
                dst: "10.0.1.0".parse().unwrap(),
                prefix: 24,
                gateway: Some("10.0.0.2".parse().unwrap()),
            },
        ];
        let nh = next_hops(&cfg, &routes, &[], &[]);
        assert_eq!(nh.get(&2), Some(&2));
        assert_eq!(nh.get(&3), Some(&2));
        let nh = next_hops(&cfg, &routes[..1], &[], &[]);
        assert_eq!(nh.get(&3), None);
    }

    /// IPv6: a host behind a link-local gateway that is a neighbour learned from its hellos
    /// (as Babel installs routes), and the default route.
    #[test]
    fn ipv6_routes_through_a_learned_link_local_neighbour() {
        let text = "node_id = 1\nlisten = \"[::]:7470\"\nkernel_routes = true\n[[hosts]]\nid = 3\naddress = \"fd00:1::3\"\n[[hosts]]\nid = 4\naddress = \"2001:db8::4\"\n[storage]\ndir = \"/tmp\"\n[security]\nmesh_key = \"0000000000000000000000000000000000000000000000000000000000000000\"\n";
        let cfg = Config::parse("t", text, Path::new("/")).unwrap();
        let gw: IpAddr = "fe80::2".parse().unwrap();
        let routes = [
            Route {
                dst: "fd00:1::".parse().unwrap(),
                prefix: 64,
                gateway: Some(gw),
            },
            Route {
                dst: "::".parse().unwrap(),
                prefix: 0,
                gateway: Some("fe80::5".parse().unwrap()),
            },
            Route {
                dst: "10.0.0.0".parse().unwrap(),
                prefix: 0,
                gateway: Some("10.0.0.9".parse().unwrap()),
            },
        ];
        let learned = [(2, gw), (5, "fe80::5".parse().unwrap())];
        let nh = next_hops(&cfg, &routes, &learned, &[]);
        assert_eq!(nh.get(&3), Some(&2));
        assert_eq!(nh.get(&4), Some(&5), "default route");
        assert_eq!(
            nh.get(&2),
            Some(&5),
            "fe80::2 itself: only the default route covers it"
        );
        assert!(
            next_hops(&cfg, &routes, &[], &[]).is_empty(),
            "gateways not known"
        );
    }

    /// Nodes known only from the directory (no `[[hosts]]`) get the next hop of the route
    /// to any of their addresses; a configured host's address wins over the directory's.
    #[test]
    fn directory_nodes_route_through_the_gateway_of_their_addresses() {
        let text = "node_id = 1\nlisten = \"0.0.0.0:7470\"\nkernel_routes = true\n[[hosts]]\nid = 4\naddress = \"10.0.3.4\"\n[storage]\ndir = \"/tmp\"\n[security]\nmesh_key = \"0000000000000000000000000000000000000000000000000000000000000000\"\n";
        let cfg = Config::parse("t", text, Path::new("/")).unwrap();
        let routes = [
            Route {
                dst: "10.0.0.0".parse().unwrap(),
                prefix: 24,
                gateway: None,
            },
            Route {
                dst: "10.0.2.0".parse().unwrap(),
                prefix: 24,
                gateway: Some("10.0.0.2".parse().unwrap()),
            },
            Route {
                dst: "10.0.3.0".parse().unwrap(),
                prefix: 24,
                gateway: Some("10.0.0.5".parse().unwrap()),
            },
        ];
        let learned = [
            (2, "10.0.0.2".parse().unwrap()),
            (5, "10.0.0.5".parse().unwrap()),
        ];
        let directory = [
            (3, "10.0.2.3".parse().unwrap()),
            (4, "10.0.2.4".parse().unwrap()),
        ];
        let nh = next_hops(&cfg, &routes, &learned, &directory);
        assert_eq!(nh.get(&3), Some(&2));
        assert_eq!(nh.get(&4), Some(&5), "the configured host's address");
        assert_eq!(next_hops(&cfg, &routes, &learned, &[]).get(&3), None);
    }

    #[test]
    fn an_ipv6_route_message_parses() {
        // RTM_NEWROUTE, AF_INET6, /64, main table, unicast; RTA_DST and RTA_GATEWAY.
        let mut m = vec![0u8; 16];
        let mut body = vec![
            libc::AF_INET6 as u8,
            64,
            0,
            0,
            libc::RT_TABLE_MAIN,
            3,
            0,
            libc::RTN_UNICAST,
            0,
            0,
            0,
            0,
        ];
        for (ty, a) in [(libc::RTA_DST, "fd00:1::"), (libc::RTA_GATEWAY, "fe80::2")] {
            let ip: Ipv6Addr = a.parse().unwrap();
            body.extend_from_slice(&20u16.to_ne_bytes());
            body.extend_from_slice(&ty.to_ne_bytes());
            body.extend_from_slice(&ip.octets());
        }
        m.extend_from_slice(&body);
        let len = m.len() as u32;
        m[..4].copy_from_slice(&len.to_ne_bytes());
        m[4..6].copy_from_slice(&libc::RTM_NEWROUTE.to_ne_bytes());
        let mut out = Vec::new();
        parse_routes(&m, &mut out);
        assert_eq!(
            out,
            vec![Route {
                dst: "fd00:1::".parse().unwrap(),
                prefix: 64,
                gateway: Some("fe80::2".parse().unwrap()),
            }]
        );
    }

    #[test]
    fn dump_reads_the_real_table() {
        // Every Linux host has at least a loopback route in the local table; the main table
        // may be empty in a bare namespace, so only check that a dump completes.
        assert!(dump(7).is_ok());
    }
}
