//! The local API server (Unix socket) and the Prometheus metrics endpoint.

use std::collections::VecDeque;
use std::io::SeekFrom;
use std::path::Path;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use crate::api::{self, ErrorCode, Reply, Request, API_VERSION, DATA_CHUNK};
use crate::daemon::cmd::{Cmd, FlowUpdate, InboxEntry, Opened};
use crate::flowfmt::{sanitize_name, FlowHeader};

/// Chunks a sending client may have queued in the core before it waits.
const SEND_WINDOW: usize = 4;

/// Refuse to start beside a running hopd that answers on the API socket `path` (it would
/// share its storage); called before anything else is opened.
pub fn check_api_free(path: &Path) -> std::io::Result<()> {
    if path.exists() && std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("{} is in use by a running hopd", path.display()),
        ));
    }
    Ok(())
}

/// Bind the API socket, replacing a stale socket file. With `group`, the socket belongs to
/// that group with mode 0660, so its members can use `hop` (connecting needs write access).
pub fn bind_api(path: &Path, group: Option<u32>) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    check_api_free(path)?;
    if path.exists() {
        std::fs::remove_file(path)?;
    }
    let l = UnixListener::bind(path)?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("giving {} to group {gid}: {e}", path.display()),
            )
        })?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    }
    Ok(l)
}

pub async fn serve_api(listener: UnixListener, cmds: mpsc::Sender<Cmd>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let cmds = cmds.clone();
                tokio::spawn(async move {
                    if let Err(e) = client(stream, cmds).await {
                        debug!(error = %e, "API client ended");
                    }
                });
            }
            Err(e) => {
                warn!(error = %e, "API accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

async fn error(s: &mut UnixStream, code: ErrorCode, message: String) -> std::io::Result<()> {
    api::write_json(s, &Reply::Error { code, message }).await
}

fn closed() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "daemon is stopping")
}

async fn client(mut s: UnixStream, cmds: mpsc::Sender<Cmd>) -> std::io::Result<()> {
    let Some(frame) = api::read_frame(&mut s).await? else {
        return Ok(());
    };
    let req: Request = match serde_json::from_slice(&frame) {
        Ok(r) => r,
        Err(e) => return error(&mut s, ErrorCode::BadRequest, format!("bad request: {e}")).await,
    };
    let v = match &req {
        Request::Send { v, .. }
        | Request::Recv { v, .. }
        | Request::Ack { v, .. }
        | Request::Status { v }
        | Request::List { v }
        | Request::Reload { v }
        | Request::Events { v }
        | Request::Cancel { v, .. } => *v,
    };
    if v != API_VERSION {
        return error(
            &mut s,
            ErrorCode::BadRequest,
            format!("API version {v} is not supported (this daemon speaks {API_VERSION})"),
        )
        .await;
    }
    match req {
        Request::Status { .. } => {
            let (tx, rx) = oneshot::channel();
            cmds.send(Cmd::Status { reply: tx })
                .await
                .map_err(|_| closed())?;
            let v = rx.await.map_err(|_| closed())?;
            api::write_json(&mut s, &Reply::Status(v)).await
        }
        Request::Send {
            to,
            name,
            size,
            detach,
            lifetime_s,
            service,
            priority,
            ..
        } => {
            let req = SendReq {
                to,
                name,
                size,
                detach,
                lifetime: lifetime_s.map(std::time::Duration::from_secs),
                service,
                priority: priority.unwrap_or_default(),
            };
            send(s, cmds, req).await
        }
        Request::List { .. } => {
            let (tx, rx) = oneshot::channel();
            cmds.send(Cmd::List { reply: tx })
                .await
                .map_err(|_| closed())?;
            let (outgoing, held) = rx.await.map_err(|_| closed())?;
            api::write_json(&mut s, &Reply::Flows { outgoing, held }).await
        }
        Request::Reload { .. } => {
            let (tx, rx) = oneshot::channel();
            cmds.send(Cmd::Reload { reply: Some(tx) })
                .await
                .map_err(|_| closed())?;
            match rx.await.map_err(|_| closed())? {
                Ok(r) => {
                    let reply = Reply::Reloaded {
                        applied: r.applied,
                        need_restart: r.need_restart,
                    };
                    api::write_json(&mut s, &reply).await
                }
                Err(msg) => error(&mut s, ErrorCode::BadRequest, msg).await,
            }
        }
        Request::Cancel { flow, .. } => {
            let (tx, rx) = oneshot::channel();
            cmds.send(Cmd::Cancel {
                flow: flow.clone(),
                reply: tx,
            })
            .await
            .map_err(|_| closed())?;
            match rx.await.map_err(|_| closed())? {
                Ok(()) => api::write_json(&mut s, &Reply::Cancelled { flow }).await,
                Err(msg) => error(&mut s, ErrorCode::BadRequest, msg).await,
            }
        }
        Request::Recv { service, .. } => recv(s, cmds, service).await,
        Request::Events { .. } => events(s, cmds).await,
        Request::Ack { .. } => {
            error(
                &mut s,
                ErrorCode::BadRequest,
                "ack is only valid after a file".into(),
            )
            .await
        }
    }
}

