//! Failures an operator and a user can see: a mesh key that differs, a next hop that
//! answers nothing. Each is logged at warn with what to check, and `hop send` says why it
//! waits.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// Node 2 runs with another mesh key. Node 2 warns that datagrams fail authentication
/// (once, with a count, not per datagram); node 1 warns that its next hop answers nothing;
/// the waiting `hop send` prints why it waits. Before, both logs stayed silent at info.
#[test]
fn a_wrong_mesh_key_is_logged_on_both_nodes_and_the_sender_says_why_it_waits() {
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("f.txt");
    std::fs::write(&file, pattern(12, 10_000)).unwrap();
    let mut nodes = loopback_chain(2, work.path(), "");
    nodes[1].terminate();
    let text = std::fs::read_to_string(nodes[1].config_path()).unwrap();
    let key = text
        .lines()
        .find_map(|l| l.strip_prefix("mesh_key = \""))
        .unwrap()
        .trim_end_matches('"')
        .to_string();
    let other: String = key.chars().rev().collect();
    std::fs::write(nodes[1].config_path(), text.replace(&key, &other)).unwrap();
    nodes[1].restart();
    let mut sender = ChildGuard(Some(spawn_send(&nodes[0], &file, 2)));
    let t0 = Instant::now();
    while !nodes[0].log().contains("next hop answers nothing") {
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", nodes[0].log());
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(500));
    let _ = sender.0.as_mut().unwrap().kill();
    let out = sender.wait(Duration::from_secs(5));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("next hop 2") && err.contains("answers nothing"),
        "{err}"
    );
    let log2 = nodes[1].log();
    assert_eq!(log2.matches("fail authentication").count(), 1, "{log2}");
    assert!(log2.contains("mesh_key"), "{log2}");
    assert!(nodes[1].counter("auth_failures") > 1);
}

/// Node 2 does not list node 1 among its neighbours: it cannot answer it, and it says so,
/// naming the node and what to add (once, not per datagram).
#[test]
fn a_node_missing_from_neighbours_is_named_with_the_fix() {
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("f.txt");
    std::fs::write(&file, pattern(16, 10_000)).unwrap();
    let mut nodes = loopback_chain(2, work.path(), "");
    nodes[1].kill9();
    nodes[1].spec.neighbours.clear();
    Hopd::write_config(&nodes[1].spec, &nodes[1].dir, nodes[1].metrics);
    nodes[1].restart_serving();
    let mut sender = ChildGuard(Some(spawn_send(&nodes[0], &file, 2)));
    let t0 = Instant::now();
    while !nodes[1].log().contains("not among [[neighbours]]") {
        assert!(t0.elapsed() < Duration::from_secs(20), "{}", nodes[1].log());
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    let _ = sender.0.as_mut().unwrap().kill();
    let log = nodes[1].log();
    assert_eq!(log.matches("not among [[neighbours]]").count(), 1, "{log}");
    assert!(log.contains("node=1"), "{log}");
}

#[test]
fn a_datagram_of_another_wire_version_is_named_with_the_fix() {
    let work = tempfile::tempdir().unwrap();
    let nodes = loopback_chain(2, work.path(), "");
    // A version-2 envelope header (an earlier release's datagram), padded past the header.
    let mut dg = vec![0x48, 0x50, 2, 1];
    dg.resize(64, 0);
    let sock = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
    let t0 = Instant::now();
    while !nodes[0].log().contains("another wire version") {
        assert!(t0.elapsed() < Duration::from_secs(20), "{}", nodes[0].log());
        sock.send_to(&dg, nodes[0].spec.listen).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = nodes[0].log();
    assert!(log.contains("version=2"), "{log}");
    assert!(log.contains("upgrade every node"), "{log}");
}
