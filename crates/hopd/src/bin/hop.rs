//! hop: send and receive files through the local hopd, and show its status.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use hopd::api::{self, exit, ErrorCode, Reply, Request, API_VERSION, DATA_CHUNK};
use hopd::cli::{Args, Cmd};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

struct Fail {
    code: i32,
    msg: String,
}

fn fail(code: i32, msg: impl Into<String>) -> Fail {
    Fail {
        code,
        msg: msg.into(),
    }
}

fn main() -> ExitCode {
    // Output piped into `head` ends quietly, as for other command-line tools, instead of
    // a panic on the broken pipe.
    // SAFETY: restoring the default action of a signal before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime always builds");
    let json = args.json;
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"ok": false, "exit_code": f.code, "error": f.msg})
                );
            } else {
                eprintln!("hop: {}", f.msg);
            }
            ExitCode::from(f.code as u8)
        }
    }
}

async fn connect(path: &Path) -> Result<UnixStream, Fail> {
    UnixStream::connect(path).await.map_err(|e| {
        fail(
            exit::NO_DAEMON,
            format!(
                "cannot reach hopd at {} ({e}); is it running? start it with `hopd --config FILE` or pass --socket",
                path.display()
            ),
        )
    })
}

fn io_fail(e: std::io::Error) -> Fail {
    fail(exit::NO_DAEMON, format!("lost the connection to hopd: {e}"))
}

fn reply_fail(code: ErrorCode, message: String) -> Fail {
    fail(code.exit_code(), message)
}

async fn next_reply(s: &mut UnixStream) -> Result<Reply, Fail> {
    match api::read_frame(s).await.map_err(io_fail)? {
        Some(f) => api::parse_reply(&f)
            .map_err(|e| fail(exit::PROTOCOL, format!("bad reply from hopd: {e}"))),
        None => Err(fail(exit::NO_DAEMON, "hopd closed the connection")),
    }
}

