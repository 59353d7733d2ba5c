//! A destination whose disk budget (`[storage] max_disk_bytes`) is full withholds its
//! end-to-end acknowledgements and the flow's next blocks (backpressure) instead of dropping
//! data; once the receiving application drains the inbox the transfer completes.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const MIB: usize = 1024 * 1024;

/// Start a node of a loopback chain, with `[storage] max_disk_bytes = limit` if given.
fn start_limited(spec: NodeSpec, dir: std::path::PathBuf, limit: Option<usize>) -> Hopd {
    let storage = limit.map_or(String::new(), |l| format!("max_disk_bytes = {l}\n"));
    start_with_storage(spec, dir, &storage)
}

/// Start a node of a loopback chain with `storage` added to its `[storage]` table.
fn start_with_storage(spec: NodeSpec, dir: std::path::PathBuf, storage: &str) -> Hopd {
    std::fs::create_dir_all(&dir).unwrap();
    let metrics: SocketAddr = format!("{}:{}", spec.listen.ip(), free_tcp_port())
        .parse()
        .unwrap();
    Hopd::write_config(&spec, &dir, metrics);
    if !storage.is_empty() {
        let path = dir.join("hopd.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("[storage]\n"));
        let text = text.replace("[storage]\n", &format!("[storage]\n{storage}"));
        std::fs::write(&path, text).unwrap();
    }
    let mut h = Hopd {
        spec,
        dir,
        child: None,
        metrics,
    };
    h.restart();
    h
}

/// A small tmpfs mounted on a directory; unmounted on drop (also when the test fails).
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, bytes: usize) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// How the destination runs out of room.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Room {
    /// `max_disk_bytes` of this many bytes.
    Budget(usize),
    /// A file system of this many bytes (writes fail with ENOSPC); default budget. The
    /// destination writes on its spool thread (the default), or, with `false`, on its
    /// event loop.
    FileSystem(usize, bool),
}

/// Source 1 → relay 2 → destination 3, where only the destination is short of room: a first
/// file fits and waits in the inbox; a second must stall without loss, and completes once the
/// application drains the inbox.
fn stall_and_drain(room: Room) {
    let work = tempfile::tempdir().unwrap();
    let (a, b) = (pattern(7, 3 * MIB), pattern(8, 3 * MIB));
    let (fa, fb) = (work.path().join("a.bin"), work.path().join("b.bin"));
    std::fs::write(&fa, &a).unwrap();
    std::fs::write(&fb, &b).unwrap();
    let _tmpfs = match room {
        Room::FileSystem(bytes, _) => Some(Tmpfs::mount(&work.path().join("n3/store"), bytes)),
        Room::Budget(_) => None,
    };
    let port = free_port();
    let addr = |i: u32| -> SocketAddr { format!("127.0.0.{i}:{port}").parse().unwrap() };
    let nodes: Vec<Hopd> = (1..=3)
        .map(|i| {
            let spec = chain_spec(3, i, addr(i), &addr, None, "");
            let dir = work.path().join(format!("n{i}"));
            match (i, room) {
                (3, Room::Budget(limit)) => start_limited(spec, dir, Some(limit)),
                (3, Room::FileSystem(_, false)) => {
                    start_with_storage(spec, dir, "spool_thread = false\n")
                }
                _ => start_limited(spec, dir, None),
            }
        })
        .collect();
    let dst = &nodes[2];
    let out = send(&nodes[0], &[&fa], 3);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut sender = ChildGuard(Some(spawn_send(&nodes[0], &fb, 3)));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = dst.status();
        if st["spool"]["full"] == true {
            break;
        }
        assert!(
            sender.running(),
            "second file completed although it does not fit: {st}"
        );
        assert!(Instant::now() < deadline, "spool never reported full: {st}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Stalled: it stays incomplete while the inbox is full.
    std::thread::sleep(Duration::from_secs(3));
    assert!(sender.running(), "send completed while the spool was full");
    let st = dst.status();
    assert_eq!(st["spool"]["full"], true, "{st}");
    assert!(st["spool"]["full_total"].as_u64().unwrap() >= 1, "{st}");
    if let Room::Budget(limit) = room {
        let used = st["spool"]["disk_bytes"].as_u64().unwrap();
        assert!(used <= limit as u64, "budget exceeded: {st}");
    }
    assert_eq!(st["counters"]["files_received"], 1, "{st}");
    assert_eq!(st["inbox"], 1, "{st}");
    let m = metrics(dst.metrics);
    assert!(metric(&m, "hopd_spool_full_total") >= 1, "{m}");
    let expect_log = match room {
        Room::Budget(_) => "spool full",
        Room::FileSystem(..) => "spool write failed",
    };
    assert!(dst.log().contains(expect_log), "{}", dst.log());
    // The application drains the inbox; the stalled transfer then completes intact.
    let dir = work.path().join("out");
    let r = recv(dst, &dir, 1);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(std::fs::read(dir.join("a.bin")).unwrap() == a);
    let out = sender.wait(Duration::from_secs(120));
    assert!(
        out.status.success(),
        "stalled send did not complete: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        dst.log()
    );
    // The sender heard why it waited, and that it moved again.
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("destination 3's storage is full") && said.contains("moving again"),
        "hop send did not say why it waited: {said}"
    );
    assert!(
        nodes[0].log().contains("the destination's storage is full"),
        "{}",
        nodes[0].log()
    );
    let r = recv(dst, &dir, 1);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(
        std::fs::read(dir.join("b.bin")).unwrap() == b,
        "file differs"
    );
    let st = dst.status();
    assert_eq!(st["spool"]["full"], false, "{st}");
    assert_eq!(st["counters"]["files_received"], 2, "{st}");
    assert_eq!(st["counters"]["integrity_failures"], 0, "{st}");
    // The spool thread retried the failed writes; otherwise the loop retried refused
    // deliveries.
    let resumed = match room {
        Room::FileSystem(_, true) => "spool writes succeed again",
        _ => "spool has room again",
    };
    assert!(dst.log().contains(resumed), "{}", dst.log());
}

