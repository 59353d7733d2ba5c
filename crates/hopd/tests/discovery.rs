//! Neighbour discovery: nodes without `[[neighbours]]` find each other by authenticated
//! hellos on their link's broadcast address, move a file, notice a neighbour gone and back
//! at a new address, and detect a second node with the same id; nodes with nothing but
//! keys find each other over four hops.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn nodes_without_neighbour_tables_find_each_other_and_move_a_file() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let port = free_port();
    let chain = NetnsChain::new(2, 0, port);
    let work = tempfile::tempdir().unwrap();
    // Node 1 listens on the wildcard address (its event socket hears broadcasts) and finds
    // the broadcast address on its interface ("auto"); node 2 listens on its link address (a
    // second socket listens on the broadcast address), which it is given.
    let start = |i: u32, id: u32, listen_port: u16, dir: &str| {
        let (ip, discovery) = if i == 1 {
            (
                "0.0.0.0".to_string(),
                format!(
                    "discovery_address = \"auto\"\ninterface = \"h{}v0a\"\nhello_interval = \"500ms\"",
                    chain.tag
                ),
            )
        } else {
            (
                format!("10.{}.0.2", chain.tag),
                format!(
                    "discovery_address = \"10.{}.0.255:{port}\"\nhello_interval = \"500ms\"",
                    chain.tag
                ),
            )
        };
        let listen: std::net::SocketAddr = format!("{ip}:{listen_port}").parse().unwrap();
        let mut spec = chain_spec(
            2,
            i,
            listen,
            &|j| chain.addr(j, i, port),
            Some(chain.names[i as usize - 1].clone()),
            &discovery,
        );
        spec.id = id;
        spec.neighbours.clear();
        spec.routes.clear();
        Hopd::start(spec, work.path().join(dir))
    };
    let mut nodes = [start(1, 1, port, "n1"), start(2, 2, port, "n2")];
    wait_log(&nodes[0], "neighbour discovered", Duration::from_secs(10));
    wait_log(&nodes[1], "neighbour discovered", Duration::from_secs(10));
    let st = nodes[0].status();
    let n = &st["neighbours"][0];
    assert_eq!(n["id"], 2, "{st}");
    assert_eq!(n["discovered"], true, "{st}");
    assert_eq!(n["address"], format!("10.{}.0.2:{port}", chain.tag), "{st}");
    let file = work.path().join("f.bin");
    let data = pattern(60, 400_000);
    std::fs::write(&file, &data).unwrap();
    let out = send(&nodes[0], &[&file], 2);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = work.path().join("in");
    receive_one_file(&nodes[1], &dir, "f.bin", &data);
    // A second node with id 1 on the link: node 1 says so.
    let dup = start(2, 1, free_port(), "dup");
    wait_log(
        &nodes[0],
        "another node uses this node's id",
        Duration::from_secs(10),
    );
    // (Gone again before node 2 comes back, which would learn node 1 at both places.)
    drop(dup);
    // Node 2 goes: node 1 forgets it after 3.5 hello intervals.
    nodes[1].terminate();
    wait_log(&nodes[0], "neighbour lost", Duration::from_secs(10));
    assert_eq!(
        nodes[0].status()["neighbours"].as_array().map(Vec::len),
        Some(0)
    );
    // It comes back at another address (a new lease): node 1 learns it there and a file
    // crosses again.
    ip_ok(&[
        "-n",
        &chain.names[1],
        "addr",
        "add",
        &format!("10.{}.0.3/24", chain.tag),
        "dev",
        &format!("h{}v0b", chain.tag),
    ]);
    let mut spec = nodes[1].spec.clone();
    spec.listen = format!("10.{}.0.3:{port}", chain.tag).parse().unwrap();
    nodes[1] = Hopd::start(spec, work.path().join("n2-back"));
    let moved = format!("10.{}.0.3:{port}", chain.tag);
    let t0 = std::time::Instant::now();
    while !nodes[0].status()["neighbours"].as_array().is_some_and(|n| {
        n.iter()
            .any(|n| n["id"] == 2 && n["address"] == moved.as_str())
    }) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "node 2 not learned at its new address: {}",
            nodes[0].log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let data = pattern(61, 300_000);
    std::fs::write(&file, &data).unwrap();
    let out = send(&nodes[0], &[&file], 2);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    receive_one_file(&nodes[1], &work.path().join("in2"), "f.bin", &data);
}