async fn run(args: Args) -> Result<(), Fail> {
    match args.cmd {
        Cmd::Status => {
            let mut s = connect(&args.socket).await?;
            api::write_json(&mut s, &Request::Status { v: API_VERSION })
                .await
                .map_err(io_fail)?;
            match next_reply(&mut s).await? {
                Reply::Status(v) => {
                    if args.json {
                        println!("{v}");
                    } else {
                        print_status(&v);
                    }
                    Ok(())
                }
                Reply::Error { code, message } => Err(reply_fail(code, message)),
                other => Err(fail(exit::PROTOCOL, format!("unexpected reply {other:?}"))),
            }
        }
        Cmd::List => {
            let mut s = connect(&args.socket).await?;
            api::write_json(&mut s, &Request::List { v: API_VERSION })
                .await
                .map_err(io_fail)?;
            match next_reply(&mut s).await? {
                Reply::Flows { outgoing } => {
                    if args.json {
                        for f in &outgoing {
                            println!("{}", serde_json::to_string(f).unwrap_or_default());
                        }
                    } else {
                        print_list(&outgoing);
                    }
                    Ok(())
                }
                Reply::Error { code, message } => Err(reply_fail(code, message)),
                other => Err(fail(exit::PROTOCOL, format!("unexpected reply {other:?}"))),
            }
        }
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Args::command(), "hop", &mut std::io::stdout());
            Ok(())
        }
        Cmd::Generate { dir } => {
            let written = hopd::cli::generate(&dir)
                .map_err(|e| fail(exit::USAGE, format!("{}: {e}", dir.display())))?;
            for p in written {
                println!("{}", p.display());
            }
            Ok(())
        }
        Cmd::Reload => {
            let mut s = connect(&args.socket).await?;
            api::write_json(&mut s, &Request::Reload { v: API_VERSION })
                .await
                .map_err(io_fail)?;
            match next_reply(&mut s).await? {
                Reply::Reloaded {
                    applied,
                    need_restart,
                } => {
                    if args.json {
                        println!(
                            "{}",
                            serde_json::json!({"ok": true, "applied": applied, "need_restart": need_restart})
                        );
                    } else {
                        if applied.is_empty() && need_restart.is_empty() {
                            println!("configuration re-read: nothing changed");
                        }
                        if !applied.is_empty() {
                            println!("applied: {}", applied.join(", "));
                        }
                        if !need_restart.is_empty() {
                            println!(
                                "changed, applied when hopd restarts: {}",
                                need_restart.join(", ")
                            );
                        }
                    }
                    Ok(())
                }
                Reply::Error { code, message } => Err(reply_fail(code, message)),
                other => Err(fail(exit::PROTOCOL, format!("unexpected reply {other:?}"))),
            }
        }
        Cmd::Cancel { flows } => {
            for flow in flows {
                let mut s = connect(&args.socket).await?;
                api::write_json(
                    &mut s,
                    &Request::Cancel {
                        v: API_VERSION,
                        flow,
                    },
                )
                .await
                .map_err(io_fail)?;
                match next_reply(&mut s).await? {
                    Reply::Cancelled { flow } => {
                        if args.json {
                            println!("{}", serde_json::json!({"ok": true, "cancelled": flow}));
                        } else {
                            println!("flow {flow} cancelled");
                        }
                    }
                    Reply::Error { code, message } => return Err(reply_fail(code, message)),
                    other => {
                        return Err(fail(exit::PROTOCOL, format!("unexpected reply {other:?}")))
                    }
                }
            }
            Ok(())
        }
        Cmd::Send {
            files,
            name,
            to,
            quiet,
            detach,
            lifetime,
        } => {
            // Every input is checked (and directories walked) before the first transfer.
            let mut items: Vec<(PathBuf, String)> = Vec::new();
            let mut stdin = None;
            for f in &files {
                if f.as_os_str() == "-" {
                    if stdin.is_some() {
                        return Err(fail(exit::USAGE, "`-` (standard input) given twice"));
                    }
                    let spooled = spool_stdin()?;
                    items.push((spooled.path.clone(), name.clone()));
                    stdin = Some(spooled);
                } else if f.is_dir() {
                    let before = items.len();
                    walk_dir(f, &dir_label(f)?, &mut items)?;
                    if items.len() == before {
                        return Err(fail(
                            exit::USAGE,
                            format!("{}: no files in this directory", f.display()),
                        ));
                    }
                } else if f.is_file() {
                    items.push((f.clone(), file_label(f)?));
                } else {
                    return Err(fail(
                        exit::USAGE,
                        format!(
                            "{}: no such file or directory (or not a regular file)",
                            f.display()
                        ),
                    ));
                }
            }
            for (path, label) in &items {
                let how = SendHow {
                    quiet: quiet || args.json,
                    json: args.json,
                    detach,
                    lifetime,
                    stdin: stdin.as_ref().is_some_and(|s| &s.path == path),
                };
                send_one(&args.socket, path, label, &to, &how).await?;
            }
            drop(stdin);
            Ok(())
        }
        Cmd::Recv {
            dir,
            count,
            exec,
            service,
        } => {
            let how = RecvHow {
                count,
                json: args.json,
                exec,
                service,
            };
            recv(&args.socket, &dir, &how).await
        }
    }
}

/// How `hop send` sends each file.
struct SendHow {
    quiet: bool,
    json: bool,
    detach: bool,
    lifetime: Option<std::time::Duration>,
    /// The file is standard input, spooled.
    stdin: bool,
}

/// A file's name as sent: its last component.
fn file_label(path: &Path) -> Result<String, Fail> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| {
            fail(
                exit::USAGE,
                format!("{}: not a valid file name", path.display()),
            )
        })
}

/// A directory's name as the first component of its files' names (`.` and `/` have none:
/// their files go to the top of the receiver's directory).
fn dir_label(path: &Path) -> Result<String, Fail> {
    let canonical = path
        .canonicalize()
        .map_err(|e| fail(exit::USAGE, format!("{}: {e}", path.display())))?;
    Ok(canonical
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .to_string())
}