#[test]
fn full_disk_budget_stalls_without_loss_and_resumes_when_drained() {
    stall_and_drain(Room::Budget(5 * MIB));
}

/// The same with a file system that runs out (ENOSPC) before the budget does, the
/// destination writing on its spool thread and then on its event loop. Needs root
/// (mount); not skipped as root.
#[test]
fn full_file_system_stalls_without_loss_and_resumes_when_drained() {
    if !is_root() {
        eprintln!("skipped: needs root to mount a tmpfs");
        return;
    }
    stall_and_drain(Room::FileSystem(5 * MIB, true));
    stall_and_drain(Room::FileSystem(5 * MIB, false));
}

/// A file whose sender goes away mid-transfer must not keep its share of the destination's
/// disk budget: the destination deletes what it spooled, and a file that needs the whole
/// budget still goes through.
#[test]
fn an_abandoned_transfer_gives_its_room_back() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    let work = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = |i: u32| -> SocketAddr { format!("127.0.0.{i}:{port}").parse().unwrap() };
    let nodes: Vec<Hopd> = (1..=2)
        .map(|i| {
            let spec = chain_spec(2, i, addr(i), &addr, None, "");
            let limit = (i == 2).then_some(4 * MIB);
            start_limited(spec, work.path().join(format!("n{i}")), limit)
        })
        .collect();
    let (src, dst) = (&nodes[0], &nodes[1]);
    // A client announces 16 MiB, sends 2.5 MiB (two whole blocks reach the destination) and
    // goes away.
    let frame = |s: &mut UnixStream, b: &[u8]| {
        s.write_all(&(b.len() as u32).to_be_bytes()).unwrap();
        s.write_all(b).unwrap();
    };
    let mut s = UnixStream::connect(src.socket()).unwrap();
    frame(
        &mut s,
        br#"{"op":"send","v":1,"to":2,"name":"big.bin","size":16777216}"#,
    );
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut reply = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut reply).unwrap();
    assert!(String::from_utf8_lossy(&reply).contains("accepted"));
    let data = pattern(9, 5 * MIB / 2);
    for chunk in data.chunks(256 * 1024) {
        frame(&mut s, chunk);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while incoming_bytes(dst) < 2 * MIB as u64 {
        assert!(Instant::now() < deadline, "{}", dst.status());
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = dst.status();
        if st["incoming"].as_array().is_some_and(|a| a.is_empty())
            && st["spool"]["disk_bytes"].as_u64() == Some(0)
        {
            break;
        }
        assert!(Instant::now() < deadline, "flow not abandoned: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(dst.counter("flows_abandoned"), 1);
    let leftovers: Vec<_> = std::fs::read_dir(dst.dir.join("store/incoming"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // Three quarters of the budget: fits only if the abandoned bytes were given back.
    let f = work.path().join("c.bin");
    let c = pattern(10, 3 * MIB);
    std::fs::write(&f, &c).unwrap();
    let mut sender = ChildGuard(Some(spawn_send(src, &f, 2)));
    let out = sender.wait(Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        dst.status()
    );
    let dir = work.path().join("out");
    let r = recv(dst, &dir, 1);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(std::fs::read(dir.join("c.bin")).unwrap() == c);
}