/// The event stream of `events`: the same events as the HTTP API's `/v1/events`, one control
/// frame each, until the client closes its side (anything it sends is ignored).
async fn events(mut s: UnixStream, cmds: mpsc::Sender<Cmd>) -> std::io::Result<()> {
    use tokio::sync::broadcast::error::RecvError;
    let (tx, rx) = oneshot::channel();
    cmds.send(Cmd::Events { reply: tx })
        .await
        .map_err(|_| closed())?;
    let mut events = rx.await.map_err(|_| closed())?;
    let mut scratch = [0u8; 256];
    loop {
        let v = tokio::select! {
            e = events.recv() => match e {
                Ok(v) => v,
                Err(RecvError::Lagged(n)) => serde_json::json!({"event": "lagged", "missed": n}),
                Err(RecvError::Closed) => return Ok(()),
            },
            n = s.read(&mut scratch) => match n {
                Ok(0) | Err(_) => return Ok(()),
                Ok(_) => continue,
            },
        };
        api::write_json(&mut s, &v).await?;
    }
}

/// Aborts a sending client's flow when dropped armed (see `send`).
struct AbortOnDrop {
    flow: hop_proto::FlowKey,
    cmds: Option<mpsc::Sender<Cmd>>,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        let Some(cmds) = self.cmds.take() else {
            return;
        };
        let abort = Cmd::Abort { flow: self.flow };
        if let Err(mpsc::error::TrySendError::Full(abort)) = cmds.try_send(abort) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = cmds.send(abort).await;
                });
            }
        }
    }
}

/// Resolves once the client has closed its end of the socket (it was interrupted, or
/// killed): a client keeps its end open until the daemon's last reply. Data it sent before
/// closing may still wait unread, so readability alone proves nothing; the closed state is
/// looked at again every 250 ms while data waits.
async fn client_gone(s: &UnixStream) {
    loop {
        match s.ready(tokio::io::Interest::READABLE).await {
            Ok(r) if r.is_read_closed() => return,
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(250)).await,
            Err(_) => return,
        }
    }
}

/// Why a requested service name is refused, if it is.
fn bad_service(service: Option<&str>) -> Option<String> {
    let sv = service.filter(|s| !crate::flowfmt::valid_service(s))?;
    Some(format!(
        "bad service name `{sv}`: 1-64 of a-z, 0-9, `.`, `_`, `-`"
    ))
}

/// A sending client's hand-overs still in the core, and the file bytes handed so far.
struct Window<'a> {
    pending: &'a mut VecDeque<oneshot::Receiver<()>>,
    sizes: &'a mut VecDeque<u64>,
    handed: &'a mut u64,
}

impl Window<'_> {
    /// Wait for hand-overs until at most `keep` are outstanding, reporting progress after
    /// each. False if the client went away meanwhile.
    async fn drain(
        &mut self,
        s: &mut UnixStream,
        keep: usize,
        e2e: Option<u64>,
    ) -> std::io::Result<bool> {
        while self.pending.len() > keep {
            let w = self.pending.pop_front().expect("more than `keep` pending");
            tokio::select! {
                r = w => if r.is_err() { break },
                _ = client_gone(s) => return Ok(false),
            }
            *self.handed += self.sizes.pop_front().unwrap_or(0);
            let p = Reply::Progress {
                bytes: *self.handed,
                acked: e2e,
            };
            api::write_json(s, &p).await?;
        }
        Ok(true)
    }
}