/// Every regular file under `dir` (symbolic links are not followed), with its name as
/// sent: `prefix/relative/path`, in a stable order.
fn walk_dir(dir: &Path, prefix: &str, out: &mut Vec<(PathBuf, String)>) -> Result<(), Fail> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| fail(exit::USAGE, format!("{}: {e}", dir.display())))?
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let Some(n) = e.file_name().to_str().map(str::to_string) else {
            return Err(fail(
                exit::USAGE,
                format!("{}: not a valid file name", e.path().display()),
            ));
        };
        let label = if prefix.is_empty() {
            n
        } else {
            format!("{prefix}/{n}")
        };
        let kind = e
            .file_type()
            .map_err(|err| fail(exit::USAGE, format!("{}: {err}", e.path().display())))?;
        if kind.is_dir() {
            walk_dir(&e.path(), &label, out)?;
        } else if kind.is_file() {
            out.push((e.path(), label));
        }
    }
    Ok(())
}

/// Standard input, spooled to a temporary file: the daemon takes a file of known size.
struct Spooled {
    path: PathBuf,
}

impl Drop for Spooled {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn spool_stdin() -> Result<Spooled, Fail> {
    let path = std::env::temp_dir().join(format!(
        "hop-stdin-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let spooled = Spooled { path };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&spooled.path)
        .map_err(|e| fail(exit::USAGE, format!("{}: {e}", spooled.path.display())))?;
    std::io::copy(&mut std::io::stdin().lock(), &mut f).map_err(|e| {
        let code = if e.raw_os_error() == Some(libc::ENOSPC) {
            exit::NO_SPACE
        } else {
            exit::USAGE
        };
        fail(code, format!("reading standard input: {e}"))
    })?;
    Ok(spooled)
}

async fn send_one(
    socket: &Path,
    path: &Path,
    label: &str,
    dest: &(u32, Option<String>),
    how: &SendHow,
) -> Result<(), Fail> {
    let (to, service) = (dest.0, &dest.1);
    let SendHow {
        quiet,
        json,
        detach,
        lifetime,
        ..
    } = *how;
    let file = std::fs::File::open(path)
        .map_err(|e| fail(exit::USAGE, format!("{}: {e}", path.display())))?;
    let size = file
        .metadata()
        .map_err(|e| fail(exit::USAGE, format!("{}: {e}", path.display())))?
        .len();
    let name = label.to_string();
    // Standard input is shown by the name it is sent under, a file by its path.
    let shown = if how.stdin {
        format!("{label} (standard input)")
    } else {
        path.display().to_string()
    };
    let s = connect(socket).await?;
    let (mut rd, mut wr) = s.into_split();
    api::write_json(
        &mut wr,
        &Request::Send {
            v: API_VERSION,
            to,
            name: name.clone(),
            size,
            detach,
            lifetime_s: lifetime.map(|l| l.as_secs().max(1)),
            service: service.clone(),
        },
    )
    .await
    .map_err(io_fail)?;
    let first = match api::read_frame(&mut rd).await.map_err(io_fail)? {
        Some(f) => api::parse_reply(&f).map_err(|e| fail(exit::PROTOCOL, e.to_string()))?,
        None => return Err(fail(exit::NO_DAEMON, "hopd closed the connection")),
    };
    let flow = match first {
        Reply::Accepted { flow } => flow,
        Reply::Error { code, message } => return Err(reply_fail(code, message)),
        other => return Err(fail(exit::PROTOCOL, format!("unexpected reply {other:?}"))),
    };
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(size);
        b.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b.set_message(name.clone());
        b
    };
    drop(file);
    // Stream the file in data frames, then the empty end frame.
    let path_owned = path.to_path_buf();
    let sender = tokio::spawn(async move {
        let mut file = tokio::fs::File::open(&path_owned).await?;
        let mut buf = vec![0u8; DATA_CHUNK];
        let mut left = size;
        use tokio::io::AsyncReadExt;
        while left > 0 {
            let n = file
                .read(&mut buf[..(left as usize).min(DATA_CHUNK)])
                .await?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "file shrank while being sent",
                ));
            }
            api::write_frame(&mut wr, &buf[..n]).await?;
            left -= n as u64;
        }
        api::write_frame(&mut wr, &[]).await?;
        wr.flush().await?;
        // Keep the write half open until the daemon answers.
        Ok::<_, std::io::Error>(wr)
    });
    let started = std::time::Instant::now();
    let mut e2e_reported = false;
    let result = loop {
        let frame = match api::read_frame(&mut rd).await {
            Ok(Some(f)) => f,
            Ok(None) => {
                break Err(fail(
                    exit::NO_DAEMON,
                    "hopd closed the connection before the transfer completed",
                ))
            }
            Err(e) => break Err(io_fail(e)),
        };
        match api::parse_reply(&frame) {
            // The bar follows what the destination acknowledged when the transport reports it
            // (Hop), else what the daemon handed to the transport.
            Ok(Reply::Progress { bytes, acked }) => {
                if acked.is_some() {
                    e2e_reported = true;
                }
                match acked {
                    Some(a) => bar.set_position(a.min(size)),
                    None if !e2e_reported => bar.set_position(bytes.min(size)),
                    None => {}
                }
            }
            Ok(Reply::Complete { bytes, .. }) => {
                bar.finish();
                break Ok((bytes, false));
            }
            Ok(Reply::Waiting { reason }) => {
                let line = match &reason {
                    Some(r) => format!("{shown}: {r}"),
                    None => format!("{shown}: moving again"),
                };
                if json {
                    // On stderr: stdout carries one JSON result per file, for scripts.
                    eprintln!(
                        "{}",
                        serde_json::json!({"waiting": reason.is_some(), "file": shown, "reason": reason})
                    );
                } else if quiet {
                    eprintln!("hop: {line}");
                } else {
                    bar.println(line);
                }
            }
            Ok(Reply::Queued { bytes, .. }) if detach => {
                bar.finish();
                break Ok((bytes, true));
            }
            Ok(Reply::Error { code, message }) => break Err(reply_fail(code, message)),
            Ok(other) => break Err(fail(exit::PROTOCOL, format!("unexpected reply {other:?}"))),
            Err(e) => break Err(fail(exit::PROTOCOL, format!("bad reply from hopd: {e}"))),
        }
    };
    sender.abort();
    bar.finish_and_clear();
    let (bytes, queued) = result?;
    let secs = started.elapsed().as_secs_f64();
    let bps = if secs > 0.0 {
        bytes as f64 * 8.0 / secs
    } else {
        0.0
    };
    if json {
        println!(
            "{}",
            serde_json::json!({"ok": true, "file": shown, "to": to, "flow": flow, "bytes": bytes, "queued": queued, "seconds": (secs * 1000.0).round() / 1000.0, "bits_per_second": bps.round()})
        );
    } else if queued {
        if !quiet {
            println!(
                "{shown}: {bytes} bytes queued for node {to} (flow {flow}; `hop list`, `hop cancel {flow}`)"
            );
        }
    } else if !quiet {
        println!(
            "{shown}: {} delivered to node {to} in {} ({}; flow {flow})",
            human_bytes(bytes),
            human_secs(secs),
            human_rate(bps)
        );
    }
    Ok(())
}

