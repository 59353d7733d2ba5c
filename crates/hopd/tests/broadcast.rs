//! Overhearing on one shared segment: three hopd in network namespaces on one bridge (one
//! broadcast domain), a transfer 1 → 2 → 3 with static routes.
//! - Broadcast data link mode (`link_mode = "broadcast"`): data datagrams go to the subnet's
//!   broadcast address, so the node that is not the link destination overhears them (Hop §3.2).
//! - `overhear = true` on a bridge that floods every frame like a radio channel (it learns no
//!   addresses): the neighbours' unicast datagrams reach each node's packet socket, and HxH's
//!   passive feedback (HxH §3.2) takes the place of per-packet acknowledgements.
//!
//! Needs root (network namespaces); not skipped as root.

mod common;

use std::net::SocketAddr;

use common::*;

/// Transfer a file 1 → 2 → 3 over one bridge with `link_mode = mode`; returns the datagrams
/// nodes 1 and 3 overheard.
fn transfer_on_one_bridge(mode: &str) -> (u64, u64) {
    let extra = |tag: u32, port: u16| {
        format!("link_mode = \"{mode}\"\nbroadcast_address = \"10.{tag}.0.255:{port}\"")
    };
    let st = transfer_on_bridge(&extra, false, false);
    let overheard = |s: &serde_json::Value| s["node"]["datagrams_overheard"].as_u64().unwrap();
    (overheard(&st[0]), overheard(&st[2]))
}

/// Transfer a file 1 → 2 → 3 over one bridge, each node configured with `extra(tag, port)`;
/// a `hub` bridge floods every frame to every port; `v6`: the nodes have only IPv6
/// addresses (fd00:<tag>::<i>/64, no duplicate address detection) and listen on them.
/// Returns the nodes' statuses.
fn transfer_on_bridge(
    extra: &dyn Fn(u32, u16) -> String,
    hub: bool,
    v6: bool,
) -> Vec<serde_json::Value> {
    let (tag, node_ns, _guard) = bridge_segment(3, hub);
    for (i, ns) in node_ns.iter().enumerate() {
        if v6 {
            let addr = format!("fd00:{tag:x}::{}/64", i + 1);
            ip_ok(&["-n", ns, "addr", "add", &addr, "dev", "eth0", "nodad"]);
        } else {
            let addr = format!("10.{tag}.0.{}/24", i + 1);
            ip_ok(&["-n", ns, "addr", "add", &addr, "dev", "eth0"]);
        }
        ip_ok(&["-n", ns, "link", "set", "eth0", "up"]);
    }
    let port = 7470;
    let addr = |i: u32| -> SocketAddr {
        if v6 {
            format!("[fd00:{tag:x}::{i}]:{port}").parse().unwrap()
        } else {
            format!("10.{tag}.0.{i}:{port}").parse().unwrap()
        }
    };
    let extra = extra(tag, port);
    let work = tempfile::tempdir().unwrap();
    let nodes: Vec<Hopd> = (1..=3)
        .map(|i| {
            let spec = chain_spec(
                3,
                i,
                addr(i),
                &addr,
                Some(node_ns[i as usize - 1].clone()),
                &extra,
            );
            Hopd::start(spec, work.path().join(format!("n{i}")))
        })
        .collect();
    let size = 4 * 1024 * 1024;
    let data = pattern(77, size);
    let file = work.path().join("bc.bin");
    std::fs::write(&file, &data).unwrap();
    let out = send(&nodes[0], &[&file], 3);
    assert!(
        out.status.success(),
        "send failed: {}\nrelay log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        nodes[1].log()
    );
    let dir = work.path().join("out");
    let r = recv(&nodes[2], &dir, 1);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(
        std::fs::read(dir.join("bc.bin")).unwrap() == data,
        "file differs"
    );
    let st: Vec<serde_json::Value> = nodes.iter().map(|n| n.status()).collect();
    assert_eq!(st[1]["counters"]["tx_no_address"], 0, "{}", st[1]);
    st
}

