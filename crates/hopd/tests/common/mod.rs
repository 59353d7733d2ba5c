//! Test harness: real hopd processes on loopback or in network namespaces, cleaned up on drop.
#![allow(dead_code)]

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const HOPD: &str = env!("CARGO_BIN_EXE_hopd");
pub const HOP: &str = env!("CARGO_BIN_EXE_hop");
pub const KEY: &str = "5f3c0d2a9b8e7f6a5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b";

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A unique small number for names (namespaces, interfaces) in this process.
pub fn unique() -> u32 {
    SEQ.fetch_add(1, Ordering::SeqCst)
}

/// Deterministic pseudo-random bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Loopback addresses a port from [`free_port`] is checked on (chains use 127.0.0.1..=n).
const LOOPBACK_NODES: u8 = 8;

/// The lowest port the kernel hands out to sockets bound to port 0.
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// Whether UDP and TCP `port` can be bound on 127.0.0.1..=`LOOPBACK_NODES` right now.
fn bindable(port: u16) -> bool {
    (1..=LOOPBACK_NODES).all(|i| {
        let a = SocketAddr::from(([127, 0, 0, i], port));
        UdpSocket::bind(a).is_ok() && std::net::TcpListener::bind(a).is_ok()
    })
}

static NEXT_PORT: AtomicU32 = AtomicU32::new(0);

/// A port free for UDP and TCP on 127.0.0.1..=8, never handed out before in this process.
///
/// It lies below the kernel's ephemeral range: a socket bound to port 0 (a daemon's data
/// socket, a client) never takes it between this check and the daemon's bind. Tests run in
/// parallel threads, and a port picked by binding port 0 was once taken by another chain's
/// data socket on 127.0.0.2 in that window.
pub fn free_port() -> u16 {
    let low = u32::from(ephemeral_low().max(4096));
    let span = low - 2048;
    let start = std::process::id().wrapping_mul(7919) % span;
    loop {
        let k = NEXT_PORT.fetch_add(1, Ordering::SeqCst);
        assert!(k < span, "no free test port below {low}");
        let port = (2048 + (start + k) % span) as u16;
        if bindable(port) {
            return port;
        }
    }
}

/// One node's place in a topology.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub id: u32,
    pub listen: SocketAddr,
    /// (neighbour id, its address as seen from this node)
    pub neighbours: Vec<(u32, SocketAddr)>,
    /// (destination, next hop)
    pub routes: Vec<(u32, u32)>,
    /// Network namespace to run in, if any.
    pub netns: Option<String>,
    pub extra: String,
}

/// A running hopd; killed on drop.
pub struct Hopd {
    pub spec: NodeSpec,
    pub dir: PathBuf,
    pub child: Option<Child>,
    pub metrics: SocketAddr,
}

