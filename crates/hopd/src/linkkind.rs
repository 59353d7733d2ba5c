//! Whether the node's link retries control frames at the link layer, which decides Hop's
//! control copies (`[hop] control_copies = "auto"`, docs/design/hop.md#control-copies).
//!
//! An 802.11 MAC retries every unicast frame (Hop §4.1: BSYN and BACK go with link ARQ), so a
//! BSYN or BACK is lost only when every retry is; Ethernet, a veth, a tunnel or loopback send
//! a datagram once. The kernel shows an 802.11 interface in sysfs (`wireless`, `phy80211`);
//! a virtual interface over one (batman-adv's `bat0`, a bridge, a VLAN, a bond) lists its
//! lower interfaces (`lower_*`, `brif/`), which are looked at in turn.

use std::net::SocketAddr;
use std::path::Path;

/// Where the kernel lists the network interfaces.
const SYS_CLASS_NET: &str = "/sys/class/net";

/// How deep virtual interfaces are followed down to their lower ones.
const MAX_DEPTH: usize = 4;

/// The decision and what it rests on, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkRetries {
    pub retries: bool,
    pub reason: String,
}

/// Whether `ifname` (under `root`, normally /sys/class/net) or an interface under it is an
/// 802.11 interface; `None` if there is no such interface.
pub fn is_wireless(root: &Path, ifname: &str) -> Option<bool> {
    let dir = root.join(ifname);
    if !dir.exists() {
        return None;
    }
    Some(wireless_below(root, ifname, 0))
}

fn wireless_below(root: &Path, ifname: &str, depth: usize) -> bool {
    let dir = root.join(ifname);
    if dir.join("wireless").exists() || dir.join("phy80211").exists() {
        return true;
    }
    if depth >= MAX_DEPTH {
        return false;
    }
    let mut lower = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            if let Some(name) = e
                .file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("lower_"))
            {
                lower.push(name.to_string());
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir.join("brif")) {
        for e in entries.flatten() {
            if let Some(name) = e.file_name().to_str() {
                lower.push(name.to_string());
            }
        }
    }
    lower.iter().any(|l| wireless_below(root, l, depth + 1))
}

