//! Transfers that end before their destination has them: interrupted sends, `hop send
//! --detach`, `hop list`, `hop cancel` and lifetimes. What a sender cancelled, or what
//! expired, is aborted along its path and never delivered, even when the path was down then.

mod common;

use std::time::{Duration, Instant};

use common::*;

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn list(node: &Hopd) -> Vec<serde_json::Value> {
    let o = node.hop(&["list", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A small file is handed over whole at once; its destination is down. Interrupting
/// `hop send` then cancels it: when the destination returns, nothing arrives (before, the
/// transfer went on alone and a resend delivered a second copy).
#[test]
fn an_interrupted_send_to_a_node_that_is_down_is_cancelled_and_never_delivered() {
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("note.txt");
    std::fs::write(&file, pattern(7, 20_000)).unwrap();
    let mut nodes = loopback_chain(2, work.path(), "");
    nodes[1].terminate();
    let mut sender = ChildGuard(Some(spawn_send(&nodes[0], &file, 2)));
    wait_for("the flow listed", Duration::from_secs(10), || {
        list(&nodes[0]).len() == 1
    });
    let flows = list(&nodes[0]);
    assert_eq!(flows[0]["name"], "note.txt");
    assert_eq!(flows[0]["attached"], true);
    assert!(
        sender.running(),
        "hop send ended while its destination was down"
    );
    // What Ctrl-C does to the client: it goes away.
    let _ = sender.0.as_mut().unwrap().kill();
    let _ = sender.wait(Duration::from_secs(5));
    wait_for("the flow cancelled", Duration::from_secs(5), || {
        list(&nodes[0]).is_empty()
    });
    assert_eq!(nodes[0].counter("flows_cancelled"), 1);
    // The operator reads why in the log, which carries no terminal colour codes.
    let log = nodes[0].log();
    assert!(
        log.contains("flow cancelled") && log.contains("note.txt"),
        "{log}"
    );
    assert!(!log.contains('\x1b'), "escape codes in the log file");
    nodes[1].restart();
    std::thread::sleep(Duration::from_secs(6));
    let st = nodes[1].status();
    assert_eq!(st["counters"]["files_received"], 0, "{st}");
    assert_eq!(st["inbox"], 0, "{st}");
    // A new send completes as usual.
    let out = send(&nodes[0], &[&file], 2);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `hop send` returns on the end-to-end acknowledgement, which follows the durable write;
    // the file enters the inbox after its check on the finisher's thread, a moment later.
    wait_for("the file in the inbox", Duration::from_secs(10), || {
        nodes[1].status()["inbox"] == 1
    });
}

/// `hop send --detach` returns once hopd holds the file; `hop list` shows the transfer
/// detached, `hop cancel` cancels it (a second cancel says there is no such flow), and the
/// destination, back later, gets nothing.
#[test]
fn a_detached_send_is_listed_and_cancelled() {
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("big.bin");
    std::fs::write(&file, pattern(8, 300_000)).unwrap();
    let mut nodes = loopback_chain(2, work.path(), "");
    nodes[1].terminate();
    let path = file.to_str().unwrap();
    let bad = nodes[0].hop(&["send", "--priority", "urgent", path, "--to", "2"]);
    assert_eq!(
        bad.status.code(),
        Some(2),
        "an unknown class is a usage error"
    );
    let out = nodes[0].hop(&[
        "--json",
        "send",
        "--detach",
        "--priority",
        "expedited",
        path,
        "--to",
        "2",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["queued"], true, "{r}");
    let flows = list(&nodes[0]);
    assert_eq!(flows.len(), 1);
    assert_eq!(flows[0]["attached"], false);
    assert_eq!(flows[0]["size"], 300_000);
    assert_eq!(flows[0]["priority"], "expedited");
    let flow = flows[0]["flow"].as_str().unwrap().to_string();
    let table = nodes[0].hop(&["list"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("big.bin") && table.contains("detached") && table.contains("expedited"),
        "{table}"
    );
    // `hop status` shows it too, with units, not raw JSON.
    let st = nodes[0].hop(&["status"]);
    let st = String::from_utf8_lossy(&st.stdout);
    assert!(
        st.contains("outgoing transfers: 1") && st.contains("300.0 kB"),
        "{st}"
    );
    assert!(st.contains("never heard") && !st.contains("{\""), "{st}");
    let c = nodes[0].hop(&["cancel", &flow]);
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    assert!(list(&nodes[0]).is_empty());
    let again = nodes[0].hop(&["cancel", &flow]);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("hop list"));
    nodes[1].restart();
    std::thread::sleep(Duration::from_secs(6));
    let st = nodes[1].status();
    assert_eq!(st["counters"]["files_received"], 0, "{st}");
    assert_eq!(st["incoming"].as_array().map(Vec::len), Some(0), "{st}");
}

/// `hop send --lifetime 3s` to a node that is down fails as expired once the lifetime has
/// passed (not after the node's give-up time), a send without one once the node's
/// `default_lifetime` has, and nothing arrives when the node returns.
#[test]
fn a_send_whose_lifetime_passes_fails_as_expired_and_is_never_delivered() {
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("old-news.txt");
    std::fs::write(&file, pattern(9, 5_000)).unwrap();
    // The node's default lifetime is 2 s; the first send asks for 3 s.
    let mut nodes = loopback_chain(2, work.path(), "default_lifetime = \"2s\"");
    nodes[1].terminate();
    let path = file.to_str().unwrap();
    for (args, lifetime) in [(&["--lifetime", "3s"][..], 3), (&[][..], 2)] {
        let t0 = Instant::now();
        let mut cmd = vec!["send", "--quiet"];
        cmd.extend_from_slice(args);
        cmd.extend_from_slice(&[path, "--to", "2"]);
        let out = nodes[0].hop(&cmd);
        let took = t0.elapsed();
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("lifetime"), "{err}");
        assert!(
            took >= Duration::from_secs(lifetime) && took < Duration::from_secs(lifetime + 7),
            "{args:?}: {took:?}"
        );
    }
    assert!(list(&nodes[0]).is_empty());
    nodes[1].restart();
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(nodes[1].status()["counters"]["files_received"], 0);
}

/// `hop status | head -1`: the pipe closes early and hop ends quietly, without a panic.
#[test]
fn hop_output_into_a_closed_pipe_ends_quietly() {
    let work = tempfile::tempdir().unwrap();
    let nodes = loopback_chain(1, work.path(), "");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hop"))
        .arg("--socket")
        .arg(nodes[0].socket())
        .arg("status")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_ne!(out.status.code(), Some(101));
}

/// A detached transfer is the node's: it survives a restart of the source's hopd (sent again
/// from its first byte), completes when the destination returns, and leaves nothing in
/// `storage/outgoing`; a cancelled one leaves nothing either.
#[test]
fn a_detached_transfer_survives_a_restart_of_its_source() {
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("field-report.pdf");
    let data = pattern(14, 1_500_000);
    std::fs::write(&file, &data).unwrap();
    let other = work.path().join("draft.txt");
    std::fs::write(&other, pattern(15, 2000)).unwrap();
    let mut nodes = loopback_chain(2, work.path(), "");
    nodes[1].terminate();
    for f in [&file, &other] {
        send_detached(&nodes[0], f, 2);
    }
    let outgoing = nodes[0].dir.join("store/outgoing");
    let kept = || std::fs::read_dir(&outgoing).map(|d| d.count()).unwrap_or(0);
    let names = || -> Vec<String> {
        std::fs::read_dir(&outgoing)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        kept(),
        4,
        "a record and a data file per transfer: {:?}",
        names()
    );
    // The draft is cancelled: its files go.
    let draft = list(&nodes[0])
        .into_iter()
        .find(|f| f["name"] == "draft.txt")
        .unwrap();
    let c = nodes[0].hop(&["cancel", draft["flow"].as_str().unwrap()]);
    assert!(c.status.success());
    assert_eq!(kept(), 2);
    nodes[0].terminate();
    nodes[0].restart_serving();
    let flows = list(&nodes[0]);
    assert_eq!(flows.len(), 1, "{flows:?}");
    assert_eq!(flows[0]["name"], "field-report.pdf");
    assert_eq!(flows[0]["attached"], false);
    nodes[1].restart();
    wait_for(
        "the kept transfer delivered",
        Duration::from_secs(60),
        || list(&nodes[0]).is_empty(),
    );
    assert_eq!(kept(), 0);
    let dir = work.path().join("in");
    receive_one_file(&nodes[1], &dir, "field-report.pdf", &data);
    assert_eq!(nodes[1].status()["inbox"], 0);
}

/// A relay whose next hop is down holds the transfer's blocks in custody, and `hop list` there
/// says so; once the destination returns the transfer completes and the relay holds nothing.
#[test]
fn a_relay_lists_what_it_holds_for_other_nodes() {
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("map.tiles");
    let data = pattern(16, 600_000);
    std::fs::write(&file, &data).unwrap();
    let mut nodes = loopback_chain(3, work.path(), "");
    nodes[2].terminate();
    send_detached(&nodes[0], &file, 3);
    let held = |n: &Hopd| String::from_utf8_lossy(&n.hop(&["list"]).stdout).to_string();
    wait_for("the relay holds the block", Duration::from_secs(30), || {
        held(&nodes[1]).contains("held here for other nodes: 1 relayed flow(s), 1 block(s)")
    });
    assert!(held(&nodes[1]).contains("no outgoing transfers"));
    nodes[2].restart();
    wait_for("the transfer delivered", Duration::from_secs(60), || {
        list(&nodes[0]).is_empty()
    });
    receive_one_file(&nodes[2], &work.path().join("in"), "map.tiles", &data);
    wait_for(
        "the relay's custody released",
        Duration::from_secs(30),
        || !held(&nodes[1]).contains("held here"),
    );
}