/// How `hop recv` receives.
struct RecvHow {
    count: Option<u64>,
    json: bool,
    exec: Option<String>,
    service: Option<String>,
}

async fn recv(socket: &Path, dir: &Path, how: &RecvHow) -> Result<(), Fail> {
    let (count, json, exec) = (how.count, how.json, how.exec.as_deref());
    std::fs::create_dir_all(dir)
        .map_err(|e| fail(exit::USAGE, format!("cannot create {}: {e}", dir.display())))?;
    let mut s = connect(socket).await?;
    let req = Request::Recv {
        v: API_VERSION,
        service: how.service.clone(),
    };
    api::write_json(&mut s, &req).await.map_err(io_fail)?;
    let mut got = 0u64;
    while count.is_none_or(|c| got < c) {
        let (flow, from, name, size, blake3) = match next_reply(&mut s).await? {
            Reply::File {
                flow,
                from,
                name,
                size,
                blake3,
            } => (flow, from, name, size, blake3),
            Reply::Error { code, message } => return Err(reply_fail(code, message)),
            other => return Err(fail(exit::PROTOCOL, format!("unexpected reply {other:?}"))),
        };
        let name = hopd::flowfmt::sanitize_name(&name)
            .ok_or_else(|| fail(exit::PROTOCOL, format!("bad file name from hopd: {name}")))?;
        // A name with directories (a file sent from a directory) lands in them.
        let (sub, base) = match name.rsplit_once('/') {
            Some((d, b)) => (dir.join(d), b.to_string()),
            None => (dir.to_path_buf(), name.clone()),
        };
        std::fs::create_dir_all(&sub)
            .map_err(|e| fail(exit::USAGE, format!("cannot create {}: {e}", sub.display())))?;
        let tmp = sub.join(format!(".{base}.{flow}.part"));
        let mut out = std::fs::File::create(&tmp).map_err(|e| {
            fail(
                exit::NO_SPACE,
                format!("cannot write {}: {e}", tmp.display()),
            )
        })?;
        let mut hasher = blake3::Hasher::new();
        let mut n = 0u64;
        loop {
            let Some(frame) = api::read_frame(&mut s).await.map_err(io_fail)? else {
                let _ = std::fs::remove_file(&tmp);
                return Err(fail(exit::NO_DAEMON, "hopd closed the connection mid-file"));
            };
            if frame.is_empty() {
                break;
            }
            hasher.update(&frame);
            n += frame.len() as u64;
            if let Err(e) = out.write_all(&frame) {
                let _ = std::fs::remove_file(&tmp);
                let code = if e.raw_os_error() == Some(libc::ENOSPC) {
                    exit::NO_SPACE
                } else {
                    exit::USAGE
                };
                return Err(fail(code, format!("cannot write {}: {e}", tmp.display())));
            }
        }
        let digest = hopd::flowfmt::hex(hasher.finalize().as_bytes());
        if n != size || digest != blake3 {
            let _ = std::fs::remove_file(&tmp);
            return Err(fail(
                exit::PROTOCOL,
                format!("{name}: integrity check failed ({n} of {size} bytes, BLAKE3 {digest} != {blake3})"),
            ));
        }
        out.sync_all().map_err(|e| {
            fail(
                exit::NO_SPACE,
                format!("cannot write {}: {e}", tmp.display()),
            )
        })?;
        drop(out);
        let dest = hopd::flowfmt::place_received(&tmp, &sub, &base, &flow).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            fail(
                exit::USAGE,
                format!("cannot move {name} into {}: {e}", dir.display()),
            )
        })?;
        if let Ok(d) = std::fs::File::open(&sub) {
            let _ = d.sync_all();
        }
        api::write_json(
            &mut s,
            &Request::Ack {
                v: API_VERSION,
                flow: flow.clone(),
            },
        )
        .await
        .map_err(io_fail)?;
        got += 1;
        if json {
            println!(
                "{}",
                serde_json::json!({"ok": true, "file": dest.display().to_string(), "from": from, "flow": flow, "bytes": size, "blake3": blake3})
            );
        } else {
            println!("{}: {size} bytes from node {from}", dest.display());
        }
        if let Some(cmd) = exec {
            run_hook(cmd, &dest, &name, from, &flow, size, &blake3).await;
        }
    }
    Ok(())
}