#[test]
fn broadcast_mode_transfer_is_overheard() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    // Node 3 is not the link destination of the data 1 → 2 but shares the medium; node 1
    // likewise hears the data 2 → 3.
    let (o1, o3) = transfer_on_one_bridge("broadcast");
    eprintln!("broadcast mode, datagrams overheard: node 1 {o1}, node 3 {o3}");
    assert!(o3 > 0, "node 3 overheard nothing");
    assert!(o1 > 0, "node 1 overheard nothing");
    // Control: in unicast mode on the same kind of bridge nothing is overheard, so the
    // counts above come from the broadcast data.
    let (u1, u3) = transfer_on_one_bridge("unicast");
    eprintln!("unicast mode, datagrams overheard: node 1 {u1}, node 3 {u3}");
    assert_eq!((u1, u3), (0, 0));
}

#[test]
fn hxh_learns_from_overheard_forwards_instead_of_per_packet_acks() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let run = |overhear: bool| {
        let extra = move |_: u32, _: u16| format!("transport = \"hxh\"\noverhear = {overhear}");
        transfer_on_bridge(&extra, true, false)
    };
    let hxh = |s: &serde_json::Value| s["node"]["transports"][0][1].clone();
    let count = |v: &serde_json::Value, a: &str, b: &str| v[a][b].as_u64().unwrap_or(0);
    let passive = run(true);
    let (src, relay) = (hxh(&passive[0]), hxh(&passive[1]));
    let relay_data = count(&relay, "sent_by_type", "data");
    let relay_acks = count(&relay, "sent_by_type", "hopack");
    eprintln!(
        "overhear: node 1 read {} datagrams, {} passive acks; relay sent {relay_data} data, {relay_acks} hop acks",
        passive[0]["counters"]["rx_overheard"],
        count(&src, "extra", "passive_acks")
    );
    // Node 1 hears the relay forward its packets and takes that as their acknowledgement; the
    // relay acknowledges only what it cannot show by forwarding (duplicates, refusals).
    assert!(passive[0]["counters"]["rx_overheard"].as_u64().unwrap() > 0);
    assert!(count(&src, "extra", "passive_acks") > 0, "{src}");
    assert!(relay_acks * 4 < relay_data, "{relay}");
    // Without overhearing the relay acknowledges every packet (§3.4's explicit variant).
    let explicit = run(false);
    let relay = hxh(&explicit[1]);
    assert_eq!(explicit[0]["counters"]["rx_overheard"], 0);
    // Every packet the relay received is acknowledged; what it sent counts its own
    // retransmissions too, which a loaded machine (dropped datagrams) makes more of.
    let first_sends = count(&relay, "sent_by_type", "data")
        .saturating_sub(relay["data_retransmissions"].as_u64().unwrap_or(0));
    assert!(
        count(&relay, "sent_by_type", "hopack") >= first_sends,
        "{relay}"
    );
}

/// IPv6: on a hub bridge, with `overhear = true`, the end nodes of a Hop transfer 1 -> 2 -> 3
/// read the unicast datagrams they are not the destination of (the packet filter takes
/// IPv6 UDP to the mesh port when hopd listens on IPv6).
#[test]
fn ipv6_unicast_between_neighbours_is_overheard() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let extra = |_: u32, _: u16| "overhear = true".to_string();
    let st = transfer_on_bridge(&extra, true, true);
    let overheard = |s: &serde_json::Value| s["counters"]["rx_overheard"].as_u64().unwrap();
    eprintln!(
        "IPv6, datagrams overheard: node 1 {}, node 3 {}",
        overheard(&st[0]),
        overheard(&st[2])
    );
    assert!(overheard(&st[0]) > 0, "node 1 overheard nothing: {}", st[0]);
    assert!(overheard(&st[2]) > 0, "node 3 overheard nothing: {}", st[2]);
}
