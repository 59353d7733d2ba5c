//! Next hops from batman-adv's originator table (`batman_interface`): three nodes on one
//! layer-2 segment (a bridge standing in for `bat0`, where every node is one IP hop from
//! every other), a `batctl` in PATH that prints the originator table of a chain 1 - 2 - 3,
//! and no neighbours or routes configured. Node 1 learns from the table and the nodes' MACs
//! in the directory that node 3 is reached through node 2, and a file to node 3 crosses node
//! 2's hopd (custody there, as on a routed mesh) instead of going to node 3 directly.
//!
//! The kernel here has no batman-adv module: the originator table is what `batctl meshif
//! bat0 originators -H` prints (BATMAN IV), for this topology. Needs root (namespaces).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;

fn mac(tag: u32, i: u32) -> String {
    format!("02:00:00:00:{tag:02x}:{i:02x}")
}

/// A `batctl` that answers `meshif <if> originators -H` with the table of a chain 1 - 2 - 3
/// as seen from the node whose eth0 has the MAC it finds.
fn fake_batctl(dir: &std::path::Path, tag: u32) -> std::path::PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let (m1, m2, m3) = (mac(tag, 1), mac(tag, 2), mac(tag, 3));
    let line = |o: &str, nh: &str| format!(" * {o}    0.120s   (255) {nh} [      eth0]\\n");
    let script = format!(
        "#!/bin/sh\n\
         [ \"$1\" = meshif ] && [ \"$3\" = originators ] || {{ echo \"usage\" >&2; exit 1; }}\n\
         case \"$(cat /sys/class/net/eth0/address)\" in\n\
         {m1}) printf '{}{}' ;;\n\
         {m2}) printf '{}{}' ;;\n\
         {m3}) printf '{}{}' ;;\n\
         esac\n",
        line(&m2, &m2),
        line(&m3, &m2),
        line(&m1, &m1),
        line(&m3, &m3),
        line(&m1, &m2),
        line(&m2, &m2),
    );
    let p = bin.join("batctl");
    std::fs::write(&p, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

#[test]
fn blocks_follow_the_originator_tables_next_hop_on_one_segment() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let (tag, node_ns, _guard) = bridge_segment(3, false);
    for (i, ns) in node_ns.iter().enumerate() {
        let m = mac(tag, i as u32 + 1);
        ip_ok(&["-n", ns, "link", "set", "eth0", "address", &m]);
        let addr = format!("10.{tag}.0.{}/24", i + 1);
        ip_ok(&["-n", ns, "addr", "add", &addr, "dev", "eth0"]);
        ip_ok(&["-n", ns, "link", "set", "eth0", "up"]);
    }
    let work = tempfile::tempdir().unwrap();
    let bin = fake_batctl(work.path(), tag);
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // The only test of this binary: hopd (through `ip netns exec`) inherits it.
    std::env::set_var("PATH", path);
    let port = 7470;
    let nodes: Vec<Hopd> = (1..=3u32)
        .map(|i| {
            let listen: SocketAddr = format!("10.{tag}.0.{i}:{port}").parse().unwrap();
            let spec = NodeSpec {
                id: i,
                listen,
                neighbours: vec![],
                routes: vec![],
                netns: Some(node_ns[i as usize - 1].clone()),
                extra: format!(
                    "discovery_address = \"10.{tag}.0.255:{port}\"\nhello_interval = \"300ms\"\n\
                     batman_interface = \"eth0\""
                ),
            };
            Hopd::start(spec, work.path().join(format!("n{i}")))
        })
        .collect();
    let t0 = std::time::Instant::now();
    while nodes[0].status()["batman_next_hops"]["3"] != 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no next hop for node 3 from the originator table: {}\n{}",
            nodes[0].status(),
            nodes[0].log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let size = 2_000_000;
    let data = pattern(91, size);
    let file = work.path().join("b.bin");
    std::fs::write(&file, &data).unwrap();
    let out = send(&nodes[0], &[&file], 3);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    receive_one_file(&nodes[2], &work.path().join("in"), "b.bin", &data);
    // The bridge learns addresses: node 2 receives the data only as the relay.
    let relay_rx = nodes[1].counter("rx_bytes");
    assert!(relay_rx > size as u64, "relay received {relay_rx} bytes");
}
