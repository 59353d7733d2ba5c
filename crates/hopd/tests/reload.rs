//! Re-reading the configuration while hopd runs (SIGHUP, `hop reload`).

mod common;

use std::time::Duration;

use common::*;

/// Node 1 starts with a wrong address for its neighbour, so a send to it waits. The file
/// is corrected and hopd gets SIGHUP: it stays up (the signal used to end it), uses the new
/// address, and the waiting transfer completes. `hop reload` then names what it applied and
/// what waits for a restart.
#[test]
fn sighup_applies_a_corrected_neighbour_address_without_dropping_the_transfer() {
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("f.bin");
    let data = pattern(11, 200_000);
    std::fs::write(&file, &data).unwrap();
    let mut nodes = loopback_chain(2, work.path(), "");
    let good = nodes[0].spec.neighbours[0].1;
    let mut wrong = good;
    wrong.set_port(free_port());
    nodes[0].kill9();
    nodes[0].spec.neighbours[0].1 = wrong;
    Hopd::write_config(&nodes[0].spec, &nodes[0].dir, nodes[0].metrics);
    nodes[0].restart_serving();
    let mut sender = ChildGuard(Some(spawn_send(&nodes[0], &file, 2)));
    std::thread::sleep(Duration::from_secs(2));
    if !sender.running() {
        let out = sender.wait(Duration::from_secs(1));
        panic!(
            "the send ended although its neighbour's address was wrong: {:?} {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            nodes[0].log()
        );
    }
    nodes[0].spec.neighbours[0].1 = good;
    Hopd::write_config(&nodes[0].spec, &nodes[0].dir, nodes[0].metrics);
    let pid = nodes[0].child.as_ref().unwrap().id() as i32;
    // SAFETY: a signal to our own child process.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    let out = sender.wait(Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        nodes[0]
            .child
            .as_mut()
            .unwrap()
            .try_wait()
            .unwrap()
            .is_none(),
        "hopd ended on SIGHUP"
    );
    let dir = work.path().join("out");
    receive_one_file(&nodes[1], &dir, "f.bin", &data);
    assert!(
        nodes[0].log().contains("configuration re-read"),
        "{}",
        nodes[0].log()
    );
    // A setting that needs a restart is named, and the running one stays.
    let text = std::fs::read_to_string(nodes[0].config_path()).unwrap();
    let old = format!("metrics_listen = \"{}\"", nodes[0].metrics);
    assert!(text.contains(&old));
    let text = text.replace(&old, "metrics_listen = \"127.0.0.1:1\"");
    std::fs::write(nodes[0].config_path(), text).unwrap();
    let o = nodes[0].hop(&["--json", "reload"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["applied"], serde_json::json!([]), "{v}");
    assert_eq!(
        v["need_restart"],
        serde_json::json!(["metrics_listen"]),
        "{v}"
    );
    // Encryption switches while the node runs: receivers take both forms.
    let text = std::fs::read_to_string(nodes[0].config_path()).unwrap();
    std::fs::write(nodes[0].config_path(), text.clone() + "encrypt = false\n").unwrap();
    let o = nodes[0].hop(&["--json", "reload"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["applied"], serde_json::json!(["security.encrypt"]), "{v}");
    let f = work.path().join("clear.bin");
    std::fs::write(&f, pattern(9, 50_000)).unwrap();
    let o = send(&nodes[0], &[f.as_path()], 2);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    receive_one_file(
        &nodes[1],
        &work.path().join("out2"),
        "clear.bin",
        &pattern(9, 50_000),
    );
    // So does the cipher a node seals with (and encryption comes back on with this file).
    std::fs::write(
        nodes[0].config_path(),
        text.clone() + "cipher = \"aes-256-gcm\"\n",
    )
    .unwrap();
    let o = nodes[0].hop(&["--json", "reload"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["applied"],
        serde_json::json!(["security.encrypt", "security.cipher"]),
        "{v}"
    );
    let f = work.path().join("aes.bin");
    std::fs::write(&f, pattern(10, 50_000)).unwrap();
    let o = send(&nodes[0], &[f.as_path()], 2);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    receive_one_file(
        &nodes[1],
        &work.path().join("out3"),
        "aes.bin",
        &pattern(10, 50_000),
    );
    std::fs::write(nodes[0].config_path(), text).unwrap();
    // A broken file changes nothing and says why.
    std::fs::write(nodes[0].config_path(), "node_id = \"one\"\n").unwrap();
    let o = nodes[0].hop(&["reload"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("hopd.toml:1:"));
    assert_eq!(nodes[0].status()["node_id"], 1);
}

/// A new mesh key, node by node without a restart: node 2 gets it first and takes node 1's
/// datagrams under the old key (counted), node 1 drops node 2's until it has the new key too,
/// and a transfer started in between completes once both have it.
#[test]
fn a_new_mesh_key_is_taken_node_by_node_without_dropping_a_transfer() {
    let work = tempfile::tempdir().unwrap();
    let nodes = loopback_chain(2, work.path(), "");
    let new_key = "ff".repeat(32);
    let rekey = |node: &Hopd| {
        let p = node.config_path();
        let text = std::fs::read_to_string(&p).unwrap().replace(KEY, &new_key);
        std::fs::write(&p, text).unwrap();
        let out = node.hop(&["reload"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            said.contains("applied: ") && said.contains("security.mesh_key"),
            "{said}"
        );
    };
    rekey(&nodes[1]);
    let file = work.path().join("f.bin");
    let data = pattern(17, 3_000_000);
    std::fs::write(&file, &data).unwrap();
    let mut sender = ChildGuard(Some(spawn_send(&nodes[0], &file, 2)));
    std::thread::sleep(Duration::from_secs(2));
    assert!(sender.running(), "node 1 cannot read node 2's answers yet");
    assert!(
        nodes[1].counter("auth_previous_key") > 0,
        "node 2 took the old key"
    );
    assert!(
        nodes[0].counter("auth_failures") > 0,
        "node 1 dropped the new key's"
    );
    rekey(&nodes[0]);
    let out = sender.wait(Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    receive_one_file(&nodes[1], &work.path().join("out"), "f.bin", &data);
}
