//! hopd on IPv6-only links: packets that fit the path MTU (no fragments) over three hops,
//! and neighbours found by hellos to a link-local multicast group, with data sent to a
//! group in broadcast link mode.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// IPv6 fragments the kernel of namespace `ns` created so far (`Ip6FragCreates`).
fn frag_creates6(ns: &str) -> u64 {
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/snmp6"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("Ip6FragCreates"))
        .and_then(|v| v.trim().parse().ok())
        .expect("Ip6FragCreates in /proc/net/snmp6")
}

/// Four nodes on IPv6-only links (three hops) of MTU 1,280 and then 1,500: hopd sizes its
/// packets to the path and a 2 MB file crosses without one IPv6 fragment on any node.
#[test]
fn an_ipv6_only_chain_of_three_hops_sends_no_fragments() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    for mtu in [1280u32, 1500] {
        let port = free_port();
        let chain = NetnsChain::new_v6(4, mtu);
        let work = tempfile::tempdir().unwrap();
        let nodes: Vec<Hopd> = (1..=4)
            .map(|i| {
                let listen: std::net::SocketAddr = format!("[::]:{port}").parse().unwrap();
                let spec = chain_spec(
                    4,
                    i,
                    listen,
                    &|j| chain.addr6(j, i, port),
                    Some(chain.names[i as usize - 1].clone()),
                    "",
                );
                Hopd::start(spec, work.path().join(format!("n{i}")))
            })
            .collect();
        // IPv6 header 40 + UDP 8 + the envelope and Hop's headers.
        let overhead = hopd::mtu::HOP_OVERHEAD as u32;
        let st = nodes[0].status();
        assert_eq!(
            st["packet_payload_bytes"].as_u64(),
            Some(u64::from(mtu.min(1380 + 48 + overhead) - 48 - overhead)),
            "MTU {mtu}: {st}"
        );
        let before: Vec<u64> = chain.names.iter().map(|n| frag_creates6(n)).collect();
        let file = work.path().join("f.bin");
        let data = pattern(u64::from(mtu), 2_000_000);
        std::fs::write(&file, &data).unwrap();
        let out = send(&nodes[0], &[&file], 4);
        assert!(
            out.status.success(),
            "MTU {mtu}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        receive_one_file(&nodes[3], &work.path().join("out"), "f.bin", &data);
        for (n, b) in chain.names.iter().zip(before) {
            assert_eq!(frag_creates6(n) - b, 0, "MTU {mtu}: IPv6 fragments in {n}");
        }
    }
}

/// Two nodes on an IPv6-only link with nothing but link-local addresses and no neighbour
/// tables: hellos to a link-local multicast group find each neighbour at its link-local
/// address, and in broadcast link mode the data goes to another group on the same link.
#[test]
fn ipv6_neighbours_are_found_by_link_local_multicast() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let port = free_port();
    let chain = NetnsChain::new_v6(2, 1500);
    let work = tempfile::tempdir().unwrap();
    let start = |i: u32| {
        let ifname = format!("h{}v0{}", chain.tag, if i == 1 { "a" } else { "b" });
        let extra = format!(
            "interface = \"{ifname}\"\ndiscovery_address = \"[ff02::7470]:{port}\"\n\
             hello_interval = \"500ms\"\nlink_mode = \"broadcast\"\n\
             broadcast_address = \"[ff02::7471]:{port}\""
        );
        let listen: std::net::SocketAddr = format!("[::]:{port}").parse().unwrap();
        let mut spec = chain_spec(
            2,
            i,
            listen,
            &|j| chain.addr6(j, i, port),
            Some(chain.names[i as usize - 1].clone()),
            &extra,
        );
        spec.neighbours.clear();
        spec.routes.clear();
        Hopd::start(spec, work.path().join(format!("n{i}")))
    };
    let nodes = [start(1), start(2)];
    wait_log(&nodes[0], "neighbour discovered", Duration::from_secs(10));
    wait_log(&nodes[1], "neighbour discovered", Duration::from_secs(10));
    let st = nodes[0].status();
    let n = &st["neighbours"][0];
    assert_eq!(n["id"], 2, "{st}");
    assert_eq!(n["discovered"], true, "{st}");
    let addr = n["address"].as_str().unwrap_or_default().to_string();
    assert!(addr.starts_with("[fe80::"), "a link-local address: {st}");
    let file = work.path().join("f.bin");
    let data = pattern(66, 300_000);
    std::fs::write(&file, &data).unwrap();
    let out = send(&nodes[0], &[&file], 2);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    receive_one_file(&nodes[1], &work.path().join("in"), "f.bin", &data);
}

/// IPv6 kernel routes (`kernel_routes = true`): on a three-node IPv6-only chain the end nodes
/// know each other only as `[[hosts]]`, and the kernel's routes through the relay give the
/// next hop; a file crosses.
#[test]
fn ipv6_kernel_routes_give_the_next_hop() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let port = free_port();
    let chain = NetnsChain::new_v6(3, 1500);
    let tag = chain.tag;
    ip_ok(&[
        "-n",
        &chain.names[0],
        "-6",
        "route",
        "add",
        &format!("fd00:{tag:x}:1::/64"),
        "via",
        &format!("fd00:{tag:x}:0::2"),
    ]);
    ip_ok(&[
        "-n",
        &chain.names[2],
        "-6",
        "route",
        "add",
        &format!("fd00:{tag:x}:0::/64"),
        "via",
        &format!("fd00:{tag:x}:1::1"),
    ]);
    let work = tempfile::tempdir().unwrap();
    let nodes: Vec<Hopd> = (1..=3)
        .map(|i| {
            let (other, addr) = match i {
                1 => (3, format!("fd00:{tag:x}:1::2")),
                _ => (1, format!("fd00:{tag:x}:0::1")),
            };
            let extra = if i == 2 {
                String::new()
            } else {
                format!("kernel_routes = true\n[[hosts]]\nid = {other}\naddress = \"{addr}\"")
            };
            let listen: std::net::SocketAddr = format!("[::]:{port}").parse().unwrap();
            let mut spec = chain_spec(
                3,
                i,
                listen,
                &|j| chain.addr6(j, i, port),
                Some(chain.names[i as usize - 1].clone()),
                &extra,
            );
            spec.routes.clear();
            Hopd::start(spec, work.path().join(format!("n{i}")))
        })
        .collect();
    let t0 = Instant::now();
    while nodes[0].status()["kernel_next_hops"]["3"].as_u64() != Some(2) {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "no kernel next hop to 3: {}\n{}",
            nodes[0].status(),
            nodes[0].log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let file = work.path().join("f.bin");
    let data = pattern(6, 500_000);
    std::fs::write(&file, &data).unwrap();
    let out = send(&nodes[0], &[&file], 3);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    receive_one_file(&nodes[2], &work.path().join("out"), "f.bin", &data);
}
