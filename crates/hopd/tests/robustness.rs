//! Crash recovery, hostile datagrams and the Prometheus endpoint, with real hopd processes.

mod common;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::*;
use hop_wire::{EnvelopeRepr, TransportId};
use hopd::auth::{Authenticator, Stream};

#[test]
fn relay_killed_and_restarted_mid_transfer() {
    let work = tempfile::tempdir().unwrap();
    let size = 24 * 1024 * 1024;
    let file = work.path().join("big.bin");
    let data = pattern(99, size);
    std::fs::write(&file, &data).unwrap();
    let mut nodes = loopback_chain(3, work.path(), "");
    let mut sender = ChildGuard(Some(spawn_send(&nodes[0], &file, 3)));
    // Wait until the relay holds blocks in custody and the destination has started receiving.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = nodes[1].status();
        let custody = st["custody"]["stored_total"].as_u64().unwrap_or(0);
        if custody >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "relay never took custody");
        std::thread::sleep(Duration::from_millis(20));
    }
    nodes[1].kill9();
    std::thread::sleep(Duration::from_millis(500));
    nodes[1].restart();
    let out = sender.wait(Duration::from_secs(300));
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
        std::fs::read(dir.join("big.bin")).unwrap() == data,
        "file differs"
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    assert_eq!(
        nodes[2].counter("files_received"),
        1,
        "delivered exactly once"
    );
    assert!(
        nodes[1].log().contains("restoring blocks in custody")
            || nodes[1].log().matches("hopd running").count() == 2
    );
}

