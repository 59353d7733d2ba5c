//! `hop recv`: files into a directory, each verified, placed atomically and acknowledged;
//! the on-arrival hook.

use std::io::Write;
use std::path::Path;

use hopd::api::{self, exit, Reply, Request, API_VERSION};

use crate::{connect, fail, io_fail, next_reply, reply_fail, Fail};

/// How `hop recv` receives.
pub(crate) struct RecvHow {
    pub(crate) count: Option<u64>,
    pub(crate) json: bool,
    pub(crate) exec: Option<String>,
    pub(crate) service: Option<String>,
}

pub(crate) async fn recv(socket: &Path, dir: &Path, how: &RecvHow) -> Result<(), Fail> {
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
pub(crate) async fn run_hook(
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
