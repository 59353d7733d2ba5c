//! Next hops from batman-adv's originator table, so that Hop switches blocks at every radio
//! hop of a layer-2 mesh too.
//!
//! On `bat0` every node is one IP hop from every other: without this, a transfer is one Hop
//! "hop" from source to destination and batman-adv carries it across the radio hops below.
//! With `batman_interface = "bat0"` a thread reads the originator table (`batctl meshif bat0
//! originators -H`, the older `batctl -m bat0 o -H` when that fails) every
//! [`REFRESH`]: for each originator (a node's primary interface MAC) the MAC of the best next
//! hop. The mesh's directory (daemon/directory.rs) says which MACs each node has, so an
//! originator maps to a destination node and its next hop's MAC to the neighbour node that
//! takes the block: Hop then sends each block to the next radio hop's hopd, which keeps it in
//! custody and forwards it, as on a routed mesh.

use std::collections::BTreeMap;
use std::time::Duration;

use hop_proto::NodeId;
use tokio::sync::mpsc;
use tracing::warn;

use crate::daemon::cmd::Cmd;

/// How often the originator table is read.
pub const REFRESH: Duration = Duration::from_secs(5);

/// A MAC address.
pub type Mac = [u8; 6];

/// One originator and the best next hop towards it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Originator {
    pub originator: Mac,
    pub next_hop: Mac,
}

fn parse_mac(s: &str) -> Option<Mac> {
    let mut m = [0u8; 6];
    let mut parts = s.split(':');
    for b in m.iter_mut() {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(m)
}

/// The best next hop of each originator in `batctl`'s originator table: the lines marked
/// `*` (BATMAN IV and V alike), each naming the originator, then (after the last-seen time
/// and the link quality or throughput) the next hop and the outgoing interface.
pub fn parse_originators(text: &str) -> Vec<Originator> {
    let mut out = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        let Some(rest) = t.strip_prefix('*') else {
            continue;
        };
        let macs: Vec<Mac> = rest
            .split(|c: char| c.is_whitespace() || c == '[' || c == ']' || c == '(' || c == ')')
            .filter_map(parse_mac)
            .collect();
        if let [originator, next_hop, ..] = macs[..] {
            out.push(Originator {
                originator,
                next_hop,
            });
        }
    }
    out
}

/// Next hop per node: `nodes` are (node, its MACs) from the directory, `local` this node.
/// A node whose originator (any of its MACs) has a best next hop whose MAC is another
/// node's gets that node as its next hop.
pub fn next_hops(
    table: &[Originator],
    nodes: &[(NodeId, Vec<Mac>)],
    local: NodeId,
) -> BTreeMap<NodeId, NodeId> {
    let owner = |mac: &Mac| {
        nodes
            .iter()
            .find(|(_, macs)| macs.contains(mac))
            .map(|(id, _)| *id)
    };
    let mut out = BTreeMap::new();
    for o in table {
        let (Some(dst), Some(via)) = (owner(&o.originator), owner(&o.next_hop)) else {
            continue;
        };
        if dst != local && via != local {
            out.insert(dst, via);
        }
    }
    out
}

/// Run `batctl` for the originator table of `ifname`, in the new syntax and then the old.
fn read_table(ifname: &str) -> Result<String, String> {
    let mut last = String::new();
    for args in [
        vec!["meshif", ifname, "originators", "-H"],
        vec!["-m", ifname, "o", "-H"],
    ] {
        match std::process::Command::new("batctl").args(&args).output() {
            Ok(o) if o.status.success() => {
                return Ok(String::from_utf8_lossy(&o.stdout).into_owned())
            }
            Ok(o) => last = String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => return Err(format!("cannot run batctl: {e}")),
        }
    }
    Err(last)
}

/// Read the originator table of `ifname` every [`REFRESH`] and hand it to the daemon.
pub fn spawn(ifname: String, cmds: mpsc::Sender<Cmd>) {
    std::thread::spawn(move || {
        let mut warned = false;
        loop {
            match read_table(&ifname) {
                Ok(text) => {
                    warned = false;
                    let table = parse_originators(&text);
                    if cmds.blocking_send(Cmd::Originators { table }).is_err() {
                        return;
                    }
                }
                Err(e) if !warned => {
                    warned = true;
                    warn!(interface = %ifname, error = %e,
                        "cannot read batman-adv's originator table (is batctl installed, and {ifname} a batman-adv interface?); blocks go end to end");
                }
                Err(_) => {}
            }
            std::thread::sleep(REFRESH);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `batctl meshif bat0 originators -H` of BATMAN IV (link quality) and BATMAN V
    /// (throughput), with a second-best line that is not marked.
    const IV: &str = " * 02:00:00:00:00:03    0.520s   (201) 02:00:00:00:00:02 [     wlan0]\n   02:00:00:00:00:03    0.560s   ( 98) 02:00:00:00:00:04 [     wlan0]\n * 02:00:00:00:00:02    0.120s   (255) 02:00:00:00:00:02 [     wlan0]\n";
    const V: &str = " * 02:00:00:00:00:03    0.580s (        9.0) 02:00:00:00:00:02 [  mesh0]\n";

    fn mac(last: u8) -> Mac {
        [2, 0, 0, 0, 0, last]
    }

    #[test]
    fn the_marked_lines_give_each_originators_next_hop() {
        assert_eq!(
            parse_originators(IV),
            vec![
                Originator {
                    originator: mac(3),
                    next_hop: mac(2)
                },
                Originator {
                    originator: mac(2),
                    next_hop: mac(2)
                },
            ]
        );
        assert_eq!(parse_originators(V).len(), 1);
        assert!(parse_originators("Error - interface bat0 is not present\n").is_empty());
        assert_eq!(parse_mac("02:00:00:00:00:0g"), None);
        assert_eq!(parse_mac("02:00:00:00:00:00:00"), None);
    }

    #[test]
    fn originators_map_to_nodes_by_the_macs_they_announce() {
        // Node 3 is reached through node 2; node 2 directly; node 2 announces its bat0 MAC
        // and its radio's, the originator table names the radio's.
        let nodes = vec![
            (1, vec![mac(1)]),
            (2, vec![mac(0x22), mac(2)]),
            (3, vec![mac(3)]),
        ];
        let nh = next_hops(&parse_originators(IV), &nodes, 1);
        assert_eq!(nh.get(&3), Some(&2));
        assert_eq!(nh.get(&2), Some(&2));
        // An originator no node announces is left out.
        assert!(next_hops(&parse_originators(IV), &nodes[..1], 1).is_empty());
    }
}
