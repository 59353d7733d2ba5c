//! `hop send`: files, directories and standard input, one transfer each.

use std::path::{Path, PathBuf};

use hopd::api::{self, exit, Reply, Request, API_VERSION, DATA_CHUNK};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::io::AsyncWriteExt;

use crate::show::{human_bytes, human_rate, human_secs};
use crate::{connect, fail, io_fail, reply_fail, Fail};

/// How `hop send` sends each file.
pub(crate) struct SendHow {
    pub(crate) quiet: bool,
    pub(crate) json: bool,
    pub(crate) detach: bool,
    pub(crate) lifetime: Option<std::time::Duration>,
    pub(crate) priority: hopd::api::Priority,
    /// The file is standard input, spooled.
    pub(crate) stdin: bool,
}

/// A file's name as sent: its last component.
pub(crate) fn file_label(path: &Path) -> Result<String, Fail> {
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
pub(crate) fn dir_label(path: &Path) -> Result<String, Fail> {
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
pub(crate) fn walk_dir(
    dir: &Path,
    prefix: &str,
    out: &mut Vec<(PathBuf, String)>,
) -> Result<(), Fail> {
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
pub(crate) struct Spooled {
    pub(crate) path: PathBuf,
}

impl Drop for Spooled {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

pub(crate) fn spool_stdin() -> Result<Spooled, Fail> {
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

pub(crate) async fn send_one(
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
        priority,
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
            priority: (priority != hopd::api::Priority::Normal).then_some(priority),
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