/// Decide for a node: `given` (the configuration's `link_retries`) if set; else the
/// configured `interface`; else the interface that holds the `listen` address; else every
/// interface with an address other than loopback (any 802.11 one among them: retries, the
/// cautious side, since copies cost air on a busy mesh). `addrs` lists (interface, address)
/// pairs as [`crate::ifaddr::all`] gives them.
pub fn decide(
    root: &Path,
    given: Option<bool>,
    interface: Option<&str>,
    listen: SocketAddr,
    addrs: &[(String, std::net::IpAddr)],
) -> LinkRetries {
    let kind = |w: bool| {
        if w {
            "802.11"
        } else {
            "not 802.11"
        }
    };
    if let Some(retries) = given {
        return LinkRetries {
            retries,
            reason: format!("link_retries = {retries} in the configuration"),
        };
    }
    if let Some(name) = interface {
        return match is_wireless(root, name) {
            Some(w) => LinkRetries {
                retries: w,
                reason: format!("interface {name} is {}", kind(w)),
            },
            None => LinkRetries {
                retries: true,
                reason: format!("interface {name} is not in {}", root.display()),
            },
        };
    }
    let ip = listen.ip();
    if !ip.is_unspecified() {
        if let Some((name, _)) = addrs.iter().find(|(_, a)| *a == ip) {
            if let Some(w) = is_wireless(root, name) {
                return LinkRetries {
                    retries: w,
                    reason: format!("the listen address is on {name}, {}", kind(w)),
                };
            }
        }
    }
    let mut names: Vec<&str> = addrs
        .iter()
        .filter(|(_, a)| !a.is_loopback())
        .map(|(n, _)| n.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    match names.iter().find(|n| is_wireless(root, n) == Some(true)) {
        Some(n) => LinkRetries {
            retries: true,
            reason: format!("interface {n} is 802.11"),
        },
        None => LinkRetries {
            retries: false,
            reason: if names.is_empty() {
                "no interface but loopback".into()
            } else {
                format!("no 802.11 interface among {}", names.join(", "))
            },
        },
    }
}

/// [`decide`] on this host.
pub fn for_host(given: Option<bool>, interface: Option<&str>, listen: SocketAddr) -> LinkRetries {
    if given.is_some() {
        return decide(Path::new(SYS_CLASS_NET), given, interface, listen, &[]);
    }
    let addrs: Vec<(String, std::net::IpAddr)> = crate::ifaddr::all()
        .into_iter()
        .map(|a| (a.interface, a.addr))
        .collect();
    decide(Path::new(SYS_CLASS_NET), given, interface, listen, &addrs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    /// A sysfs-like tree: wlan0 (802.11), eth0, bat0 over wlan0, br0 over eth0, vlan over bat0.
    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        for n in ["wlan0", "eth0", "bat0", "br0", "bat0.5", "lo"] {
            std::fs::create_dir_all(r.join(n)).unwrap();
        }
        std::fs::create_dir_all(r.join("wlan0/wireless")).unwrap();
        std::fs::create_dir_all(r.join("bat0/lower_wlan0")).unwrap();
        std::fs::create_dir_all(r.join("br0/brif/eth0")).unwrap();
        std::fs::create_dir_all(r.join("bat0.5/lower_bat0")).unwrap();
        d
    }

    fn at(a: &str) -> SocketAddr {
        a.parse().unwrap()
    }

    #[test]
    fn an_80211_interface_and_those_over_one_retry_the_others_do_not() {
        let t = tree();
        let r = t.path();
        assert_eq!(is_wireless(r, "wlan0"), Some(true));
        assert_eq!(is_wireless(r, "bat0"), Some(true));
        assert_eq!(is_wireless(r, "bat0.5"), Some(true));
        assert_eq!(is_wireless(r, "eth0"), Some(false));
        assert_eq!(is_wireless(r, "br0"), Some(false));
        assert_eq!(is_wireless(r, "wlan9"), None);
    }

    #[test]
    fn the_configuration_then_the_interface_then_the_listen_address_then_every_interface() {
        let t = tree();
        let r = t.path();
        let any = at("0.0.0.0:7470");
        let addrs: Vec<(String, IpAddr)> = vec![
            ("lo".into(), "127.0.0.1".parse().unwrap()),
            ("eth0".into(), "10.0.0.1".parse().unwrap()),
            ("bat0".into(), "10.1.0.1".parse().unwrap()),
        ];
        assert!(!decide(r, Some(false), Some("wlan0"), any, &addrs).retries);
        assert!(decide(r, None, Some("bat0"), any, &addrs).retries);
        assert!(!decide(r, None, Some("br0"), any, &addrs).retries);
        // An interface the host lacks: the cautious side (no copies), said in the reason.
        let missing = decide(r, None, Some("mesh7"), any, &addrs);
        assert!(
            missing.retries && missing.reason.contains("mesh7"),
            "{missing:?}"
        );
        assert!(!decide(r, None, None, at("10.0.0.1:7470"), &addrs).retries);
        assert!(decide(r, None, None, at("10.1.0.1:7470"), &addrs).retries);
        // Listening on every address: any 802.11 interface means retries.
        assert!(decide(r, None, None, any, &addrs).retries);
        let wired = &addrs[..2];
        let d = decide(r, None, None, any, wired);
        assert!(!d.retries && d.reason.contains("eth0"), "{d:?}");
        // Loopback alone (the tests' nodes): no retries.
        assert!(!decide(r, None, None, at("127.0.0.1:7470"), &addrs[..1]).retries);
        assert!(!decide(r, None, None, any, &addrs[..1]).retries);
    }
}