/// A chain of `n` namespaces whose nodes are configured as in the field: each with its own
/// key, one members file admitting all, sessions, hellos every `hello` on the broadcast
/// address of each of its links, and kernel routes to every link (as a routing daemon would
/// install them); no neighbours, hosts or routes. Returns the chain (kept for its drop), the
/// nodes' ids and the nodes.
fn field_chain(n: u32, hello: &str, work: &std::path::Path) -> (NetnsChain, Vec<u32>, Vec<Hopd>) {
    let port = free_port();
    let chain = NetnsChain::new(n, 0, port);
    let t = chain.tag;
    // Link k joins namespaces k and k+1: 10.t.k.1 and 10.t.k.2.
    for i in 0..n {
        for k in 0..n - 1 {
            let gw = if k > i {
                format!("10.{t}.{i}.2")
            } else if k + 1 < i {
                format!("10.{t}.{}.1", i - 1)
            } else {
                continue;
            };
            ip_ok(&[
                "-n",
                &chain.names[i as usize],
                "route",
                "add",
                &format!("10.{t}.{k}.0/24"),
                "via",
                &gw,
            ]);
        }
    }
    let keys: Vec<(String, u32)> = (0..n)
        .map(|i| keygen(&work.join(format!("node{i}.key"))))
        .collect();
    let members = work.join("members");
    let list: String = keys.iter().map(|k| format!("{}\n", k.0)).collect();
    std::fs::write(&members, list).unwrap();
    let nodes: Vec<Hopd> = (0..n)
        .map(|i| {
            let mut links = Vec::new();
            if i > 0 {
                links.push(format!("\"10.{t}.{}.255:{port}\"", i - 1));
            }
            if i + 1 < n {
                links.push(format!("\"10.{t}.{i}.255:{port}\""));
            }
            let extra = format!(
                "discovery_addresses = [{}]\nhello_interval = \"{hello}\"\nkernel_routes = true\n\
                 security.node_key_file = \"{}\"\nsecurity.members_file = \"{}\"\nsecurity.sessions = true",
                links.join(", "),
                work.join(format!("node{i}.key")).display(),
                members.display()
            );
            let spec = NodeSpec {
                id: keys[i as usize].1,
                listen: format!("0.0.0.0:{port}").parse().unwrap(),
                neighbours: vec![],
                routes: vec![],
                netns: Some(chain.names[i as usize].clone()),
                extra,
            };
            Hopd::start(spec, work.join(format!("n{i}")))
        })
        .collect();
    (chain, keys.into_iter().map(|k| k.1).collect(), nodes)
}

/// Five nodes in a chain (four hops) configured with nothing but their keys, the members,
/// their links' broadcast addresses and kernel routes (as a routing daemon would install
/// them): they find their neighbours by hellos, exchange session keys, learn every node's
/// addresses from the directory, and a file crosses all four hops.
#[test]
fn nodes_with_only_keys_find_each_other_and_move_a_file_over_four_hops() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    const N: u32 = 5;
    let work = tempfile::tempdir().unwrap();
    let (_chain, ids, nodes) = field_chain(N, "300ms", work.path());
    let last = ids[N as usize - 1];
    let t0 = std::time::Instant::now();
    while !nodes[0].status()["directory"]
        .as_array()
        .is_some_and(|d| d.iter().any(|e| e["id"] == last))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "node 0 never learned the last node: {}",
            nodes[0].log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let file = work.path().join("f.bin");
    let data = pattern(81, 500_000);
    std::fs::write(&file, &data).unwrap();
    let out = send(&nodes[0], &[&file], last);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        nodes[0].log()
    );
    receive_one_file(
        &nodes[N as usize - 1],
        &work.path().join("in"),
        "f.bin",
        &data,
    );
    let relay = nodes[2].status();
    assert_eq!(
        relay["neighbours"].as_array().map(Vec::len),
        Some(2),
        "{relay}"
    );
    // On loss-free links every hello arrives.
    for n in relay["neighbours"].as_array().unwrap() {
        assert_eq!(n["hello_quality"].as_f64(), Some(1.0), "{relay}");
    }
}

/// Benchmark, not run by default (`cargo test --release -p hopd --test discovery --
/// --ignored --nocapture`): the same five-namespace chain (four hops, no loss), once as
/// configured in the field (keys, members, sessions, discovery, the directory and kernel
/// routes: nothing else) and once as before (one mesh key, neighbours and routes listed),
/// back to back; prints how long the field nodes took to learn the last node and to hold
/// every neighbour's key, and each configuration's time for one 64 MiB file.
#[test]
#[ignore]
fn bench_field_configuration_against_listed_neighbours() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    const N: u32 = 5;
    const SIZE: usize = 64 << 20;
    for field in [true, false, true, false] {
        let work = tempfile::tempdir().unwrap();
        let started = std::time::Instant::now();
        let (_chain, ids, nodes) = if field {
            let (chain, ids, nodes) = field_chain(N, "1s", work.path());
            let last = ids[N as usize - 1];
            while !nodes[0].status()["directory"]
                .as_array()
                .is_some_and(|d| d.iter().any(|e| e["id"] == last))
            {
                assert!(started.elapsed() < Duration::from_secs(60));
                std::thread::sleep(Duration::from_millis(20));
            }
            let learned = started.elapsed();
            let keyed = |n: &Hopd| {
                let st = n.status();
                st["neighbours"]
                    .as_array()
                    .is_some_and(|v| !v.is_empty() && v.iter().all(|x| x["session_key"] == true))
            };
            while !nodes.iter().all(keyed) {
                std::thread::sleep(Duration::from_millis(20));
            }
            eprintln!(
                "field: node 0 learned the last node after {:.2} s; every node held its neighbours' keys after {:.2} s (hello_interval 1 s)",
                learned.as_secs_f64(),
                started.elapsed().as_secs_f64()
            );
            (chain, ids, nodes)
        } else {
            let port = free_port();
            let chain = NetnsChain::new(N, 0, port);
            let nodes = netns_nodes(&chain, N, port, work.path(), "");
            (chain, (1..=N).collect(), nodes)
        };
        let file = work.path().join("big.bin");
        std::fs::write(&file, pattern(5, SIZE)).unwrap();
        let t0 = std::time::Instant::now();
        let out = send(&nodes[0], &[&file], ids[N as usize - 1]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let secs = t0.elapsed().as_secs_f64();
        eprintln!(
            "{}: 64 MiB over 4 hops in {secs:.2} s ({:.0} Mbit/s)",
            if field {
                "field (sessions, directory, kernel routes)"
            } else {
                "listed (mesh key, neighbours, routes)"
            },
            SIZE as f64 * 8.0 / secs / 1e6
        );
    }
}