/// A `send` request's parameters.
pub struct SendReq {
    pub to: u32,
    pub name: String,
    pub size: u64,
    pub detach: bool,
    pub lifetime: Option<std::time::Duration>,
    pub service: Option<String>,
    pub priority: crate::api::Priority,
}

impl SendReq {
    #[cfg(test)]
    fn file(name: &str, size: u64) -> Self {
        SendReq {
            to: 2,
            name: name.into(),
            size,
            detach: false,
            lifetime: None,
            service: None,
            priority: Default::default(),
        }
    }
}

/// A client's `send` over `s` (the Unix socket API, and the HTTP API through a socket pair).
pub async fn send(mut s: UnixStream, cmds: mpsc::Sender<Cmd>, req: SendReq) -> std::io::Result<()> {
    let SendReq {
        to,
        name,
        size,
        detach,
        lifetime,
        service,
        priority,
    } = req;
    if let Some(msg) = bad_service(service.as_deref()) {
        return error(&mut s, ErrorCode::BadRequest, msg).await;
    }
    let Some(name) = sanitize_name(&name) else {
        return error(
            &mut s,
            ErrorCode::BadRequest,
            format!("bad file name `{name}`"),
        )
        .await;
    };
    let (utx, mut urx) = mpsc::unbounded_channel();
    let (otx, orx) = oneshot::channel();
    cmds.send(Cmd::Open {
        to,
        name: name.clone(),
        size,
        lifetime,
        detach,
        service: service.clone(),
        priority,
        reply: otx,
        updates: utx,
    })
    .await
    .map_err(|_| closed())?;
    let Opened { flow, first_bytes } = match orx.await.map_err(|_| closed())? {
        Ok(o) => o,
        Err((code, msg)) => return error(&mut s, code, msg).await,
    };
    // Until the end-to-end result (with `detach`: until the last byte is handed over), a
    // client that goes away aborts the flow, whether a read, a write or a wait notices it.
    let mut guard = AbortOnDrop {
        flow,
        cmds: Some(cmds.clone()),
    };
    api::write_json(
        &mut s,
        &Reply::Accepted {
            flow: flow.to_string(),
        },
    )
    .await?;
    let header = FlowHeader {
        name: name.clone(),
        size,
        service: service.clone(),
    }
    .encode();
    // The flow's bytes are the header, the file, the hash: what the destination acknowledged
    // of the file is its acknowledged prefix less the header.
    let header_len = header.len() as u64;
    let file_part = |stream: u64| stream.saturating_sub(header_len).min(size);
    let mut e2e: Option<u64> = None;
    let mut window: VecDeque<oneshot::Receiver<()>> = VecDeque::new();
    let push = |data: Bytes, last: bool| {
        let (tx, rx) = oneshot::channel();
        (
            Cmd::Data {
                flow,
                data,
                done: tx,
                last,
            },
            rx,
        )
    };
    // The header rides with the file's first bytes and the hash with its last ones, so the
    // transport never cuts a block of just the header or just the hash (a tiny block costs a
    // BSYN/BACK round per hop and, with backpressure H = 1, holds a relay's only slot).
    // One frame is held back until the next arrives; `held` is (bytes, file bytes in them).
    // The first hand-over waits for `first_bytes` of the file (or its end), so that the
    // file's first block is as large as the transport allows (see `Opened::first_bytes`).
    let mut held: (Vec<u8>, u64) = (header, 0);
    let mut first = true;
    let mut hasher = blake3::Hasher::new();
    let mut total = 0u64;
    let mut handed = 0u64;
    let mut sizes: VecDeque<u64> = VecDeque::new();
    let failed = loop {
        let mut w = Window {
            pending: &mut window,
            sizes: &mut sizes,
            handed: &mut handed,
        };
        if !w.drain(&mut s, SEND_WINDOW - 1, e2e).await? {
            // The client went away: the guard aborts the flow.
            return Ok(());
        }
        let mut failed = None;
        while let Ok(u) = urx.try_recv() {
            match u {
                FlowUpdate::Acked { bytes } => e2e = Some(file_part(bytes)),
                FlowUpdate::Failed { reason } => failed = Some(reason),
                FlowUpdate::Waiting { reason } => {
                    api::write_json(&mut s, &Reply::Waiting { reason }).await?;
                }
                FlowUpdate::Complete { .. } => {}
            }
        }
        if failed.is_some() {
            break failed;
        }
        let frame = match api::read_frame(&mut s).await {
            Ok(Some(f)) => f,
            // The guard aborts the flow.
            Ok(None) | Err(_) => return Ok(()),
        };
        if frame.is_empty() {
            break None;
        }
        total += frame.len() as u64;
        if total > size {
            return error(
                &mut s,
                ErrorCode::BadRequest,
                format!("more than the announced {size} bytes"),
            )
            .await;
        }
        hasher.update(&frame);
        let n = frame.len() as u64;
        if first && (held.1 == 0 || held.1 < first_bytes as u64) {
            // Only the header and fewer than `first_bytes` so far: the frame joins them.
            held.0.extend_from_slice(&frame);
            held.1 += n;
            continue;
        }
        first = false;
        let (bytes, file_bytes) = std::mem::replace(&mut held, (frame, n));
        sizes.push_back(file_bytes);
        let (c, rx) = push(Bytes::from(bytes), false);
        cmds.send(c).await.map_err(|_| closed())?;
        window.push_back(rx);
    };
    if let Some(reason) = failed {
        return error(
            &mut s,
            ErrorCode::Failed,
            format!("transfer failed: {reason}"),
        )
        .await;
    }
    if total != size {
        return error(
            &mut s,
            ErrorCode::BadRequest,
            format!("announced {size} bytes but sent {total}"),
        )
        .await;
    }
    held.0.extend_from_slice(hasher.finalize().as_bytes());
    sizes.push_back(held.1);
    let (c, rx) = push(Bytes::from(held.0), true);
    cmds.send(c).await.map_err(|_| closed())?;
    window.push_back(rx);
    let mut w = Window {
        pending: &mut window,
        sizes: &mut sizes,
        handed: &mut handed,
    };
    if !w.drain(&mut s, 0, e2e).await? {
        return Ok(());
    }
    // A detached transfer is on the node's disk once its last bytes were taken: only then
    // does the client hear `queued` (and may go).
    if detach {
        guard.cmds = None;
        let _ = cmds.send(Cmd::Detach { flow }).await;
        return api::write_json(
            &mut s,
            &Reply::Queued {
                flow: flow.to_string(),
                bytes: size,
            },
        )
        .await;
    }
    // Wait for the end-to-end result, reporting what the destination acknowledged; a
    // client that goes away now cancels the transfer (the guard aborts it), so that nothing
    // it gave up on is delivered later.
    let result = loop {
        let r = tokio::select! {
            r = urx.recv() => r,
            _ = client_gone(&s) => return Ok(()),
        };
        match r {
            Some(FlowUpdate::Acked { bytes }) => {
                let p = Reply::Progress {
                    bytes: handed,
                    acked: Some(file_part(bytes)),
                };
                api::write_json(&mut s, &p).await?;
            }
            Some(FlowUpdate::Waiting { reason }) => {
                api::write_json(&mut s, &Reply::Waiting { reason }).await?;
            }
            other => break other,
        }
    };
    guard.cmds = None;
    match result {
        Some(FlowUpdate::Complete { .. }) => {
            api::write_json(
                &mut s,
                &Reply::Complete {
                    flow: flow.to_string(),
                    bytes: size,
                },
            )
            .await
        }
        Some(FlowUpdate::Failed { reason }) => {
            error(
                &mut s,
                ErrorCode::Failed,
                format!("transfer failed: {reason}"),
            )
            .await
        }
        None | Some(FlowUpdate::Acked { .. }) | Some(FlowUpdate::Waiting { .. }) => {
            error(&mut s, ErrorCode::Failed, "daemon stopped".into()).await
        }
    }
}

