//! Hop's packet size follows the path MTU: no IP fragments on a link narrower than the
//! default packet (a tunnel's 1,420 bytes, IPv6 at 1,500).

mod common;

use std::time::Duration;

use common::*;

/// IP fragments the kernel of namespace `ns` created so far (IPv4 `FragCreates`).
fn frag_creates(ns: &str) -> u64 {
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/snmp"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let mut lines = text.lines().filter(|l| l.starts_with("Ip:"));
    let (names, values) = (lines.next().unwrap(), lines.next().unwrap());
    let i = names
        .split_whitespace()
        .position(|n| n == "FragCreates")
        .unwrap();
    values.split_whitespace().nth(i).unwrap().parse().unwrap()
}

/// Two nodes over a veth pair of MTU 1,280: hopd lowers its payload to fit, says so, and a
/// 2 MB transfer creates no IP fragment (with the old fixed payload every data datagram
/// went out in two fragments).
#[test]
fn a_narrow_link_gets_packets_that_fit_without_fragments() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let port = free_port();
    let chain = NetnsChain::new(2, 0, port);
    for (k, side) in [(0, "a"), (0, "b")] {
        let ns = &chain.names[if side == "a" { k } else { k + 1 }];
        let dev = format!("h{}v{k}{side}", chain.tag);
        ip_ok(&["-n", ns, "link", "set", &dev, "mtu", "1280"]);
    }
    let work = tempfile::tempdir().unwrap();
    let nodes = netns_nodes(&chain, 2, port, work.path(), "");
    let st = nodes[0].status();
    assert_eq!(
        st["packet_payload_bytes"],
        1280 - 28 - hopd::mtu::HOP_OVERHEAD,
        "{st}"
    );
    assert!(nodes[0].log().contains("path MTU"), "{}", nodes[0].log());
    let file = work.path().join("f.bin");
    let data = pattern(13, 2_000_000);
    std::fs::write(&file, &data).unwrap();
    let before = frag_creates(&chain.names[0]);
    let out = send(&nodes[0], &[&file], 2);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = work.path().join("out");
    receive_one_file(&nodes[1], &dir, "f.bin", &data);
    assert_eq!(frag_creates(&chain.names[0]) - before, 0, "IP fragments");
    std::thread::sleep(Duration::from_millis(10));
}
