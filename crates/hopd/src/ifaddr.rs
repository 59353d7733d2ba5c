//! The host's interface addresses (getifaddrs(3)): what a node announces in the mesh's
//! directory, and the broadcast addresses `discovery_address = "auto"` says hello to.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One address of an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfAddr {
    pub interface: String,
    pub addr: IpAddr,
    /// The IPv4 broadcast address of the address's subnet, on a broadcast-capable link.
    pub broadcast: Option<Ipv4Addr>,
}

/// Call `f` with each entry of the host's interface list that has an address (none if the
/// list cannot be read).
fn walk(mut f: impl FnMut(&libc::ifaddrs, *const libc::sockaddr)) {
    // SAFETY: getifaddrs(3) fills a list that is only read here, then freed with
    // freeifaddrs(3); each entry and its address are checked for null before `f` sees them
    // (as a pointer: the address is as large as its family's sockaddr, not `sockaddr`).
    unsafe {
        let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut list) != 0 {
            return;
        }
        let mut p = list;
        while !p.is_null() {
            let ifa = &*p;
            p = ifa.ifa_next;
            if !ifa.ifa_addr.is_null() && !ifa.ifa_name.is_null() {
                f(ifa, ifa.ifa_addr);
            }
        }
        libc::freeifaddrs(list);
    }
}

/// Every IP address of every interface.
pub fn all() -> Vec<IfAddr> {
    let mut out = Vec::new();
    walk(|ifa, sa| {
        // SAFETY: the name is a NUL-terminated string of the list; each sockaddr is read as
        // the family it names.
        unsafe {
            let interface = std::ffi::CStr::from_ptr(ifa.ifa_name)
                .to_string_lossy()
                .into_owned();
            match i32::from((*sa).sa_family) {
                libc::AF_INET => {
                    let sin = &*(sa as *const libc::sockaddr_in);
                    let addr = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                    // The subnet's broadcast address from the address and its mask: an
                    // address added without `brd` has none of its own in the kernel's list.
                    let mask = (!ifa.ifa_netmask.is_null()
                        && i32::from((*ifa.ifa_netmask).sa_family) == libc::AF_INET)
                        .then(|| {
                            let m = &*(ifa.ifa_netmask as *const libc::sockaddr_in);
                            u32::from_be(m.sin_addr.s_addr)
                        });
                    let broadcast = match mask {
                        Some(m) if ifa.ifa_flags & libc::IFF_BROADCAST as u32 != 0 => {
                            subnet_broadcast(addr, m)
                        }
                        _ => None,
                    };
                    out.push(IfAddr {
                        interface,
                        addr: IpAddr::V4(addr),
                        broadcast,
                    });
                }
                libc::AF_INET6 => {
                    let sin6 = &*(sa as *const libc::sockaddr_in6);
                    out.push(IfAddr {
                        interface,
                        addr: IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)),
                        broadcast: None,
                    });
                }
                _ => {}
            }
        }
    });
    out
}

/// The broadcast address of `addr`'s subnet of mask `mask`; none for /31 and /32, which have
/// no broadcast address.
pub fn subnet_broadcast(addr: Ipv4Addr, mask: u32) -> Option<Ipv4Addr> {
    if mask.leading_ones() >= 31 || mask.leading_ones() + mask.trailing_zeros() != 32 {
        return None;
    }
    Some(Ipv4Addr::from(u32::from(addr) | !mask))
}

/// The MAC addresses of the host's interfaces (loopback's and all-zero ones left out),
/// sorted, no duplicates.
pub fn macs() -> Vec<[u8; 6]> {
    let mut out = Vec::new();
    walk(|_, sa| {
        // SAFETY: `sa` is a non-null address of the list; an AF_PACKET one is a sockaddr_ll.
        let ll = unsafe {
            if i32::from((*sa).sa_family) != libc::AF_PACKET {
                return;
            }
            &*(sa as *const libc::sockaddr_ll)
        };
        if ll.sll_halen == 6 && ll.sll_addr[..6] != [0; 6] {
            let mut m = [0u8; 6];
            m.copy_from_slice(&ll.sll_addr[..6]);
            out.push(m);
        }
    });
    out.sort();
    out.dedup();
    out
}

/// The host's addresses a route may name as a destination: every IPv4 address but
/// loopback, every IPv6 address but loopback and link-local. Sorted, no duplicates.
pub fn routable() -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = all()
        .into_iter()
        .map(|a| a.addr)
        .filter(|a| {
            !a.is_loopback()
                && !a.is_unspecified()
                && match a {
                    IpAddr::V4(_) => true,
                    IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 != 0xfe80,
                }
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The IPv4 broadcast addresses of interface `name` (one per subnet on it).
pub fn broadcasts(name: &str) -> Vec<Ipv4Addr> {
    let mut v: Vec<Ipv4Addr> = all()
        .into_iter()
        .filter(|a| a.interface == name)
        .filter_map(|a| a.broadcast)
        .collect();
    v.sort();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subnets_broadcast_comes_from_its_mask() {
        let a = Ipv4Addr::new(10, 1, 2, 3);
        assert_eq!(
            subnet_broadcast(a, 0xffff_ff00),
            Some(Ipv4Addr::new(10, 1, 2, 255))
        );
        assert_eq!(
            subnet_broadcast(a, 0xffff_0000),
            Some(Ipv4Addr::new(10, 1, 255, 255))
        );
        assert_eq!(subnet_broadcast(a, 0xffff_fffe), None);
        assert_eq!(subnet_broadcast(a, u32::MAX), None);
        assert_eq!(subnet_broadcast(a, 0xff00_ff00), None, "not a prefix");
    }

    #[test]
    fn loopback_is_listed_and_never_routable() {
        let all = all();
        assert!(all.iter().any(|a| a.addr.is_loopback()), "{all:?}");
        assert!(routable().iter().all(|a| !a.is_loopback()));
        assert!(broadcasts("lo").is_empty(), "loopback has no broadcast");
    }
}
