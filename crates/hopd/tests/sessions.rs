//! Per-neighbour sessions (`[security] sessions = true`): members with node keys and no
//! mesh key exchange their sender keys by Noise handshakes, move files over relays, take a
//! restarted neighbour back, and stop giving keys to a revoked node.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;

/// Three nodes in a chain on loopback with node keys, one members file and sessions.
struct Mesh {
    nodes: Vec<Hopd>,
    ids: Vec<u32>,
    keys: Vec<String>,
    members: Vec<std::path::PathBuf>,
    work: tempfile::TempDir,
}

fn mesh3() -> Mesh {
    let work = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = |i: usize| -> SocketAddr { format!("127.0.0.{}:{port}", i + 1).parse().unwrap() };
    let made: Vec<(String, u32)> = (0..3)
        .map(|i| keygen(&work.path().join(format!("node{i}.key"))))
        .collect();
    let ids: Vec<u32> = made.iter().map(|m| m.1).collect();
    let keys: Vec<String> = made.iter().map(|m| m.0.clone()).collect();
    let list: String = keys
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{k} node-{i}\n"))
        .collect();
    let mut members = Vec::new();
    let mut nodes = Vec::new();
    for i in 0..3 {
        // Every node its own copy of the members file, as on routers.
        let m = work.path().join(format!("members{i}"));
        std::fs::write(&m, &list).unwrap();
        let mut neighbours = Vec::new();
        let mut routes = Vec::new();
        if i > 0 {
            neighbours.push((ids[i - 1], addr(i - 1)));
        }
        if i < 2 {
            neighbours.push((ids[i + 1], addr(i + 1)));
        }
        if i == 0 {
            routes.push((ids[2], ids[1]));
        }
        if i == 2 {
            routes.push((ids[0], ids[1]));
        }
        let spec = NodeSpec {
            id: ids[i],
            listen: addr(i),
            neighbours,
            routes,
            netns: None,
            extra: format!(
                "security.node_key_file = \"{}\"\nsecurity.members_file = \"{}\"\nsecurity.sessions = true",
                work.path().join(format!("node{i}.key")).display(),
                m.display()
            ),
        };
        nodes.push(Hopd::start(spec, work.path().join(format!("n{i}"))));
        members.push(m);
    }
    Mesh {
        nodes,
        ids,
        keys,
        members,
        work,
    }
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < limit, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether `node` holds the session key of every neighbour in its status.
fn keyed(node: &Hopd) -> bool {
    let st = node.status();
    st["sessions"] == true
        && st["neighbours"]
            .as_array()
            .is_some_and(|n| !n.is_empty() && n.iter().all(|n| n["session_key"] == true))
}

fn send_file(m: &Mesh, name: &str, seed: u64) {
    let file = m.work.path().join(name);
    let data = pattern(seed, 300_000);
    std::fs::write(&file, &data).unwrap();
    let out = send(&m.nodes[0], &[&file], m.ids[2]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    receive_one_file(
        &m.nodes[2],
        &m.work.path().join(format!("in-{name}")),
        name,
        &data,
    );
}

#[test]
fn members_with_sessions_move_a_file_and_take_a_restarted_neighbour_back() {
    let mut m = mesh3();
    wait_for(
        "every node holds its neighbours' keys",
        Duration::from_secs(15),
        || m.nodes.iter().all(keyed),
    );
    for n in &m.nodes {
        assert!(n.counter("sessions_completed") >= 1, "{}", n.log());
        assert_eq!(n.counter("sessions_refused"), 0, "{}", n.log());
    }
    let shown = String::from_utf8_lossy(&m.nodes[1].hop(&["status"]).stdout).to_string();
    assert!(
        shown.contains("neighbours:") && !shown.contains("no session key yet"),
        "{shown}"
    );
    send_file(&m, "a.bin", 1);
    // The relay restarts: a new sender key, handshakes again, and the next file crosses.
    m.nodes[1].terminate();
    m.nodes[1].restart();
    wait_for(
        "the restarted relay holds its neighbours' keys",
        Duration::from_secs(15),
        || keyed(&m.nodes[1]),
    );
    send_file(&m, "b.bin", 2);
    assert_eq!(m.nodes[0].counter("auth_replays"), 0);
}

#[test]
fn a_revoked_node_gets_no_new_key_and_is_refused() {
    let m = mesh3();
    wait_for(
        "every node holds its neighbours' keys",
        Duration::from_secs(15),
        || m.nodes.iter().all(keyed),
    );
    send_file(&m, "a.bin", 3);
    // The relay revokes the destination: it forgets that node's key and makes a new one of
    // its own, which only node 0 gets.
    let relay = &m.nodes[1];
    let out = relay.hop(&[
        "revoke",
        &m.keys[2],
        "--members",
        m.members[1].to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_log(
        relay,
        "new sender key after a revocation",
        Duration::from_secs(5),
    );
    wait_for(
        "node 0 takes the relay's new key",
        Duration::from_secs(15),
        || {
            m.nodes[0]
                .log()
                .matches("session: neighbour's key received")
                .count()
                >= 2
        },
    );
    // What the relay forwards to the revoked node no longer opens there; the revoked node
    // asks for a new handshake and the relay refuses it.
    let before = m.nodes[2].counter("auth_failures");
    let file = m.work.path().join("c.bin");
    std::fs::write(&file, pattern(4, 100_000)).unwrap();
    send_detached(&m.nodes[0], &file, m.ids[2]);
    wait_for(
        "the revoked node fails to open the relay's datagrams",
        Duration::from_secs(20),
        || m.nodes[2].counter("auth_failures") > before,
    );
    wait_for(
        "the relay refuses the revoked node's handshake",
        Duration::from_secs(20),
        || relay.counter("sessions_refused") > 0,
    );
    assert!(relay.log().contains("is not a member"), "{}", relay.log());
    let st = relay.status();
    let gone = st["neighbours"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == m.ids[2])
        .cloned();
    assert_eq!(
        gone.map(|n| n["session_key"].clone()),
        Some(false.into()),
        "{st}"
    );
    let shown = String::from_utf8_lossy(&relay.hop(&["status"]).stdout).to_string();
    assert!(shown.contains("no session key yet"), "{shown}");
    assert_eq!(m.nodes[2].status()["inbox"], 0);
}

/// With discovery and sessions nothing is configured but the keys: the hellos travel
/// unsealed and signed, each node learns the other, they exchange keys and a file crosses.
#[test]
fn discovered_members_exchange_keys_and_move_a_file() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let port = free_port();
    let chain = NetnsChain::new(2, 0, port);
    let work = tempfile::tempdir().unwrap();
    let keys: Vec<(String, u32)> = (1..=2)
        .map(|i| keygen(&work.path().join(format!("node{i}.key"))))
        .collect();
    let members = work.path().join("members");
    std::fs::write(&members, format!("{} a\n{} b\n", keys[0].0, keys[1].0)).unwrap();
    let start = |i: u32| {
        let extra = format!(
            "discovery_address = \"10.{}.0.255:{port}\"\nhello_interval = \"300ms\"\n\
             security.node_key_file = \"{}\"\nsecurity.members_file = \"{}\"\nsecurity.sessions = true",
            chain.tag,
            work.path().join(format!("node{i}.key")).display(),
            members.display()
        );
        let listen: SocketAddr = format!("0.0.0.0:{port}").parse().unwrap();
        let mut spec = chain_spec(
            2,
            i,
            listen,
            &|j| chain.addr(j, i, port),
            Some(chain.names[i as usize - 1].clone()),
            &extra,
        );
        spec.id = keys[i as usize - 1].1;
        spec.neighbours.clear();
        spec.routes.clear();
        Hopd::start(spec, work.path().join(format!("n{i}")))
    };
    let nodes = [start(1), start(2)];
    for n in &nodes {
        wait_log(n, "neighbour discovered", Duration::from_secs(10));
    }
    wait_for("both hold the other's key", Duration::from_secs(15), || {
        nodes.iter().all(keyed)
    });
    let file = work.path().join("f.bin");
    let data = pattern(72, 200_000);
    std::fs::write(&file, &data).unwrap();
    let out = send(&nodes[0], &[&file], keys[1].1);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    receive_one_file(&nodes[1], &work.path().join("in"), "f.bin", &data);
    assert_eq!(nodes[0].counter("auth_bad_hello"), 0);
}
