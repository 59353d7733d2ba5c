//! Node keys and membership: `hop keygen` makes a node's key and id, a node learns only
//! neighbours whose hellos a member signed, `hop admit` lets one in without a restart, and
//! `hop revoke` puts it out again.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn only_admitted_nodes_are_learned_and_a_revoked_one_is_dropped() {
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
    // Keygen keeps an existing key and says which it is.
    assert_eq!(keygen(&work.path().join("node1.key")), keys[0]);
    // Node 1 admits only itself at first; node 2 admits both.
    let members = |i: usize| work.path().join(format!("members{i}"));
    std::fs::write(members(1), format!("{} node-1\n", keys[0].0)).unwrap();
    std::fs::write(
        members(2),
        format!("{} node-1\n{} node-2\n", keys[0].0, keys[1].0),
    )
    .unwrap();
    let start = |i: u32| {
        let (_, id) = keys[i as usize - 1];
        let extra = format!(
            "discovery_address = \"10.{}.0.255:{port}\"\nhello_interval = \"300ms\"\n\
             security.node_key_file = \"{}\"\nsecurity.members_file = \"{}\"",
            chain.tag,
            work.path().join(format!("node{i}.key")).display(),
            members(i as usize).display()
        );
        let listen: std::net::SocketAddr = format!("0.0.0.0:{port}").parse().unwrap();
        let mut spec = chain_spec(
            2,
            i,
            listen,
            &|j| chain.addr(j, i, port),
            Some(chain.names[i as usize - 1].clone()),
            &extra,
        );
        spec.id = id;
        spec.neighbours.clear();
        spec.routes.clear();
        Hopd::start(spec, work.path().join(format!("n{i}")))
    };
    let nodes = [start(1), start(2)];
    // Node 2 learns node 1; node 1 refuses node 2 and names the command that admits it.
    wait_log(&nodes[1], "neighbour discovered", Duration::from_secs(10));
    wait_log(&nodes[0], "not a member", Duration::from_secs(10));
    assert!(nodes[0].log().contains(&format!("hop admit {}", keys[1].0)));
    assert!(!nodes[0].log().contains("neighbour discovered"));
    assert!(nodes[0].counter("auth_not_member") > 0);
    // Admitted: node 1 re-reads its members and learns node 2; a file crosses.
    let m1 = members(1);
    let out = nodes[0].hop(&[
        "admit",
        &keys[1].0,
        "--name",
        "node-2",
        "--members",
        m1.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_log(&nodes[0], "neighbour discovered", Duration::from_secs(10));
    let file = work.path().join("f.bin");
    let data = pattern(71, 200_000);
    std::fs::write(&file, &data).unwrap();
    let out = send(&nodes[0], &[&file], keys[1].1);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    receive_one_file(&nodes[1], &work.path().join("in"), "f.bin", &data);
    // Revoked: node 1 forgets node 2 at once and drops what it sends.
    let out = nodes[0].hop(&["revoke", &keys[1].0, "--members", m1.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_log(&nodes[0], "neighbour revoked", Duration::from_secs(5));
    assert_eq!(
        nodes[0].status()["neighbours"].as_array().map(Vec::len),
        Some(0)
    );
    let dropped = nodes[0].counter("auth_not_member");
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        nodes[0].counter("auth_not_member") > dropped,
        "its hellos are still dropped"
    );
}