/// Hands inbox files to a receiving client, one at a time, each acknowledged before the
/// next. A file this client was offered and did not acknowledge, because it left (e.g. a
/// `hop recv --count 1` after its file) or the connection failed, goes back to the daemon
/// for the other clients: files are never left with a client that is gone.
async fn recv(
    mut s: UnixStream,
    cmds: mpsc::Sender<Cmd>,
    service: Option<String>,
) -> std::io::Result<()> {
    if let Some(msg) = bad_service(service.as_deref()) {
        return error(&mut s, ErrorCode::BadRequest, msg).await;
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    cmds.send(Cmd::Subscribe { tx, service })
        .await
        .map_err(|_| closed())?;
    let mut current: Option<InboxEntry> = None;
    let result = hand_over(&mut s, &mut rx, &cmds, &mut current).await;
    // Close the channel before returning its contents, so the daemon offers them to
    // the other clients and not to this one.
    rx.close();
    let mut entries: Vec<InboxEntry> = current.into_iter().collect();
    while let Ok(e) = rx.try_recv() {
        entries.push(e);
    }
    drop(rx);
    if !entries.is_empty() {
        let _ = cmds.send(Cmd::Return { entries }).await;
    }
    result
}

async fn hand_over(
    s: &mut UnixStream,
    rx: &mut mpsc::UnboundedReceiver<InboxEntry>,
    cmds: &mpsc::Sender<Cmd>,
    current: &mut Option<InboxEntry>,
) -> std::io::Result<()> {
    loop {
        // While it waits for a file the client sends nothing: anything it sends, or the
        // end of the stream, means it is gone.
        let mut probe = [0u8; 1];
        let e = tokio::select! {
            e = rx.recv() => match e {
                Some(e) => e,
                None => return Ok(()),
            },
            _ = s.read(&mut probe) => return Ok(()),
        };
        let e = current.insert(e);
        let mut f = match tokio::fs::File::open(&e.path).await {
            Ok(f) => f,
            Err(err) => {
                // The file stays in the inbox: hand it back, to be offered again (to this
                // client or another) instead of being held by a client that never got it.
                warn!(flow = %e.flow, error = %err, "cannot open inbox file");
                if let Some(e) = current.take() {
                    let _ = cmds.send(Cmd::Return { entries: vec![e] }).await;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        api::write_json(
            s,
            &Reply::File {
                flow: e.flow.clone(),
                from: e.from,
                name: e.name.clone(),
                size: e.size,
                blake3: e.blake3.clone(),
            },
        )
        .await?;
        f.seek(SeekFrom::Start(e.content_offset)).await?;
        let mut left = e.size;
        let mut buf = vec![0u8; DATA_CHUNK];
        while left > 0 {
            let n = (left as usize).min(buf.len());
            f.read_exact(&mut buf[..n]).await?;
            api::write_frame(s, &buf[..n]).await?;
            left -= n as u64;
        }
        api::write_frame(s, &[]).await?;
        s.flush().await?;
        let Some(frame) = api::read_frame(s).await? else {
            return Ok(());
        };
        match serde_json::from_slice::<Request>(&frame) {
            Ok(Request::Ack { flow, .. }) if flow == e.flow => {
                *current = None;
                cmds.send(Cmd::Ack { flow }).await.map_err(|_| closed())?;
            }
            _ => {
                return error(s, ErrorCode::BadRequest, "expected ack".into()).await;
            }
        }
    }
}

/// Serve Prometheus text on every HTTP request.
/// The metrics endpoint (axum): `GET /metrics` (OpenMetrics text, a snapshot taken by the
/// event loop), `GET /healthz` (`ok` while the event loop answers), 404 elsewhere.
pub async fn serve_metrics(listener: TcpListener, cmds: mpsc::Sender<Cmd>) {
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(health))
        .with_state(cmds);
    if let Err(e) = axum::serve(listener, app).await {
        warn!(error = %e, "metrics endpoint stopped");
    }
}

async fn metrics_page(
    axum::extract::State(cmds): axum::extract::State<mpsc::Sender<Cmd>>,
) -> axum::response::Response {
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    let (tx, rx) = oneshot::channel();
    if cmds.send(Cmd::Metrics { reply: tx }).await.is_err() {
        return (StatusCode::SERVICE_UNAVAILABLE, "hopd is stopping\n").into_response();
    }
    match rx.await {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "hopd is stopping\n").into_response(),
    }
}

async fn health(
    axum::extract::State(cmds): axum::extract::State<mpsc::Sender<Cmd>>,
) -> (axum::http::StatusCode, &'static str) {
    use axum::http::StatusCode;
    let (tx, rx) = oneshot::channel();
    let answered = cmds.send(Cmd::Status { reply: tx }).await.is_ok()
        && tokio::time::timeout(std::time::Duration::from_secs(2), rx)
            .await
            .is_ok_and(|r| r.is_ok());
    if answered {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the event loop does not answer\n",
        )
    }
}

#[cfg(test)]
mod tests;
