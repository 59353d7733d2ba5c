//! Several applications waiting for files at one node, each taking one (`hop recv --count 1`):
//! every file reaches one of them, including the files that arrive after a client has
//! taken its file and left.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn spawn_recv(node: &Hopd, dir: &Path) -> ChildGuard {
    ChildGuard(Some(
        Command::new(HOP)
            .arg("--socket")
            .arg(node.socket())
            .args(["recv", "--count", "1", "--dir"])
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ))
}

/// Names of the files in the clients' directories.
fn received(dirs: &[std::path::PathBuf]) -> Vec<String> {
    let mut names: Vec<String> = dirs
        .iter()
        .flat_map(|d| std::fs::read_dir(d).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn assert_ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "hop recv: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Each of the three files reached exactly one client and was handed over once.
fn assert_all_three(dst: &Hopd, dirs: &[std::path::PathBuf]) {
    assert_eq!(received(dirs), ["file0.bin", "file1.bin", "file2.bin"]);
    assert_eq!(dst.counter("files_handed_over"), 3);
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn files_after_a_client_left_reach_the_clients_still_waiting() {
    let work = tempfile::tempdir().unwrap();
    let nodes = loopback_chain(2, work.path(), "");
    let (src, dst) = (&nodes[0], &nodes[1]);
    let dirs: Vec<_> = (0..3)
        .map(|i| work.path().join(format!("client{i}")))
        .collect();
    let mut clients = Vec::new();
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap();
        clients.push(spawn_recv(dst, d));
        // Subscribed in this order: the newest client is offered files first.
        std::thread::sleep(Duration::from_millis(200));
    }
    for i in 0..3 {
        let f = work.path().join(format!("file{i}.bin"));
        std::fs::write(&f, pattern(i, 3000 + i as usize)).unwrap();
        let s = send(src, &[&f], dst.spec.id);
        assert!(
            s.status.success(),
            "hop send: {}",
            String::from_utf8_lossy(&s.stderr)
        );
        // One more client has its file and has gone before the next file arrives.
        wait_for("a client to take the file", Duration::from_secs(20), || {
            clients
                .iter_mut()
                .filter_map(|c| (!c.running()).then_some(()))
                .count()
                > i as usize
        });
    }
    for c in &mut clients {
        assert_ok(&c.wait(Duration::from_secs(5)));
    }
    assert_all_three(dst, &dirs);
}

#[test]
fn a_client_that_takes_one_of_several_waiting_files_leaves_the_rest_to_the_next() {
    let work = tempfile::tempdir().unwrap();
    let nodes = loopback_chain(2, work.path(), "");
    let (src, dst) = (&nodes[0], &nodes[1]);
    let files: Vec<_> = (0..3)
        .map(|i| {
            let f = work.path().join(format!("file{i}.bin"));
            std::fs::write(&f, pattern(10 + i, 2000 + i as usize)).unwrap();
            f
        })
        .collect();
    let refs: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let s = send(src, &refs, dst.spec.id);
    assert!(
        s.status.success(),
        "hop send: {}",
        String::from_utf8_lossy(&s.stderr)
    );
    wait_for("the files in the inbox", Duration::from_secs(20), || {
        dst.counter("files_received") == 3
    });
    let dirs: Vec<_> = (0..3)
        .map(|i| work.path().join(format!("client{i}")))
        .collect();
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap();
        // Each client is offered every file nobody holds, takes one and leaves.
        assert_ok(&spawn_recv(dst, d).wait(Duration::from_secs(20)));
    }
    assert_all_three(dst, &dirs);
}

#[test]
fn an_inbox_file_deleted_behind_the_daemons_back_is_dropped_not_offered_for_ever() {
    let work = tempfile::tempdir().unwrap();
    let nodes = loopback_chain(2, work.path(), "");
    let (src, dst) = (&nodes[0], &nodes[1]);
    let send_one = |i: u64| {
        let f = work.path().join(format!("file{i}.bin"));
        std::fs::write(&f, pattern(20 + i, 3000)).unwrap();
        let s = send(src, &[&f], dst.spec.id);
        assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stderr));
    };
    send_one(0);
    wait_for("the file in the inbox", Duration::from_secs(20), || {
        dst.counter("files_received") == 1
    });
    let inbox = dst.dir.join("store/inbox");
    for e in std::fs::read_dir(&inbox).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    let dir = work.path().join("client");
    std::fs::create_dir_all(&dir).unwrap();
    let mut client = spawn_recv(dst, &dir);
    wait_for(
        "the vanished file to leave the inbox",
        Duration::from_secs(10),
        || dst.status()["inbox"] == 0,
    );
    assert_eq!(dst.counter("storage_errors"), 1);
    // The client is still waiting, and takes the next file.
    assert!(client.running());
    send_one(1);
    assert_ok(&client.wait(Duration::from_secs(20)));
    assert_eq!(received(&[dir]), ["file1.bin"]);
}

