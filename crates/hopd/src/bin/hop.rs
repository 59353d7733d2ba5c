//! hop: send and receive files through the local hopd, and show its status.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[path = "hop/recv.rs"]
mod recv;
#[path = "hop/send.rs"]
mod send;
#[path = "hop/show.rs"]
mod show;

use clap::Parser;
use hopd::api::{self, exit, ErrorCode, Reply, Request, API_VERSION};
use hopd::cli::{Args, Cmd};
use recv::{recv, RecvHow};
use send::{dir_label, file_label, send_one, spool_stdin, walk_dir, SendHow};
use show::{print_list, print_status};
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

/// A members file's text; a missing file is an empty one.
/// The host's name (for a members file), or "" if it cannot be read.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

fn read_members_text(p: &Path) -> Result<String, Fail> {
    match std::fs::read_to_string(p) {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(fail(
            exit::FAILED,
            format!("cannot read {}: {e}", p.display()),
        )),
    }
}

/// After a members file changed: make a running hopd re-read its configuration.
async fn reload_if_running(socket: &Path) -> Result<(), Fail> {
    let Ok(mut s) = UnixStream::connect(socket).await else {
        println!("hopd is not running here: it reads the file when it starts");
        return Ok(());
    };
    api::write_json(&mut s, &Request::Reload { v: API_VERSION })
        .await
        .map_err(io_fail)?;
    match next_reply(&mut s).await? {
        Reply::Reloaded { .. } => {
            println!("hopd re-read its configuration");
            Ok(())
        }
        Reply::Error { code, message } => Err(reply_fail(code, message)),
        other => Err(fail(exit::PROTOCOL, format!("unexpected reply {other:?}"))),
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
                Reply::Flows { outgoing, held } => {
                    if args.json {
                        for f in &outgoing {
                            println!("{}", serde_json::to_string(f).unwrap_or_default());
                        }
                    } else {
                        print_list(&outgoing, &held);
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
        Cmd::Keygen { out, members, name } => {
            use hopd::identity;
            let (key, created) = if out.exists() {
                let k = identity::read_node_key(&out).map_err(|e| fail(exit::FAILED, e))?;
                (k, false)
            } else {
                (
                    identity::write_new_node_key(&out).map_err(|e| fail(exit::FAILED, e))?,
                    true,
                )
            };
            let public = identity::hex(key.public());
            let mut admitted = false;
            if let Some(m) = &members {
                let name = name.clone().unwrap_or_else(host_name);
                let text = read_members_text(m)?;
                let new = identity::admit(&text, key.public(), &name);
                if new != text {
                    hopd::durable::write_durably(m, new.as_bytes())
                        .map_err(|e| fail(exit::FAILED, format!("writing {}: {e}", m.display())))?;
                    admitted = true;
                }
            }
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"ok": true, "created": created, "public_key": public, "node_id": key.node_id(), "admitted": admitted})
                );
            } else {
                if !created {
                    println!("{} exists; kept", out.display());
                }
                println!("public key: {public}");
                println!("node id:    {}", key.node_id());
                if let (true, Some(m)) = (admitted, &members) {
                    println!("admitted to {}", m.display());
                }
                if created {
                    println!(
                        "set [security] node_key_file = \"{}\"; admit the node on each member with `hop admit {public}`",
                        out.display()
                    );
                }
            }
            Ok(())
        }
        Cmd::Admit { key, name, members } => {
            let k = hopd::config::parse_hex_key(&key).ok_or_else(|| {
                fail(
                    exit::USAGE,
                    format!(
                        "`{key}` is not a public key: 64 hex digits, as `hop keygen` prints them"
                    ),
                )
            })?;
            let text = read_members_text(&members)?;
            let new = hopd::identity::admit(&text, &k, &name);
            let changed = new != text;
            if changed {
                hopd::durable::write_durably(&members, new.as_bytes()).map_err(|e| {
                    fail(exit::FAILED, format!("writing {}: {e}", members.display()))
                })?;
            }
            println!(
                "{} node {} ({})",
                if changed {
                    "admitted"
                } else {
                    "already a member:"
                },
                hopd::identity::id_of(&k),
                members.display()
            );
            reload_if_running(&args.socket).await
        }
        Cmd::Revoke { key, members } => {
            let k = hopd::config::parse_hex_key(&key).ok_or_else(|| {
                fail(
                    exit::USAGE,
                    format!("`{key}` is not a public key: 64 hex digits"),
                )
            })?;
            let text = read_members_text(&members)?;
            let (new, found) = hopd::identity::revoke(&text, &k);
            if !found {
                return Err(fail(
                    exit::FAILED,
                    format!("{} does not list that key", members.display()),
                ));
            }
            hopd::durable::write_durably(&members, new.as_bytes())
                .map_err(|e| fail(exit::FAILED, format!("writing {}: {e}", members.display())))?;
            println!(
                "revoked node {} ({}); after a revocation, change the mesh key: the node may still hold it",
                hopd::identity::id_of(&k),
                members.display()
            );
            reload_if_running(&args.socket).await
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
            priority,
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
                    priority,
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
