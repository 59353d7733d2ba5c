//! A link that reports itself full (`link_status_socket`): with `link_control_when_full` the
//! receiver's acknowledgements still go out, without it they wait for room.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use hopd::linkstatus::Report;

/// Plays the receiver's link: reports `backlog` frames every 100 ms until dropped (well
/// within hopd's 1 s staleness bound, so hopd never assumes the link drained).
struct FakeLink {
    backlog: Arc<AtomicU32>,
    stop: Arc<AtomicU32>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeLink {
    fn start(path: PathBuf, backlog: u32) -> FakeLink {
        let level = Arc::new(AtomicU32::new(backlog));
        let stop = Arc::new(AtomicU32::new(0));
        let (l, s) = (level.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let tx = UnixDatagram::unbound().unwrap();
            let mut taken = 0u64;
            while s.load(Ordering::Relaxed) == 0 {
                taken += 1;
                let r = Report {
                    backlog: l.load(Ordering::Relaxed),
                    taken,
                };
                // The socket appears once hopd has bound it.
                let _ = tx.send_to(&r.encode(), &path);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        FakeLink {
            backlog: level,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeLink {
    fn drop(&mut self) {
        self.stop.store(1, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Nodes 1 -> 2 on loopback; node 2's link reports 4 frames queued (hopd's default limit)
/// from the start. Returns the nodes, the link and the file to send.
fn full_receiver(root: &Path, control_when_full: bool) -> (Vec<Hopd>, FakeLink, PathBuf) {
    let port = free_port();
    let addr = |i: u32| -> std::net::SocketAddr { format!("127.0.0.{i}:{port}").parse().unwrap() };
    let sock = root.join("link2.sock");
    let link = FakeLink::start(sock.clone(), 4);
    let nodes: Vec<Hopd> = (1..=2)
        .map(|i| {
            let extra = if i == 2 {
                format!(
                    "link_status_socket = \"{}\"\nlink_control_when_full = {control_when_full}\n",
                    sock.display()
                )
            } else {
                String::new()
            };
            Hopd::start(
                chain_spec(2, i, addr(i), &addr, None, &extra),
                root.join(format!("n{i}")),
            )
        })
        .collect();
    let file = root.join("file.bin");
    std::fs::write(&file, pattern(7, 300_000)).unwrap();
    (nodes, link, file)
}

fn received_ok(nodes: &[Hopd], file: &Path, out: &Path) {
    let r = recv(&nodes[1], out, 1);
    assert!(
        r.status.success(),
        "hop recv failed: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let got = std::fs::read(out.join("file.bin")).unwrap();
    assert!(got == std::fs::read(file).unwrap(), "file differs");
}

#[test]
fn acks_leave_a_full_link_with_control_when_full() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, link, file) = full_receiver(dir.path(), true);
    let mut s = ChildGuard(Some(spawn_send(&nodes[0], &file, 2)));
    let out = s.wait(Duration::from_secs(60));
    assert!(
        out.status.success(),
        "send did not complete while the receiver's link was full: {}\nreceiver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        nodes[1].log()
    );
    received_ok(&nodes, &file, &dir.path().join("out"));
    // The link never had room: everything node 2 sent went out as control.
    let st = nodes[1].status();
    assert!(st["link_status"]["full"].as_u64().unwrap_or(0) >= 1, "{st}");
    assert_eq!(st["link_status"]["stale"].as_u64(), Some(0), "{st}");
    drop(link);
}

#[test]
fn acks_wait_for_room_without_control_when_full() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, link, file) = full_receiver(dir.path(), false);
    let mut s = ChildGuard(Some(spawn_send(&nodes[0], &file, 2)));
    // Node 2 may not send while its link is full, so node 1 hears no BACK.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        s.running(),
        "the transfer finished with the receiver's link full"
    );
    let st = nodes[1].status();
    assert_eq!(st["link_status"]["stale"].as_u64(), Some(0), "{st}");
    // Room again: the acks go out and the transfer completes.
    link.backlog.store(0, Ordering::Relaxed);
    let out = s.wait(Duration::from_secs(60));
    assert!(
        out.status.success(),
        "send did not complete once the link had room: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    received_ok(&nodes, &file, &dir.path().join("out"));
    drop(link);
}