/// `hop recv --exec`: the command runs once per stored file with the file's facts in its
/// environment (a file name with shell syntax in it stays data); a failing command is
/// reported and the next file still arrives.
#[test]
fn the_arrival_hook_runs_per_file_with_its_facts_in_the_environment() {
    let work = tempfile::tempdir().unwrap();
    let nodes = loopback_chain(2, work.path(), "");
    let dir = work.path().join("in");
    let log = work.path().join("hook.log");
    let files = ["a $(touch pwned).txt", "fail.bin"];
    for (i, name) in files.iter().enumerate() {
        let f = work.path().join(name);
        std::fs::write(&f, pattern(20 + i as u64, 1000 + i)).unwrap();
        let s = send(&nodes[0], &[&f], 2);
        assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stderr));
    }
    let hook = format!(
        "echo \"$HOP_NAME|$HOP_FROM|$HOP_SIZE|$HOP_FLOW|$(basename \"$HOP_FILE\")\" >> {}; \
         test \"$HOP_NAME\" != fail.bin",
        log.display()
    );
    let out = nodes[1].hop(&[
        "recv",
        "--dir",
        dir.to_str().unwrap(),
        "--count",
        "2",
        "--exec",
        &hook,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--exec") && err.contains("fail.bin"), "{err}");
    let text = std::fs::read_to_string(&log).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with("a $(touch pwned).txt|1|1000|1-"),
        "{text}"
    );
    assert!(lines[0].ends_with("|a $(touch pwned).txt"), "{text}");
    assert!(lines[1].starts_with("fail.bin|1|1001|"), "{text}");
    assert!(!std::path::Path::new("pwned").exists());
    assert!(!dir.join("pwned").exists());
}

/// `hop send DIR` sends every file under the directory and `hop recv` rebuilds its tree;
/// `hop send - --name NAME` sends standard input; a name that tries to leave the receiving
/// directory is kept inside it.
#[test]
fn a_directory_tree_and_standard_input_arrive_in_place() {
    let work = tempfile::tempdir().unwrap();
    let nodes = loopback_chain(2, work.path(), "");
    let tree = work.path().join("photos");
    std::fs::create_dir_all(tree.join("2026/may")).unwrap();
    std::fs::create_dir_all(tree.join("empty")).unwrap();
    let files = [
        ("a.jpg", 1500usize),
        ("2026/b.jpg", 2500),
        ("2026/may/c.jpg", 10),
    ];
    for (i, (rel, len)) in files.iter().enumerate() {
        std::fs::write(tree.join(rel), pattern(30 + i as u64, *len)).unwrap();
    }
    let s = nodes[0].hop(&["send", "--quiet", tree.to_str().unwrap(), "--to", "2"]);
    assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stderr));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hop"))
        .arg("--socket")
        .arg(nodes[0].socket())
        .args(["send", "-", "--name", "../notes.txt", "--to", "2"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"from a pipe\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("notes.txt (standard input)"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let dir = work.path().join("in");
    let r = nodes[1].hop(&["recv", "--dir", dir.to_str().unwrap(), "--count", "4"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    for (i, (rel, len)) in files.iter().enumerate() {
        let got = std::fs::read(dir.join("photos").join(rel)).unwrap();
        assert!(got == pattern(30 + i as u64, *len), "{rel}");
    }
    assert_eq!(
        std::fs::read(dir.join("notes.txt")).unwrap(),
        b"from a pipe\n"
    );
    assert!(!work.path().join("notes.txt").exists());
    let leftovers = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("hop-stdin-{pid}-"))
        })
        .count();
    assert_eq!(leftovers, 0, "the spooled standard input was left behind");
}

/// Services (endpoints): a file sent to NODE/SERVICE goes only to `hop recv --service
/// SERVICE`, one sent to the node to the receivers without a service; each waits in the
/// inbox for its own receiver.
#[test]
fn files_for_a_service_reach_only_its_receivers() {
    let work = tempfile::tempdir().unwrap();
    let nodes = loopback_chain(2, work.path(), "");
    let photo = work.path().join("p.jpg");
    let note = work.path().join("n.txt");
    std::fs::write(&photo, pattern(40, 4000)).unwrap();
    std::fs::write(&note, pattern(41, 500)).unwrap();
    for (f, to) in [(&photo, "2/photos"), (&note, "2")] {
        let s = nodes[0].hop(&["send", "--quiet", f.to_str().unwrap(), "--to", to]);
        assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stderr));
    }
    let bad = nodes[0].hop(&["send", note.to_str().unwrap(), "--to", "2/Bad Name"]);
    assert_eq!(bad.status.code(), Some(2));
    let plain = work.path().join("plain");
    let photos = work.path().join("photos");
    let r = nodes[1].hop(&["recv", "--dir", plain.to_str().unwrap(), "--count", "1"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let r = nodes[1].hop(&[
        "recv",
        "--dir",
        photos.to_str().unwrap(),
        "--service",
        "photos",
        "--count",
        "1",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let names = |d: &std::path::Path| -> Vec<String> {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect()
    };
    assert_eq!(names(&plain), ["n.txt"]);
    assert_eq!(names(&photos), ["p.jpg"]);
    assert_eq!(nodes[1].status()["inbox"], 0);
}