/// The on-arrival hook of `hop recv --exec`: the file's facts go in the environment (not in
/// the command line, so a file name cannot inject shell syntax). Its failure is reported on
/// stderr; the file was already stored and acknowledged.
async fn run_hook(
    cmd: &str,
    file: &Path,
    name: &str,
    from: u32,
    flow: &str,
    size: u64,
    blake3: &str,
) {
    let status = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(cmd)
        .env("HOP_FILE", file)
        .env("HOP_NAME", name)
        .env("HOP_FROM", from.to_string())
        .env("HOP_FLOW", flow)
        .env("HOP_SIZE", size.to_string())
        .env("HOP_BLAKE3", blake3)
        .stdin(std::process::Stdio::null())
        .status()
        .await;
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => eprintln!(
            "hop: --exec for {}: the command ended with {s}",
            file.display()
        ),
        Err(e) => eprintln!(
            "hop: --exec for {}: cannot run /bin/sh: {e}",
            file.display()
        ),
    }
}

fn print_status(v: &serde_json::Value) {
    let g = |k: &str| v.get(k).cloned().unwrap_or_default();
    let u = |x: &serde_json::Value| x.as_u64().unwrap_or(0);
    println!(
        "hop {} on node {}, listening on {}, up {}",
        env!("CARGO_PKG_VERSION"),
        g("node_id"),
        g("listen").as_str().unwrap_or("?"),
        human_age(u(&g("uptime_s")))
    );
    println!("neighbours:");
    for n in g("neighbours").as_array().into_iter().flatten() {
        let heard = match n.get("last_heard_ms").and_then(|x| x.as_u64()) {
            Some(ms) if ms < 10_000 => format!("heard {:.1} s ago", ms as f64 / 1000.0),
            Some(ms) => format!("heard {} ago", human_age(ms / 1000)),
            None => "never heard (check its hopd, address, port, firewall, mesh key)".into(),
        };
        let how = if n.get("discovered").and_then(|x| x.as_bool()) == Some(true) {
            " (discovered)"
        } else {
            ""
        };
        println!(
            "  {:>6}  {:<24} {heard}{how}",
            n.get("id").cloned().unwrap_or_default(),
            n.get("address").and_then(|x| x.as_str()).unwrap_or("?")
        );
    }
    let outgoing: Vec<api::OutgoingFlow> = g("outgoing")
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| serde_json::from_value(f.clone()).ok())
        .collect();
    println!("outgoing transfers: {}", outgoing.len());
    if !outgoing.is_empty() {
        print_list(&outgoing);
    }
    let incoming = g("incoming");
    let incoming = incoming.as_array().map(Vec::as_slice).unwrap_or(&[]);
    println!("incoming transfers: {}", incoming.len());
    for f in incoming {
        println!(
            "  {:<14} {:>10} delivered, {:>10} received",
            f.get("flow").and_then(|x| x.as_str()).unwrap_or("?"),
            human_bytes(u(&f["bytes"])),
            human_bytes(u(&f["received_bytes"]))
        );
    }
    println!(
        "storage: {} of {} used; {} file(s) waiting in the inbox for `hop recv`",
        human_bytes(u(&g("storage_bytes"))),
        human_bytes(u(&g("storage_limit_bytes"))),
        g("inbox")
    );
    let c = g("custody");
    if c.is_object() {
        println!(
            "custody: {} block(s), {} held for neighbours ({} stored in all; refused for lack of room: {})",
            u(&c["blocks"]),
            human_bytes(u(&c["bytes"])),
            u(&c["stored_total"]),
            u(&c["full_total"])
        );
    }
    if let Some(line) = disk_waits(&g("custody"), &g("spool")) {
        println!("{line}");
    }
    if let Some(c) = g("counters").as_object() {
        let nonzero: Vec<_> = c.iter().filter(|(_, val)| u(val) > 0).collect();
        println!("counters (non-zero; all in --json):");
        for (k, val) in nonzero {
            println!("  {k:<28} {val}");
        }
    }
    for t in v
        .pointer("/node/transports")
        .and_then(|x| x.as_array())
        .into_iter()
        .flatten()
    {
        let name = t.get(0).and_then(|x| x.as_str()).unwrap_or("?");
        if let Some(e) = t
            .get(1)
            .and_then(|s| s.get("extra"))
            .and_then(|e| e.as_object())
        {
            for line in time_shares(e) {
                println!("{name} {line}");
            }
        }
    }
}

