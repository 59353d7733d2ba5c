//! `hopd --check-config` and `hop` error handling.

mod common;

use std::process::Command;

use common::*;

fn check(text: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    std::fs::write(&p, text).unwrap();
    let o = Command::new(HOPD)
        .arg("--check-config")
        .arg(&p)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).to_string() + &String::from_utf8_lossy(&o.stdout),
    )
}

fn base() -> String {
    format!(
        "node_id = 1\nlisten = \"127.0.0.1:7470\"\n[[neighbours]]\nid = 2\naddress = \"127.0.0.2:7470\"\n[storage]\ndir = \"store\"\n[security]\nmesh_key = \"{KEY}\"\n"
    )
}

#[test]
fn check_config_accepts_a_good_file() {
    let (code, out) = check(&base());
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ok"), "{out}");
}

#[test]
fn check_config_reports_line_and_hint() {
    let cases: [(String, &str, &str); 7] = [
        (
            "default_lifetime = \"soon\"\n".to_string() + &base(),
            ":1:",
            "not a duration",
        ),
        (
            "transport = \"hxh\"\ndefault_lifetime = \"3d\"\n".to_string() + &base(),
            ":2:",
            "needs transport = \"hop\"",
        ),
        (
            base().replace("[storage]\n", "[storage]\nmax_disk = 3\n"),
            ":7:",
            "unknown field",
        ),
        (
            base().replace("id = 2\n", "id = \"two\"\n"),
            ":4:",
            "invalid type",
        ),
        (
            base() + "[[routes]]\ndestination = 5\nnext_hop = 9\n",
            ":12:",
            "not a neighbour",
        ),
        (
            base().replace("127.0.0.2:7470", "nowhere"),
            ":5:",
            "not an IP address",
        ),
        (base().replace(KEY, "abcd"), ":9:", "64 hex digits"),
    ];
    for (text, line, msg) in cases {
        let (code, out) = check(&text);
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("bad.toml"), "{out}");
        assert!(out.contains(line), "expected {line} in {out}");
        assert!(out.contains(msg), "expected {msg} in {out}");
        assert!(out.contains("hint:"), "{out}");
    }
    let (code, out) = check("node_id = 1\n");
    assert_eq!(code, 1);
    assert!(out.contains("missing field"), "{out}");
}

fn hop(socket: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(HOP)
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn hop_against_stopped_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("x");
    std::fs::write(&f, b"hello").unwrap();
    let sock = dir.path().join("none.sock");
    let o = hop(&sock, &["send", f.to_str().unwrap(), "--to", "2"]);
    assert_eq!(o.status.code(), Some(3));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot reach hopd"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    let o = hop(&sock, &["status", "--json"]);
    assert_eq!(o.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["exit_code"], 3);
}

#[test]
fn hop_bad_input_has_distinct_exit_codes() {
    let work = tempfile::tempdir().unwrap();
    let nodes = loopback_chain(2, work.path(), "");
    let sock = nodes[0].socket();
    let missing = work.path().join("missing.bin");
    let o = hop(&sock, &["send", missing.to_str().unwrap(), "--to", "2"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("no such file"));
    let f = work.path().join("f");
    std::fs::write(&f, b"data").unwrap();
    let o = hop(&sock, &["send", f.to_str().unwrap(), "--to", "42"]);
    assert_eq!(
        o.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("node 42"));
    let o = hop(&sock, &["status"]);
    assert!(o.status.success());
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(shown.contains("neighbours:"), "{shown}");
    // The cipher `auto` chose for this CPU, named as the config names it.
    let cipher = if hopd::auth::hardware_aes() {
        "aes-256-gcm"
    } else {
        "chacha20-poly1305"
    };
    assert!(
        shown.contains(&format!("sealing with {cipher} under the mesh key")),
        "{shown}"
    );
}

/// `api_group`: an unknown group is a configuration error with its line; a known one makes
/// the API socket its group's, mode 0660, so its members can use `hop` without root.
#[test]
fn the_api_socket_can_belong_to_a_group() {
    let (code, out) = check(&base().replace(
        "node_id = 1\n",
        "node_id = 1\napi_group = \"no-such-group-hop\"\n",
    ));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(":2:") && out.contains("no group named"),
        "{out}"
    );
    if !is_root() {
        eprintln!("skipped the socket part: needs root to give the socket away");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let nodes = loopback_chain(1, work.path(), "api_group = \"65534\"");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let m = std::fs::metadata(nodes[0].socket()).unwrap();
    assert_eq!(m.gid(), 65534);
    assert_eq!(m.permissions().mode() & 0o777, 0o660);
    assert_eq!(nodes[0].status()["node_id"], 1);
}

/// The package's template configuration (packaging/hopd.toml) is valid with the key and
/// members file its postinst makes (`hop keygen --members`), and the group the package
/// creates.
#[test]
fn the_packaged_template_configuration_checks_out() {
    let dir = tempfile::tempdir().unwrap();
    let (key, members) = (dir.path().join("node.key"), dir.path().join("members"));
    let o = std::process::Command::new(HOP)
        .args(["--json", "keygen", "--out"])
        .arg(&key)
        .arg("--members")
        .arg(&members)
        .args(["--name", "this-node"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["admitted"], true);
    let listed = std::fs::read_to_string(&members).unwrap();
    assert!(
        listed.contains(v["public_key"].as_str().unwrap()) && listed.contains("this-node"),
        "{listed}"
    );
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../packaging/hopd.toml"
    ))
    .unwrap()
    .replace("/etc/hopd/", &format!("{}/", dir.path().display()))
    .replace("api_group = \"hop\"", "api_group = \"0\"");
    let (code, out) = check(&text);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("node {}, 0 neighbours", v["node_id"])),
        "{out}"
    );
}

/// `hop status` says whether hopd takes its link to retry control frames, why, and whether
/// Hop's BSYNs and BACKs therefore go more than once where they are lost (`control_copies =
/// "auto"`): over loopback, which sends every datagram once, they do; a configuration that
/// says the link retries (an 802.11 radio behind an Ethernet bridge) turns them off.
#[test]
fn status_says_whether_the_link_retries_control_frames() {
    let work = tempfile::tempdir().unwrap();
    let lo = loopback_chain(1, &work.path().join("lo"), "");
    let st = lo[0].status();
    assert_eq!(st["link"]["retries"], false, "{st}");
    assert_eq!(st["link"]["control_copies"], true, "{st}");
    assert!(
        st["link"]["reason"].as_str().unwrap_or("").contains("lo"),
        "{st}"
    );
    let radio = loopback_chain(1, &work.path().join("radio"), "link_retries = true");
    let st = radio[0].status();
    assert_eq!(st["link"]["retries"], true, "{st}");
    assert_eq!(st["link"]["control_copies"], false, "{st}");
}
