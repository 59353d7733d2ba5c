//! Restarting the destination or the source of a transfer (SIGKILL), with real hopd processes
//! on a loopback chain source → relay → destination.

mod common;

use std::time::{Duration, Instant};

use common::*;

fn wait_incoming(node: &Hopd, at_least: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    while incoming_bytes(node) < at_least {
        assert!(
            Instant::now() < deadline,
            "node {} never spooled {at_least} bytes; log:\n{}",
            node.spec.id,
            node.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn destination_killed_twice_resumes_and_delivers_exactly_once() {
    let work = tempfile::tempdir().unwrap();
    let size = 16 * 1024 * 1024;
    let file = work.path().join("big.bin");
    let data = pattern(41, size);
    std::fs::write(&file, &data).unwrap();
    let mut nodes = loopback_chain(3, work.path(), "");
    let mut sender = ChildGuard(Some(spawn_send(&nodes[0], &file, 3)));
    for fraction in [4, 2] {
        // Kill the destination once it has a part of the file (a quarter, then half).
        wait_incoming(
            &nodes[2],
            (size / fraction) as u64,
            Duration::from_secs(120),
        );
        nodes[2].kill9();
        std::thread::sleep(Duration::from_millis(500));
        Hopd::restart_serving(&mut nodes[2]);
        assert!(
            nodes[2].log().contains("resuming incoming flows"),
            "destination did not resume; log:\n{}",
            nodes[2].log()
        );
    }
    let out = sender.wait(Duration::from_secs(300));
    assert!(
        out.status.success(),
        "send failed: {}\ndestination log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        nodes[2].log()
    );
    let dir = work.path().join("out");
    let r = recv(&nodes[2], &dir, 1);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let got = std::fs::read(dir.join("big.bin")).unwrap();
    assert_eq!(got.len(), data.len(), "received file has the wrong length");
    assert!(got == data, "received file differs");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    let st = nodes[2].status();
    assert_eq!(st["counters"]["files_received"], 1, "{st}");
    assert_eq!(st["inbox"], 0, "{st}");
    assert_eq!(st["counters"]["integrity_failures"], 0, "{st}");
    // Nothing left half-spooled.
    let parts = std::fs::read_dir(nodes[2].dir.join("store/incoming"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "part"))
        .count();
    assert_eq!(parts, 0);
}

#[test]
fn source_killed_fails_the_send_clearly_and_a_new_send_completes() {
    let work = tempfile::tempdir().unwrap();
    let size = 16 * 1024 * 1024;
    let file = work.path().join("s.bin");
    let data = pattern(42, size);
    std::fs::write(&file, &data).unwrap();
    let mut nodes = loopback_chain(3, work.path(), "");
    let mut sender = ChildGuard(Some(spawn_send(&nodes[0], &file, 3)));
    wait_incoming(&nodes[2], (size / 4) as u64, Duration::from_secs(120));
    nodes[0].kill9();
    let t0 = Instant::now();
    let out = sender.wait(Duration::from_secs(30));
    let took = t0.elapsed();
    // The application learns at once that its daemon is gone (exit 3), it does not hang.
    assert_eq!(
        out.status.code(),
        Some(3),
        "hop send: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(took < Duration::from_secs(30), "hop send hung for {took:?}");
    Hopd::restart_serving(&mut nodes[0]);
    // The transfer is sent again as a new flow; the abandoned one is never delivered.
    let out = send(&nodes[0], &[&file], 3);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = work.path().join("out");
    let r = recv(&nodes[2], &dir, 1);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(std::fs::read(dir.join("s.bin")).unwrap() == data);
    let st = nodes[2].status();
    assert_eq!(st["counters"]["files_received"], 1, "{st}");
    assert_eq!(st["inbox"], 0, "{st}");
}

/// A detached transfer whose source is killed mid-transfer resumes, after the restart, at the
/// byte the destination had acknowledged (not from the first), the destination joins the two
/// flows into one file delivered once, and the earlier flow is aborted along the path: no
/// spool file or custody of it is left anywhere.
#[test]
fn a_detached_transfer_resumes_where_it_stopped_after_its_source_is_killed() {
    let work = tempfile::tempdir().unwrap();
    let size = 16 * 1024 * 1024;
    let file = work.path().join("survey.tar");
    let data = pattern(43, size);
    std::fs::write(&file, &data).unwrap();
    let mut nodes = loopback_chain(3, work.path(), "");
    send_detached(&nodes[0], &file, 3);
    wait_incoming(&nodes[2], (size / 4) as u64, Duration::from_secs(120));
    nodes[0].kill9();
    let before = incoming_bytes(&nodes[2]);
    assert!(before < size as u64, "the transfer ended before the kill");
    Hopd::restart_serving(&mut nodes[0]);
    let dir = work.path().join("in");
    receive_one_file(&nodes[2], &dir, "survey.tar", &data);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    let log = nodes[0].log();
    let line = log
        .lines()
        .find(|l| l.contains("resuming a kept (detached) transfer"))
        .unwrap_or_else(|| panic!("no resume in the source's log:\n{log}"));
    let at: u64 = line
        .split(" at=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no resume point in {line}"));
    assert!(at > 0, "resumed from the first byte: {line}");
    // The restarted source sent the bytes from the resume point on, not the whole file.
    let st = nodes[0].status();
    let data_packets = st["node"]["transports"][0][1]["sent_by_type"]["data"]
        .as_u64()
        .unwrap_or_else(|| panic!("no data packets sent after the restart: {st}"));
    let payload = st["packet_payload_bytes"].as_u64().unwrap();
    let left = size as u64 - at;
    assert!(
        data_packets * payload < left + (left / 10),
        "{data_packets} data packets of {payload} bytes sent after the restart for {left} bytes left"
    );
    let st = nodes[2].status();
    assert_eq!(st["counters"]["files_received"], 1, "{st}");
    assert_eq!(st["counters"]["integrity_failures"], 0, "{st}");
    // The earlier flow is aborted along the path: nothing of it is left.
    let incoming = nodes[2].dir.join("store/incoming");
    let left = || -> Vec<String> {
        std::fs::read_dir(&incoming)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| {
                [".part", ".joined", ".resumers"]
                    .iter()
                    .any(|x| n.ends_with(x))
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !left().is_empty() || nodes[1].status()["custody"]["blocks"] != 0 {
        assert!(
            Instant::now() < deadline,
            "left behind: spool files {:?}, relay custody {}",
            left(),
            nodes[1].status()["custody"]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The source forgets the kept transfer once the end-to-end FIN reaches it, which may
    // come a moment after the destination has the file.
    let kept = || {
        std::fs::read_dir(nodes[0].dir.join("store/outgoing"))
            .unwrap()
            .count()
    };
    while kept() != 0 {
        assert!(
            Instant::now() < deadline,
            "the source still keeps the transfer"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
