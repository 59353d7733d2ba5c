//! Every transport hopd can host (`transport = ...`) carries a file over two hops of real
//! hopd processes on loopback; only Hop uses the custody store.

mod common;

use std::io::{Read, Write};
use std::path::Path;

use common::*;

/// 200 KiB: a few hundred packets for the packet transports, one block for Hop.
const FILE_BYTES: usize = 200 * 1024;
/// More than the HxH and ATP send buffers (256 KiB, `send_buffer_bytes`), so the daemon must
/// wait for `Writable` events to hand over the rest of the file.
const PAST_SEND_BUFFER_BYTES: usize = 1024 * 1024;

fn metrics(node: &Hopd) -> String {
    let mut s = std::net::TcpStream::connect(node.metrics).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.0 200"), "{out}");
    out
}

/// Sum of the samples of metric `name` whose labels include `labels` (e.g. `transport="atp"`).
fn metric_sum(text: &str, name: &str, labels: &str) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let rest = series.strip_prefix(name)?;
            let matches = if labels.is_empty() {
                rest.is_empty() || rest.starts_with('{')
            } else {
                rest.starts_with('{') && rest.contains(labels)
            };
            matches.then(|| value.parse::<u64>().ok()).flatten()
        })
        .sum()
}

/// Send one file of `bytes` from node 1 over node 2 to node 3 with `transport` (the
/// configuration name) and check it arrives identical, once; `label` is the transport's
/// metrics label.
fn two_hops(transport: &str, label: &str, seed: u64, bytes: usize) {
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join(format!("{transport}.bin"));
    let data = pattern(seed, bytes);
    std::fs::write(&file, &data).unwrap();
    let extra = format!("transport = \"{transport}\"");
    let nodes = loopback_chain(3, work.path(), &extra);
    let (src, relay, dst) = (&nodes[0], &nodes[1], &nodes[2]);

    let s = send(src, &[file.as_path()], dst.spec.id);
    assert!(
        s.status.success(),
        "{transport}: hop send failed: {}\nsource log:\n{}\nrelay log:\n{}",
        String::from_utf8_lossy(&s.stderr),
        src.log(),
        relay.log()
    );
    let out = work.path().join("out");
    let r = recv(dst, &out, 1);
    assert!(
        r.status.success(),
        "{transport}: hop recv failed: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let got = std::fs::read(out.join(file.file_name().unwrap())).unwrap();
    assert_eq!(got.len(), data.len(), "{transport}: length");
    assert!(got == data, "{transport}: bytes differ");
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 1);
    assert_eq!(dst.counter("files_received"), 1, "{transport}");
    assert_eq!(dst.counter("integrity_failures"), 0, "{transport}");
    assert_eq!(src.counter("flows_completed"), 1, "{transport}");
    assert_eq!(src.counter("flows_failed"), 0, "{transport}");

    // The relay forwarded the flow with the configured transport and no other.
    let m = metrics(relay);
    let label = format!("transport=\"{label}\"");
    assert!(
        metric_sum(&m, "hopd_transport_sent_total", &label) > 0,
        "{transport}: the relay sent nothing with {label}:\n{m}"
    );
    let all = metric_sum(&m, "hopd_transport_sent_total", "");
    assert_eq!(
        all,
        metric_sum(&m, "hopd_transport_sent_total", &label),
        "{transport}: the relay sent with another transport:\n{m}"
    );
    // Per neighbour: what went to the next hop, and (Hop) its round trip; per transfer: how
    // long the source's completed transfers took.
    let sm = metrics(src);
    assert!(
        metric_sum(&sm, "hopd_neighbour_sent_bytes_total", "neighbour=\"2\"") as usize > bytes,
        "{transport}: bytes to the next hop not counted:\n{sm}"
    );
    assert_eq!(
        metric_sum(&sm, "hopd_flow_completion_seconds_count", ""),
        1,
        "{transport}:\n{sm}"
    );
    if transport == "hop" {
        assert!(
            sm.contains("hopd_neighbour_rtt_seconds{neighbour=\"2\"}"),
            "hop: no round trip to the next hop:\n{sm}"
        );
        // Its BSYNs and BACKs lost each way: none over loopback.
        for dir in ["from", "to"] {
            let line = format!(
                "hopd_neighbour_control_loss_ratio{{neighbour=\"2\",direction=\"{dir}\"}} 0"
            );
            assert!(sm.contains(&line), "hop: no {line}:\n{sm}");
        }
        let st = src.status();
        let next = st["neighbours"]
            .as_array()
            .and_then(|ns| ns.iter().find(|n| n["id"] == 2))
            .cloned()
            .unwrap_or_default();
        assert_eq!(next["control_loss_from_pct"], 0.0, "{st}");
        assert_eq!(next["control_loss_to_pct"], 0.0, "{st}");
    }
    // Custody: Hop persists the relayed block; the packet transports never touch the store.
    let stored = metric_sum(&m, "hopd_custody_blocks_stored_total", "");
    if transport == "hop" {
        assert!(
            stored > 0,
            "hop: the relay took no block into custody:\n{m}"
        );
    } else {
        assert_eq!(stored, 0, "{transport}: custody used:\n{m}");
        let custody_dir = relay.dir.join("store").join("custody");
        assert!(
            !custody_dir.exists() || is_empty_dir(&custody_dir),
            "{transport}: files in {}",
            custody_dir.display()
        );
    }
}

fn is_empty_dir(p: &Path) -> bool {
    std::fs::read_dir(p)
        .map(|mut d| d.next().is_none())
        .unwrap_or(true)
}

#[test]
fn hop_two_hops() {
    two_hops("hop", "hop", 1, FILE_BYTES);
}

#[test]
fn hxh_two_hops() {
    two_hops("hxh", "hxh", 2, FILE_BYTES);
}

#[test]
fn atp_two_hops() {
    two_hops("atp", "atp", 3, FILE_BYTES);
}

#[test]
fn atp_aggressive_two_hops() {
    two_hops("atp-aggressive", "atp", 4, FILE_BYTES);
}

#[test]
fn atp_adaptive_two_hops() {
    two_hops("atp-adaptive", "atp", 5, FILE_BYTES);
}

#[test]
fn hxh_two_hops_past_the_send_buffer() {
    assert!(PAST_SEND_BUFFER_BYTES > hop_proto::hxh::HxhConfig::default().send_buffer_bytes);
    two_hops("hxh", "hxh", 6, PAST_SEND_BUFFER_BYTES);
}

#[test]
fn atp_two_hops_past_the_send_buffer() {
    assert!(PAST_SEND_BUFFER_BYTES > hop_proto::atp::AtpConfig::default().send_buffer_bytes);
    two_hops("atp", "atp", 7, PAST_SEND_BUFFER_BYTES);
}

#[test]
fn unknown_transport_is_a_config_error() {
    let work = tempfile::tempdir().unwrap();
    let spec = NodeSpec {
        id: 1,
        listen: "127.0.0.1:7000".parse().unwrap(),
        neighbours: vec![],
        routes: vec![],
        netns: None,
        extra: "transport = \"tcp\"".into(),
    };
    Hopd::write_config(&spec, work.path(), "127.0.0.1:7001".parse().unwrap());
    let o = std::process::Command::new(HOPD)
        .arg("--check-config")
        .arg(work.path().join("hopd.toml"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr).to_string() + &String::from_utf8_lossy(&o.stdout);
    for name in ["hop", "hxh", "atp", "atp-aggressive", "atp-adaptive"] {
        assert!(
            err.contains(&format!("`{name}`")),
            "{name} missing in: {err}"
        );
    }
}