impl Hopd {
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("hopd.toml")
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("hopd.sock")
    }

    /// The configuration file of `spec`; lines of `spec.extra` that start with `security.`
    /// go into the `[security]` table (without the prefix), the rest at the top.
    pub fn write_config(spec: &NodeSpec, dir: &Path, metrics: SocketAddr) {
        let (security, top): (Vec<&str>, Vec<&str>) = spec
            .extra
            .lines()
            .partition(|l| l.trim_start().starts_with("security."));
        let top = top.join("\n");
        let mut s = format!(
            "node_id = {}\nlisten = \"{}\"\napi_socket = \"{}\"\nmetrics_listen = \"{}\"\nlog_level = \"info\"\n{}\n",
            spec.id,
            spec.listen,
            dir.join("hopd.sock").display(),
            metrics,
            top
        );
        for (id, a) in &spec.neighbours {
            s += &format!("[[neighbours]]\nid = {id}\naddress = \"{a}\"\n");
        }
        for (d, n) in &spec.routes {
            s += &format!("[[routes]]\ndestination = {d}\nnext_hop = {n}\n");
        }
        // Sessions replace the mesh key (a configuration with both is refused).
        let sessions = security.iter().any(|l| l.contains("sessions = true"));
        s += &format!(
            "[storage]\ndir = \"{}\"\n[security]\n",
            dir.join("store").display()
        );
        if !sessions {
            s += &format!("mesh_key = \"{KEY}\"\n");
        }
        for l in security {
            s += l.trim_start().trim_start_matches("security.");
            s += "\n";
        }
        std::fs::write(dir.join("hopd.toml"), s).unwrap();
    }

    pub fn start(spec: NodeSpec, dir: PathBuf) -> Hopd {
        std::fs::create_dir_all(&dir).unwrap();
        let metrics = SocketAddr::new(spec.listen.ip(), free_tcp_port());
        Self::write_config(&spec, &dir, metrics);
        let mut h = Hopd {
            spec,
            dir,
            child: None,
            metrics,
        };
        h.restart();
        h
    }

    /// Start (again) the process.
    pub fn restart(&mut self) {
        assert!(self.child.is_none());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("hopd.log"))
            .unwrap();
        let mut cmd = match &self.spec.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, HOPD]);
                c
            }
            None => Command::new(HOPD),
        };
        cmd.arg("--config")
            .arg(self.config_path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        self.child = Some(cmd.spawn().expect("spawn hopd"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.socket().exists() {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("hopd {} exited: {st}; log:\n{}", self.spec.id, self.log());
                }
            }
            assert!(
                Instant::now() < deadline,
                "hopd {} did not start",
                self.spec.id
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Restart a stopped node and wait until the new process serves (a killed one leaves its
    /// socket file behind, so the file's existence proves nothing).
    pub fn restart_serving(&mut self) {
        let runs = self.log().matches("hopd running").count();
        self.restart();
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.log().matches("hopd running").count() <= runs {
            assert!(
                Instant::now() < deadline,
                "node {} did not restart",
                self.spec.id
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(st);
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                return c.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("hopd.log")).unwrap_or_default()
    }

    pub fn hop(&self, args: &[&str]) -> Output {
        // The API is a Unix socket on the file system: reachable from any namespace.
        let mut c = Command::new(HOP);
        c.arg("--socket")
            .arg(self.socket())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run hop")
    }

    pub fn status(&self) -> serde_json::Value {
        let o = self.hop(&["status", "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    /// Prometheus metrics text, fetched through `hop status` counters instead of HTTP when the
    /// node lives in a namespace.
    pub fn counter(&self, name: &str) -> u64 {
        self.status()["counters"][name].as_u64().unwrap_or(0)
    }
}

impl Drop for Hopd {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A port for a TCP listener on 127.0.0.x (see [`free_port`]).
pub fn free_tcp_port() -> u16 {
    free_port()
}

/// A chain of `n` nodes (ids 1..=n) on loopback 127.0.0.1..n, with static routes.
pub fn loopback_chain(n: u32, root: &Path, extra: &str) -> Vec<Hopd> {
    let port = free_port();
    let addr = |i: u32| -> SocketAddr { format!("127.0.0.{i}:{port}").parse().unwrap() };
    (1..=n)
        .map(|i| {
            let spec = chain_spec(n, i, addr(i), &|j| addr(j), None, extra);
            Hopd::start(spec, root.join(format!("n{i}")))
        })
        .collect()
}

/// Node `i` of an `n`-node chain: neighbours i-1 and i+1, routes along the chain.
pub fn chain_spec(
    n: u32,
    i: u32,
    listen: SocketAddr,
    addr_of: &dyn Fn(u32) -> SocketAddr,
    netns: Option<String>,
    extra: &str,
) -> NodeSpec {
    let mut neighbours = Vec::new();
    if i > 1 {
        neighbours.push((i - 1, addr_of(i - 1)));
    }
    if i < n {
        neighbours.push((i + 1, addr_of(i + 1)));
    }
    let mut routes = Vec::new();
    for d in 1..=n {
        if d + 1 < i {
            routes.push((d, i - 1));
        } else if d > i + 1 {
            routes.push((d, i + 1));
        }
    }
    NodeSpec {
        id: i,
        listen,
        neighbours,
        routes,
        netns,
        extra: extra.to_string(),
    }
}

/// Receive one file at `dst` into `dir` and check it is `name` with exactly `data`.
pub fn receive_one_file(dst: &Hopd, dir: &Path, name: &str, data: &[u8]) {
    let r = recv(dst, dir, 1);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let got = std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(
        got == data,
        "{name}: {} bytes received, not the {} sent",
        got.len(),
        data.len()
    );
}

/// Send `files` from `src` to node `to`; returns the hop output.
pub fn send(src: &Hopd, files: &[&Path], to: u32) -> Output {
    let mut args: Vec<String> = vec!["send".into(), "--quiet".into()];
    for f in files {
        args.push(f.display().to_string());
    }
    args.push("--to".into());
    args.push(to.to_string());
    let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    src.hop(&a)
}

/// `hop send --detach --quiet FILE --to TO` through `src`; checks that hopd took it.
pub fn send_detached(src: &Hopd, file: &Path, to: u32) {
    let to = to.to_string();
    let o = src.hop(&[
        "send",
        "--detach",
        "--quiet",
        file.to_str().unwrap(),
        "--to",
        &to,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Receive exactly `count` files at `dst` into `dir`.
pub fn recv(dst: &Hopd, dir: &Path, count: usize) -> Output {
    dst.hop(&[
        "recv",
        "--dir",
        &dir.display().to_string(),
        "--count",
        &count.to_string(),
    ])
}

fn run(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn run_ok(cmd: &str, args: &[&str]) {
    let o = Command::new(cmd).args(args).output().expect(cmd);
    assert!(
        o.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Network namespaces ns0..nsN joined in a chain by veth pairs (link k between ns k and k+1
/// uses 10.<tag>.<k>.1 and .2), with `loss` percent random drops of hopd's UDP port on input
/// in every namespace (nftables). Deleted on drop.
pub struct NetnsChain {
    pub names: Vec<String>,
    pub tag: u32,
}

impl NetnsChain {
    pub fn new(nodes: u32, loss: u32, port: u16) -> NetnsChain {
        let tag = (std::process::id() % 200 + unique() * 7) % 250 + 1;
        let base = format!("hopt{}x{}", std::process::id(), unique());
        let names: Vec<String> = (0..nodes).map(|i| format!("{base}n{i}")).collect();
        let chain = NetnsChain { names, tag };
        for n in &chain.names {
            run_ok("ip", &["netns", "add", n]);
            run_ok("ip", &["-n", n, "link", "set", "lo", "up"]);
        }
        for k in 0..nodes.saturating_sub(1) {
            let a = format!("h{tag}v{k}a");
            let b = format!("h{tag}v{k}b");
            let (na, nb) = (&chain.names[k as usize], &chain.names[k as usize + 1]);
            run_ok(
                "ip",
                &[
                    "link", "add", &a, "netns", na, "type", "veth", "peer", "name", &b, "netns", nb,
                ],
            );
            run_ok(
                "ip",
                &[
                    "-n",
                    na,
                    "addr",
                    "add",
                    &format!("10.{tag}.{k}.1/24"),
                    "dev",
                    &a,
                ],
            );
            run_ok(
                "ip",
                &[
                    "-n",
                    nb,
                    "addr",
                    "add",
                    &format!("10.{tag}.{k}.2/24"),
                    "dev",
                    &b,
                ],
            );
            run_ok("ip", &["-n", na, "link", "set", &a, "up"]);
            run_ok("ip", &["-n", nb, "link", "set", &b, "up"]);
            if loss > 0 {
                // Loss per datagram, as on a radio: the kernel cuts hopd's UDP GSO batches
                // into single packets before they leave, so that nftables drops each on its
                // own rather than a whole batch (a control datagram and its copies, sent back
                // to back, would be lost together).
                for (ns, dev) in [(na, &a), (nb, &b)] {
                    run_ok(
                        "ip",
                        &["-n", ns, "link", "set", "dev", dev, "gso_max_segs", "1"],
                    );
                }
            }
        }
        if loss > 0 {
            for n in &chain.names {
                let nft = |args: &[&str]| {
                    let mut a = vec!["netns", "exec", n.as_str(), "nft"];
                    a.extend_from_slice(args);
                    run_ok("ip", &a);
                };
                nft(&["add", "table", "inet", "hoploss"]);
                nft(&[
                    "add",
                    "chain",
                    "inet",
                    "hoploss",
                    "input",
                    "{ type filter hook input priority 0; policy accept; }",
                ]);
                let (p, l) = (port.to_string(), loss.to_string());
                nft(&[
                    "add", "rule", "inet", "hoploss", "input", "udp", "dport", &p, "numgen",
                    "random", "mod", "100", "<", &l, "drop",
                ]);
            }
        }
        chain
    }

    /// The same chain over IPv6 only: no IPv4 address on the links, link k between ns k and
    /// k+1 with fd00:<tag>:<k>::1 and ::2 (/64) besides their link-local addresses, duplicate
    /// address detection off so that every address is usable at once; links of `mtu` bytes.
    pub fn new_v6(nodes: u32, mtu: u32) -> NetnsChain {
        let tag = (std::process::id() % 200 + unique() * 7) % 250 + 1;
        let base = format!("hop6t{}x{}", std::process::id(), unique());
        let names: Vec<String> = (0..nodes).map(|i| format!("{base}n{i}")).collect();
        let chain = NetnsChain { names, tag };
        for n in &chain.names {
            run_ok("ip", &["netns", "add", n]);
            run_ok("ip", &["-n", n, "link", "set", "lo", "up"]);
            for key in ["all", "default"] {
                run_ok(
                    "ip",
                    &[
                        "netns",
                        "exec",
                        n,
                        "sysctl",
                        "-qw",
                        &format!("net.ipv6.conf.{key}.accept_dad=0"),
                    ],
                );
            }
        }
        let mtu = mtu.to_string();
        for k in 0..nodes.saturating_sub(1) {
            let a = format!("h{tag}v{k}a");
            let b = format!("h{tag}v{k}b");
            let (na, nb) = (&chain.names[k as usize], &chain.names[k as usize + 1]);
            run_ok(
                "ip",
                &[
                    "link", "add", &a, "netns", na, "type", "veth", "peer", "name", &b, "netns", nb,
                ],
            );
            for (ns, dev, side) in [(na, &a, 1), (nb, &b, 2)] {
                run_ok("ip", &["-n", ns, "link", "set", dev, "mtu", &mtu]);
                run_ok(
                    "ip",
                    &[
                        "-n",
                        ns,
                        "addr",
                        "add",
                        &format!("fd00:{tag:x}:{k}::{side}/64"),
                        "dev",
                        dev,
                        "nodad",
                    ],
                );
                run_ok("ip", &["-n", ns, "link", "set", dev, "up"]);
            }
        }
        chain
    }

    /// IPv6 address of node i (1-based) on the link towards node j (a `new_v6` chain).
    pub fn addr6(&self, i: u32, j: u32, port: u16) -> SocketAddr {
        let (k, side) = if j == i + 1 { (i - 1, 1) } else { (j - 1, 2) };
        format!("[fd00:{:x}:{}::{}]:{port}", self.tag, k, side)
            .parse()
            .unwrap()
    }

    /// Address of node i (1-based) on the link towards node j.
    pub fn addr(&self, i: u32, j: u32, port: u16) -> SocketAddr {
        let (k, side) = if j == i + 1 { (i - 1, 1) } else { (j - 1, 2) };
        format!("10.{}.{}.{}:{port}", self.tag, k, side)
            .parse()
            .unwrap()
    }
}

impl Drop for NetnsChain {
    fn drop(&mut self) {
        for n in &self.names {
            run("ip", &["netns", "del", n]);
        }
    }
}

/// Start an n-node chain in namespaces (node i in namespace i-1).
pub fn netns_nodes(chain: &NetnsChain, n: u32, port: u16, root: &Path, extra: &str) -> Vec<Hopd> {
    (1..=n)
        .map(|i| {
            let listen: SocketAddr = format!("0.0.0.0:{port}").parse().unwrap();
            let spec = chain_spec(
                n,
                i,
                listen,
                &|j| chain.addr(j, i, port),
                Some(chain.names[i as usize - 1].clone()),
                extra,
            );
            Hopd::start(spec, root.join(format!("n{i}")))
        })
        .collect()
}

/// Run `ip ARGS`; panics with its stderr if it fails.
pub fn ip_ok(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("ip");
    assert!(
        o.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Namespaces deleted on drop (with every interface in them), also when the test fails.
pub struct Namespaces(pub Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip")
                .args(["netns", "del", n])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// `n` network namespaces, each with an `eth0` on one bridge (in a namespace of its own): one
/// shared segment, like a radio channel. A `hub` bridge floods every frame to every port (it
/// learns no addresses). `eth0` is left down and without an address. Returns the tag for
/// addresses, the nodes' namespaces, and the guard that deletes every namespace.
pub fn bridge_segment(n: usize, hub: bool) -> (u32, Vec<String>, Namespaces) {
    let tag = (std::process::id() % 200 + unique() * 7) % 250 + 1;
    let base = format!("hopb{}x{}", std::process::id(), unique());
    let bridge_ns = format!("{base}br");
    let node_ns: Vec<String> = (1..=n).map(|i| format!("{base}n{i}")).collect();
    let mut all = vec![bridge_ns.clone()];
    all.extend(node_ns.iter().cloned());
    let guard = Namespaces(all.clone());
    for ns in &all {
        ip_ok(&["netns", "add", ns]);
        ip_ok(&["-n", ns, "link", "set", "lo", "up"]);
    }
    let ageing = if hub { "0" } else { "30000" };
    ip_ok(&[
        "-n",
        &bridge_ns,
        "link",
        "add",
        "hb0",
        "type",
        "bridge",
        "ageing_time",
        ageing,
    ]);
    ip_ok(&["-n", &bridge_ns, "link", "set", "hb0", "up"]);
    for (i, ns) in node_ns.iter().enumerate() {
        let port_if = format!("hbp{i}");
        ip_ok(&[
            "link", "add", &port_if, "netns", &bridge_ns, "type", "veth", "peer", "name", "eth0",
            "netns", ns,
        ]);
        ip_ok(&[
            "-n", &bridge_ns, "link", "set", &port_if, "master", "hb0", "up",
        ]);
        if hub {
            ip_ok(&[
                "-n",
                &bridge_ns,
                "link",
                "set",
                "dev",
                &port_if,
                "type",
                "bridge_slave",
                "learning",
                "off",
            ]);
        }
    }
    (tag, node_ns, guard)
}

/// Kills a child process on drop (also when the test fails).
pub struct ChildGuard(pub Option<Child>);

impl ChildGuard {
    pub fn running(&mut self) -> bool {
        self.0
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// Wait up to `limit` for the child (killed after that) and collect its output.
    pub fn wait(&mut self, limit: Duration) -> Output {
        let mut c = self.0.take().unwrap();
        let deadline = Instant::now() + limit;
        while c.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = c.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        c.wait_with_output().unwrap()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `hop send --quiet FILE --to TO` through `node`, in the background.
pub fn spawn_send(node: &Hopd, file: &Path, to: u32) -> Child {
    Command::new(HOP)
        .arg("--socket")
        .arg(node.socket())
        .args(["send", "--quiet"])
        .arg(file)
        .args(["--to", &to.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Bytes the node has spooled for its incoming flows.
pub fn incoming_bytes(node: &Hopd) -> u64 {
    node.status()["incoming"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f["bytes"].as_u64()).sum())
        .unwrap_or(0)
}

/// The Prometheus text a node's metrics endpoint serves.
pub fn metrics(addr: SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.0 200"), "{out}");
    out
}

/// The value of metric `name` (a line `name VALUE`) in a metrics text.
pub fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("metric {name} missing"))
}

/// Wait until `node`'s log holds `what`; panics with the log after `limit`.
pub fn wait_log(node: &Hopd, what: &str, limit: Duration) {
    let t0 = std::time::Instant::now();
    while !node.log().contains(what) {
        assert!(
            t0.elapsed() < limit,
            "no `{what}` within {limit:?}:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `hop keygen --json --out FILE`: (public key, node id).
pub fn keygen(file: &Path) -> (String, u32) {
    let o = std::process::Command::new(HOP)
        .args(["--json", "keygen", "--out"])
        .arg(file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    (
        v["public_key"].as_str().unwrap().to_string(),
        v["node_id"].as_u64().unwrap() as u32,
    )
}
