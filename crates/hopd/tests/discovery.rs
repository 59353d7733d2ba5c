//! Neighbour discovery: nodes without `[[neighbours]]` find each other by authenticated
//! hellos on their link's broadcast address, move a file, notice a neighbour gone, and
//! detect a second node with the same id.

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
    let discovery = format!(
        "discovery_address = \"10.{}.0.255:{port}\"\nhello_interval = \"500ms\"",
        chain.tag
    );
    // Node 1 listens on the wildcard address (its event socket hears broadcasts), node 2 on
    // its link address (a second socket listens on the broadcast address).
    let start = |i: u32, id: u32, listen_port: u16, dir: &str| {
        let ip = if i == 1 {
            "0.0.0.0".to_string()
        } else {
            format!("10.{}.0.2", chain.tag)
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
    let mut nodes = vec![start(1, 1, port, "n1"), start(2, 2, port, "n2")];
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
    let _dup = start(2, 1, free_port(), "dup");
    wait_log(
        &nodes[0],
        "another node uses this node's id",
        Duration::from_secs(10),
    );
    // Node 2 goes: node 1 forgets it after 3.5 hello intervals.
    nodes[1].terminate();
    wait_log(&nodes[0], "neighbour lost", Duration::from_secs(10));
    assert_eq!(
        nodes[0].status()["neighbours"].as_array().map(Vec::len),
        Some(0)
    );
    nodes.truncate(1);
}
