//! The HTTP API (`http_listen`), driven by the Python client in examples/http/.

mod common;

use std::net::SocketAddr;
use std::process::Command;

use common::*;

/// One HTTP/1.0 request; returns the status code and the body.
fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (code, body)
}

fn client(api: SocketAddr, args: &[&str]) -> std::process::Output {
    Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/http/hop_client.py"
        ))
        .arg("--api")
        .arg(format!("http://{api}"))
        .args(args)
        .output()
        .expect("python3")
}

/// A file sent through node 1's HTTP API to a service at node 2 is received through node 2's
/// HTTP API, byte for byte, and acknowledged away; bad requests get JSON errors with their
/// HTTP status.
#[test]
fn files_cross_the_mesh_through_the_http_api() {
    let work = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = |i: u32| -> SocketAddr { format!("127.0.0.{i}:{port}").parse().unwrap() };
    let http =
        |i: u32| -> SocketAddr { format!("127.0.0.{i}:{}", free_tcp_port()).parse().unwrap() };
    let apis = [http(1), http(2)];
    let nodes: Vec<Hopd> = (1..=2)
        .map(|i| {
            let extra = format!("http_listen = \"{}\"", apis[i as usize - 1]);
            let spec = chain_spec(2, i, addr(i), &|j| addr(j), None, &extra);
            Hopd::start(spec, work.path().join(format!("n{i}")))
        })
        .collect();
    // Both nodes' event streams, open before anything happens.
    let listen = |api: SocketAddr| {
        let (ws, _) = tokio_tungstenite::tungstenite::connect(format!("ws://{api}/v1/events"))
            .expect("websocket");
        if let tokio_tungstenite::tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_ref() {
            s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
                .unwrap();
        }
        ws
    };
    let (mut events1, mut events2) = (listen(apis[0]), listen(apis[1]));
    let file = work.path().join("sensor.csv");
    let data = pattern(50, 300_000);
    std::fs::write(&file, &data).unwrap();
    let sent = client(
        apis[0],
        &[
            "send",
            file.to_str().unwrap(),
            "--to",
            "2",
            "--service",
            "sensors",
        ],
    );
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let reply: serde_json::Value = serde_json::from_slice(&sent.stdout).unwrap();
    assert_eq!(reply["bytes"], 300_000, "{reply}");
    let out = work.path().join("in");
    let got = client(
        apis[1],
        &[
            "receive",
            "--dir",
            out.to_str().unwrap(),
            "--service",
            "sensors",
            "--count",
            "1",
        ],
    );
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    assert!(std::fs::read(out.join("sensor.csv")).unwrap() == data);
    assert_eq!(nodes[1].status()["inbox"], 0, "acknowledged away");
    let next = |ws: &mut tokio_tungstenite::tungstenite::WebSocket<_>| -> serde_json::Value {
        let m = ws.read().expect("an event");
        serde_json::from_str(m.to_text().unwrap()).unwrap()
    };
    let arrived = next(&mut events2);
    assert_eq!(arrived["event"], "file", "{arrived}");
    assert_eq!(arrived["name"], "sensor.csv");
    assert_eq!(arrived["service"], "sensors");
    let done = next(&mut events1);
    assert_eq!(done["event"], "complete", "{done}");
    assert_eq!(done["bytes"], 300_000);
    // Errors.
    let (code, body) = request(apis[0], "POST", "/v1/transfers?name=x", b"abc");
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("bad_request"), "{body}");
    let (code, body) = request(apis[0], "POST", "/v1/transfers?to=9", b"abc");
    assert_eq!(code, 404, "{body}");
    let (code, _) = request(apis[0], "DELETE", "/v1/transfers/1:00000000", b"");
    assert_eq!(code, 404);
    let (code, body) = request(apis[1], "GET", "/v1/status", b"");
    assert_eq!(code, 200);
    assert!(body.contains("\"node_id\":2"), "{body}");
}