/// Hop's time-in-state counters (docs/hopd.md, "Metrics") as shares of the time they cover:
/// what the node's sending side did since it started, and how long it withheld its upstream
/// neighbours' BSYNs. Nothing when the transport has no such counters.
fn time_shares(extra: &serde_json::Map<String, serde_json::Value>) -> Vec<String> {
    const STATES: [(&str, &str); 6] = [
        ("time_ready_ms", "ready for the link"),
        ("time_feed_ms", "fed from upstream"),
        ("time_round_ms", "waiting for a BACK"),
        ("time_silent_ms", "next hop silent"),
        ("time_held_ms", "held back"),
        ("time_idle_ms", "nothing to send"),
    ];
    const WITHHELD: [(&str, &str); 2] = [
        ("time_withholding_bp_ms", "for backpressure"),
        ("time_withholding_aw_ms", "for ack withholding"),
    ];
    let ms = |k: &str| extra.get(k).and_then(|v| v.as_u64());
    let Some(spent) = STATES
        .iter()
        .map(|(k, _)| ms(k))
        .collect::<Option<Vec<u64>>>()
    else {
        return Vec::new();
    };
    let total: u64 = spent.iter().sum();
    if total == 0 {
        return Vec::new();
    }
    let pct = |v: u64| format!("{:.0} %", 100.0 * v as f64 / total as f64);
    let states: Vec<String> = STATES
        .iter()
        .zip(&spent)
        .map(|((_, name), v)| format!("{name} {}", pct(*v)))
        .collect();
    let mut out = vec![format!(
        "sending side over {:.1} s: {}",
        total as f64 / 1000.0,
        states.join(", ")
    )];
    let withheld: Vec<String> = WITHHELD
        .iter()
        .filter_map(|(k, name)| ms(k).map(|v| format!("{name} {}", pct(v))))
        .collect();
    if !withheld.is_empty() {
        out.push(format!("withheld upstream BSYNs: {}", withheld.join(", ")));
    }
    out
}