/// A relay acknowledges a block at once and writes it to disk once it has held it for
/// `custody_write_delay` (1 s by default): with the destination down, the relay's block is on
/// disk after the delay, and after the relay and the source are killed (the source never
/// comes back) the restarted relay delivers it from disk to the returning destination.
#[test]
fn a_block_held_past_the_write_delay_survives_a_relay_killed() {
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("survey.bin");
    let data = pattern(17, 600_000);
    std::fs::write(&file, &data).unwrap();
    let mut nodes = loopback_chain(3, work.path(), "");
    nodes[2].terminate();
    send_detached(&nodes[0], &file, 3);
    let custody_dir = nodes[1].dir.join("store").join("custody");
    let on_disk = || {
        std::fs::read_dir(&custody_dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".blk"))
                    .count()
            })
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while on_disk() == 0 {
        assert!(
            Instant::now() < deadline,
            "the relay never wrote the block it holds"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    nodes[0].kill9();
    nodes[1].kill9();
    nodes[1].restart_serving();
    assert!(
        nodes[1].log().contains("restoring blocks in custody"),
        "{}",
        nodes[1].log()
    );
    nodes[2].restart();
    receive_one_file(&nodes[2], &work.path().join("in"), "survey.bin", &data);
}

fn sealed(auth: &mut Authenticator, src: u32, dst: u32, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    EnvelopeRepr {
        transport: TransportId::Hop,
        flags: 0,
        link_src: src,
        link_dst: dst,
    }
    .emit(body, &mut v)
    .unwrap();
    auth.seal(&mut v, Stream::Data).unwrap();
    v
}

#[test]
fn hostile_datagrams_are_rejected_and_counted() {
    let work = tempfile::tempdir().unwrap();
    let size = 8 * 1024 * 1024;
    let file = work.path().join("f.bin");
    let data = pattern(5, size);
    std::fs::write(&file, &data).unwrap();
    let nodes = loopback_chain(2, work.path(), "");
    let target = nodes[1].spec.listen;
    let mut sender = ChildGuard(Some(spawn_send(&nodes[0], &file, 2)));
    let sock = UdpSocket::bind("127.0.0.9:0").unwrap();
    let key = hopd::config::parse_hex_key(KEY).unwrap();
    let wrong = [0x42u8; 32];
    let mut insider = Authenticator::new(&key, 77, 1000, 16);
    let mut outsider = Authenticator::new(&wrong, 1, u64::MAX / 2, 16);
    let mut rng = pattern(17, 200_000).into_iter();
    for i in 0..400u32 {
        // Random bytes.
        let n = 1 + (i as usize * 37) % 1400;
        let junk: Vec<u8> = (&mut rng).take(n).collect();
        sock.send_to(&junk, target).unwrap();
        // Forged: right format, wrong key, claiming to be node 1 with a huge counter.
        let forged = sealed(&mut outsider, 1, 2, b"forged body");
        sock.send_to(&forged, target).unwrap();
        // Truncated: a correctly sealed datagram cut short.
        let good = sealed(&mut insider, 77, 2, &[0u8; 64]);
        sock.send_to(&good[..good.len() - 5], target).unwrap();
        // Replayed: the same sealed datagram twice (the first is authentic).
        let once = sealed(&mut insider, 77, 2, &[1u8; 32]);
        sock.send_to(&once, target).unwrap();
        sock.send_to(&once, target).unwrap();
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let out = sender.wait(Duration::from_secs(300));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = work.path().join("out");
    let r = recv(&nodes[1], &dir, 1);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(
        std::fs::read(dir.join("f.bin")).unwrap() == data,
        "file differs"
    );
    let m = metrics(nodes[1].metrics);
    assert!(metric(&m, "hopd_auth_failures_total") >= 400, "{m}");
    assert!(metric(&m, "hopd_auth_replays_total") >= 400, "{m}");
    assert!(metric(&m, "hopd_auth_malformed_total") >= 400, "{m}");
    assert_eq!(metric(&m, "hopd_files_received_total"), 1);
    assert!(
        m.contains("hopd_transport_sent_total{transport=\"hop\",type=\"back\"}"),
        "{m}"
    );
    // Per-neighbour series, units in names, and the health endpoint.
    assert!(
        metric(
            &m,
            "hopd_neighbour_received_datagrams_total{neighbour=\"1\"}"
        ) > 0,
        "{m}"
    );
    assert!(
        m.contains("hopd_neighbour_last_heard_age_seconds{neighbour=\"1\"}"),
        "{m}"
    );
    assert!(
        m.contains("# UNIT hopd_spool_deliver_seconds seconds"),
        "{m}"
    );
    assert!(!m.contains("microseconds") && m.ends_with("# EOF\n"), "{m}");
    let get = |path: &str| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(nodes[1].metrics).unwrap();
        write!(s, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    assert!(get("/healthz").starts_with("HTTP/1.0 200"));
    assert!(get("/nothing").starts_with("HTTP/1.0 404"));
}

#[test]
fn sigterm_stops_gracefully() {
    let work = tempfile::tempdir().unwrap();
    let mut nodes = loopback_chain(2, work.path(), "");
    let sock = nodes[0].socket();
    let st = nodes[0].terminate().unwrap();
    assert!(st.success(), "{st}");
    assert!(!sock.exists(), "API socket removed on shutdown");
    assert!(nodes[0].log().contains("SIGTERM"));
}

/// A second hopd given the listen address of a running one refuses to start, says why and
/// leaves no API socket behind; the running node keeps its traffic.
#[test]
fn a_second_hopd_on_a_taken_address_refuses_to_start() {
    let work = tempfile::tempdir().unwrap();
    let nodes = loopback_chain(2, work.path(), "");
    let twin_dir = work.path().join("twin");
    std::fs::create_dir_all(&twin_dir).unwrap();
    let mut spec = nodes[0].spec.clone();
    spec.id = 9;
    let metrics = format!("127.0.0.1:{}", free_tcp_port()).parse().unwrap();
    Hopd::write_config(&spec, &twin_dir, metrics);
    let mut twin = std::process::Command::new(HOPD)
        .arg("--config")
        .arg(twin_dir.join("hopd.toml"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = twin.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = twin.kill();
            panic!("a second hopd on {} kept running", spec.listen);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut twin.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(
        err.contains(&format!("binding {}", spec.listen)) && err.contains("in use"),
        "{err}"
    );
    assert!(!twin_dir.join("hopd.sock").exists(), "stale API socket");

    let file = work.path().join("after.bin");
    let data = pattern(11, 300 * 1024);
    std::fs::write(&file, &data).unwrap();
    let s = send(&nodes[0], &[file.as_path()], 2);
    assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stderr));
    let out = work.path().join("out");
    let r = recv(&nodes[1], &out, 1);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(std::fs::read(out.join("after.bin")).unwrap() == data);
}

/// hopd started again with a running node's own configuration refuses before it opens
/// anything of the node's (its storage, its port), naming the API socket in use.
#[test]
fn a_second_hopd_with_a_running_nodes_config_refuses_before_touching_its_storage() {
    let work = tempfile::tempdir().unwrap();
    let nodes = loopback_chain(2, work.path(), "");
    let o = std::process::Command::new(HOPD)
        .arg("--config")
        .arg(nodes[0].config_path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("in use by a running hopd"), "{err}");
    // The running node still answers on its socket.
    assert!(nodes[0].status()["node_id"].as_u64() == Some(1));
}

/// Under systemd (`Type=notify`, `WatchdogSec`): hopd says READY=1 once its API socket
/// exists, pings the watchdog from its event loop at half the interval, and says
/// STOPPING=1 on SIGTERM. The test plays systemd's notification socket.
#[test]
fn systemd_hears_ready_watchdog_pings_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let work = tempfile::tempdir().unwrap();
    let notify = work.path().join("notify.sock");
    let sd = UnixDatagram::bind(&notify).unwrap();
    sd.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let port = free_port();
    let addr = |i: u32| -> std::net::SocketAddr { format!("127.0.0.{i}:{port}").parse().unwrap() };
    let spec = chain_spec(1, 1, addr(1), &|j| addr(j), None, "");
    let dir = work.path().join("n1");
    std::fs::create_dir_all(&dir).unwrap();
    Hopd::write_config(
        &spec,
        &dir,
        format!("127.0.0.1:{}", free_tcp_port()).parse().unwrap(),
    );
    // systemd names the main process in WATCHDOG_PID: the shell's pid is hopd's after exec.
    let log = std::fs::File::create(work.path().join("hopd.log")).unwrap();
    let child = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg("WATCHDOG_PID=$$ exec \"$0\" --config \"$1\"")
        .arg(HOPD)
        .arg(dir.join("hopd.toml"))
        .env("NOTIFY_SOCKET", &notify)
        .env("WATCHDOG_USEC", "400000")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut child = ChildGuard(Some(child));
    let mut buf = [0u8; 256];
    let mut next = || {
        let n = sd.recv(&mut buf).unwrap_or_else(|e| {
            panic!(
                "no notification ({e}); hopd log:\n{}",
                std::fs::read_to_string(work.path().join("hopd.log")).unwrap_or_default()
            )
        });
        String::from_utf8_lossy(&buf[..n]).to_string()
    };
    let first = next();
    assert!(first.contains("READY=1"), "{first}");
    assert!(
        dir.join("hopd.sock").exists(),
        "READY before the API socket"
    );
    let t0 = Instant::now();
    let mut pings = 0;
    while pings < 3 {
        if next().contains("WATCHDOG=1") {
            pings += 1;
        }
    }
    // Three pings at half of 400 ms: 0.6 s, not much more.
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // SAFETY: a signal to our own child process.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let mut stopping = false;
    for _ in 0..10 {
        if next().contains("STOPPING=1") {
            stopping = true;
            break;
        }
    }
    assert!(stopping);
    assert!(child.wait(Duration::from_secs(10)).status.success());
}
