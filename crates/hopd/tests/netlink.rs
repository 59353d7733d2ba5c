//! Next hops from the kernel routing table (`kernel_routes = true`), live: four hopd in network
//! namespaces in a diamond (1 — 2 — 4 and 1 — 3 — 4). The end nodes know each other only as
//! `[[hosts]]` addresses; the kernel routes of namespaces 1 and 4 point through relay 2.
//! Mid-transfer the routes are replaced (`ip route replace`) to go through relay 3 and the
//! link 1 — 2 is taken down: hopd must follow the kernel and complete over the new path.
//! Needs root (network namespaces); not skipped as root.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// The kernel-learned next hop of `node` towards `dst`, from its status.
fn kernel_next_hop(node: &Hopd, dst: u32) -> Option<u64> {
    node.status()["kernel_next_hops"][dst.to_string()].as_u64()
}

fn wait_next_hop(node: &Hopd, dst: u32, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while kernel_next_hop(node, dst) != Some(want) {
        assert!(
            Instant::now() < deadline,
            "node {} never took next hop {want} towards {dst}: {}\n{}",
            node.spec.id,
            node.status(),
            node.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn kernel_route_change_is_followed_mid_transfer() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let tag = (std::process::id() % 200 + unique() * 7) % 250 + 1;
    let base = format!("hopr{}x{}", std::process::id(), unique());
    let ns: Vec<String> = (1..=4).map(|i| format!("{base}n{i}")).collect();
    let _guard = Namespaces(ns.clone());
    for n in &ns {
        ip_ok(&["netns", "add", n]);
        ip_ok(&["-n", n, "link", "set", "lo", "up"]);
    }
    let name = |i: u32| ns[i as usize - 1].as_str();
    // Link a — b: subnet 10.<tag>.<ab>.0/24, interface "l<b>" in a's namespace and "l<a>"
    // in b's, addresses .a and .b.
    let ip_on = |a: u32, b: u32| format!("10.{tag}.{}{}.{a}", a.min(b), a.max(b));
    for (a, b) in [(1u32, 2u32), (1, 3), (2, 4), (3, 4)] {
        let (ia, ib) = (format!("l{b}"), format!("l{a}"));
        ip_ok(&[
            "link",
            "add",
            &ia,
            "netns",
            name(a),
            "type",
            "veth",
            "peer",
            "name",
            &ib,
            "netns",
            name(b),
        ]);
        ip_ok(&[
            "-n",
            name(a),
            "addr",
            "add",
            &format!("{}/24", ip_on(a, b)),
            "dev",
            &ia,
        ]);
        ip_ok(&[
            "-n",
            name(b),
            "addr",
            "add",
            &format!("{}/24", ip_on(b, a)),
            "dev",
            &ib,
        ]);
        ip_ok(&["-n", name(a), "link", "set", &ia, "up"]);
        ip_ok(&["-n", name(b), "link", "set", &ib, "up"]);
    }
    // End nodes' own addresses, reachable only through the routes below.
    let host = |i: u32| format!("10.{tag}.100.{i}");
    for i in [1u32, 4] {
        ip_ok(&[
            "-n",
            name(i),
            "addr",
            "add",
            &format!("{}/32", host(i)),
            "dev",
            "lo",
        ]);
    }
    let route = |verb: &str, i: u32, to: u32, via: u32| {
        ip_ok(&[
            "-n",
            name(i),
            "route",
            verb,
            &format!("{}/32", host(to)),
            "via",
            &ip_on(via, i),
        ]);
    };
    route("add", 1, 4, 2);
    route("add", 4, 1, 2);
    let port = 7470;
    let sa = |ip: String| -> SocketAddr { format!("{ip}:{port}").parse().unwrap() };
    let work = tempfile::tempdir().unwrap();
    let neighbours = |i: u32| -> Vec<(u32, SocketAddr)> {
        let peers: &[u32] = match i {
            1 => &[2, 3],
            4 => &[2, 3],
            _ => &[1, 4],
        };
        peers.iter().map(|&j| (j, sa(ip_on(j, i)))).collect()
    };
    let nodes: Vec<Hopd> = (1..=4)
        .map(|i| {
            let extra = match i {
                1 => format!(
                    "kernel_routes = true\n[[hosts]]\nid = 4\naddress = \"{}\"\n",
                    sa(host(4))
                ),
                4 => format!(
                    "kernel_routes = true\n[[hosts]]\nid = 1\naddress = \"{}\"\n",
                    sa(host(1))
                ),
                _ => String::new(),
            };
            let spec = NodeSpec {
                id: i,
                listen: sa("0.0.0.0".into()),
                neighbours: neighbours(i),
                routes: Vec::new(),
                netns: Some(name(i).to_string()),
                extra,
            };
            Hopd::start(spec, work.path().join(format!("n{i}")))
        })
        .collect();
    // hopd learned the paths through relay 2 from the kernel.
    wait_next_hop(&nodes[0], 4, 2);
    wait_next_hop(&nodes[3], 1, 2);
    // Pace node 1's links so the transfer lasts long enough to change routes during it.
    for dev in ["l2", "l3"] {
        let o = Command::new("ip")
            .args([
                "netns",
                "exec",
                name(1),
                "tc",
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
            ])
            .args(["tbf", "rate", "40mbit", "burst", "64kb", "latency", "200ms"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let size = 16 * 1024 * 1024;
    let data = pattern(23, size);
    let file = work.path().join("rt.bin");
    std::fs::write(&file, &data).unwrap();
    let relay_rx = |n: &Hopd| n.counter("rx_bytes");
    let mut sender = ChildGuard(Some(spawn_send(&nodes[0], &file, 4)));
    let deadline = Instant::now() + Duration::from_secs(120);
    while incoming_bytes(&nodes[3]) < (size / 4) as u64 {
        assert!(sender.running(), "transfer ended early");
        assert!(
            Instant::now() < deadline,
            "no progress: {}",
            nodes[3].status()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        sender.running(),
        "transfer finished before the route change"
    );
    let via2_before = relay_rx(&nodes[1]);
    let via3_before = relay_rx(&nodes[2]);
    route("replace", 1, 4, 3);
    route("replace", 4, 1, 3);
    wait_next_hop(&nodes[0], 4, 3);
    wait_next_hop(&nodes[3], 1, 3);
    // The old path is gone: only relay 3 can carry the rest.
    ip_ok(&["-n", name(1), "link", "set", "l2", "down"]);
    let out = sender.wait(Duration::from_secs(180));
    assert!(
        out.status.success(),
        "send failed: {}\nsource log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        nodes[0].log()
    );
    let dir = work.path().join("out");
    let r = recv(&nodes[3], &dir, 1);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(
        std::fs::read(dir.join("rt.bin")).unwrap() == data,
        "file differs"
    );
    let via2 = relay_rx(&nodes[1]);
    let via3 = relay_rx(&nodes[2]);
    eprintln!(
        "relay 2 received {via2_before} bytes before the change, {via2} in all; relay 3 {via3_before}, {via3}"
    );
    assert!(
        via2_before > (size / 4) as u64,
        "relay 2 did not carry the start"
    );
    assert!(
        via3 - via3_before > (size / 2) as u64,
        "relay 3 did not carry the rest"
    );
    let st = nodes[0].status();
    assert!(st["kernel_routes"].as_u64().unwrap() >= 1, "{st}");
}