/// How long the disk held the node up: custody writes (from the hand-over to the writer
/// thread until durable: the completing BACK waits for it) and the destination's spool writes
/// (on the event loop), as counts with mean and longest time. Nothing before the first.
fn disk_waits(custody: &serde_json::Value, spool: &serde_json::Value) -> Option<String> {
    let part = |v: &serde_json::Value, count: &str, sum: &str, max: &str, what: &str| {
        let n = v.get(count).and_then(|x| x.as_u64()).filter(|n| *n > 0)?;
        let total = v.get(sum).and_then(|x| x.as_u64()).unwrap_or(0);
        let longest = v.get(max).and_then(|x| x.as_u64()).unwrap_or(0);
        Some(format!(
            "{what} {n}, mean {:.1} ms (longest {:.1} ms)",
            total as f64 / n as f64 / 1000.0,
            longest as f64 / 1000.0
        ))
    };
    let parts: Vec<String> = [
        part(
            custody,
            "writes_timed",
            "write_wait_us",
            "write_wait_max_us",
            "custody writes",
        ),
        part(
            spool,
            "deliveries_timed",
            "deliver_us",
            "deliver_max_us",
            "spool writes",
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| format!("disk: {}", parts.join("; ")))
}

/// A size for people: bytes below 10 kB, then kB, MB, GB with one decimal.
fn human_bytes(n: u64) -> String {
    const UNITS: [(&str, f64); 3] = [("GB", 1e9), ("MB", 1e6), ("kB", 1e3)];
    for (unit, scale) in UNITS {
        if n as f64 >= scale && (unit != "kB" || n >= 10_000) {
            return format!("{:.1} {unit}", n as f64 / scale);
        }
    }
    format!("{n} B")
}

/// A duration in seconds for people: 0.42 s, 12.3 s, then as `human_age`.
fn human_secs(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.2} s")
    } else if s < 60.0 {
        format!("{s:.1} s")
    } else {
        human_age(s.round() as u64)
    }
}

/// A rate for people: kbit/s below 1 Mbit/s, then Mbit/s.
fn human_rate(bps: f64) -> String {
    if bps < 1e6 {
        format!("{:.1} kbit/s", bps / 1e3)
    } else {
        format!("{:.2} Mbit/s", bps / 1e6)
    }
}

/// An age for people: 42s, 3m05s, 2h07m, 3d04h.
fn human_age(s: u64) -> String {
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

fn print_list(outgoing: &[api::OutgoingFlow]) {
    if outgoing.is_empty() {
        println!("no outgoing transfers");
        return;
    }
    // Per destination: how many, how much, and the oldest (a destination that is away
    // shows as a queue that only grows).
    let mut per: std::collections::BTreeMap<u32, (usize, u64, u64, u64)> = Default::default();
    for f in outgoing {
        let e = per.entry(f.to).or_default();
        e.0 += 1;
        e.1 += f.size;
        e.2 += f.bytes_acked.min(f.size);
        e.3 = e.3.max(f.age_s);
    }
    for (to, (n, size, acked, oldest)) in &per {
        println!(
            "to node {to}: {n} transfer(s), {} ({} acknowledged), oldest {}",
            human_bytes(*size),
            human_bytes(*acked),
            human_age(*oldest)
        );
    }
    println!(
        "{:<14} {:>6} {:>10} {:>10} {:>10} {:>8} {:>8}  {:<9} name",
        "flow", "to", "size", "handed", "acked", "age", "expires", "client"
    );
    for f in outgoing {
        println!(
            "{:<14} {:>6} {:>10} {:>10} {:>10} {:>8} {:>8}  {:<9} {}",
            f.flow,
            f.to,
            human_bytes(f.size),
            human_bytes(f.bytes_accepted.min(f.size)),
            human_bytes(f.bytes_acked.min(f.size)),
            human_age(f.age_s),
            f.expires_in_s.map_or("-".into(), human_age),
            if f.attached { "waiting" } else { "detached" },
            f.name
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{disk_waits, time_shares};

    #[test]
    fn disk_waits_are_means_per_write() {
        let custody = serde_json::json!({"writes_timed": 4, "write_wait_us": 10_000, "write_wait_max_us": 6_500});
        let spool =
            serde_json::json!({"deliveries_timed": 0, "deliver_us": 0, "deliver_max_us": 0});
        assert_eq!(
            disk_waits(&custody, &spool).as_deref(),
            Some("disk: custody writes 4, mean 2.5 ms (longest 6.5 ms)")
        );
        let spool = serde_json::json!({"deliveries_timed": 2, "deliver_us": 3_000, "deliver_max_us": 2_000});
        assert_eq!(
            disk_waits(&custody, &spool).as_deref(),
            Some("disk: custody writes 4, mean 2.5 ms (longest 6.5 ms); spool writes 2, mean 1.5 ms (longest 2.0 ms)")
        );
        // nothing written yet, or an older hopd without the counters: no line
        assert_eq!(
            disk_waits(&serde_json::json!({}), &serde_json::Value::Null),
            None
        );
    }

    #[test]
    fn time_shares_are_parts_of_the_time_counted() {
        let e = serde_json::json!({
            "time_ready_ms": 500, "time_feed_ms": 250, "time_round_ms": 0,
            "time_silent_ms": 250, "time_held_ms": 0, "time_idle_ms": 1000,
            "time_withholding_bp_ms": 1000, "time_withholding_aw_ms": 0, "acks_withheld": 7
        });
        let lines = time_shares(e.as_object().unwrap());
        assert_eq!(
            lines,
            vec![
                "sending side over 2.0 s: ready for the link 25 %, fed from upstream 12 %, \
                 waiting for a BACK 0 %, next hop silent 12 %, held back 0 %, nothing to send 50 %"
                    .to_string(),
                "withheld upstream BSYNs: for backpressure 50 %, for ack withholding 0 %"
                    .to_string(),
            ]
        );
        // another transport's extras, or none counted yet: nothing
        let e = serde_json::json!({"retransmissions": 3});
        assert!(time_shares(e.as_object().unwrap()).is_empty());
    }

    #[test]
    fn sizes_and_ages_for_people() {
        assert_eq!(super::human_bytes(999), "999 B");
        assert_eq!(super::human_bytes(300_000), "300.0 kB");
        assert_eq!(super::human_bytes(25_000_000), "25.0 MB");
        assert_eq!(super::human_bytes(4_294_967_296), "4.3 GB");
        assert_eq!(super::human_bytes(9_999), "9999 B");
        assert_eq!(super::human_age(42), "42s");
        assert_eq!(super::human_age(185), "3m05s");
        assert_eq!(super::human_age(7620), "2h07m");
        assert_eq!(super::human_age(3 * 86_400 + 4 * 3600), "3d04h");
    }
}
