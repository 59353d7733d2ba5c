//! The local HTTP API (`http_listen`, off by default): what the Unix socket API offers, for
//! programs and dashboards that speak HTTP and JSON (docs/hopd.md, HTTP API).
//!
//! - `GET /v1/status`: the node's status (as `hop status --json`).
//! - `GET /v1/transfers`: outgoing transfers (as `hop list --json`).
//! - `POST /v1/transfers?to=NODE[&service=S][&name=F][&lifetime_s=T][&priority=P]`, the file as the body
//!   (`Content-Length` required): a detached send; 202 with the flow once the node holds it.
//! - `DELETE /v1/transfers/{flow}`: cancel.
//! - `GET /v1/inbox[?service=S]`: files received and waiting; `GET /v1/inbox/{flow}`: one
//!   file's bytes; `DELETE /v1/inbox/{flow}`: the application has it, the node deletes it.
//! - `GET /v1/events` (WebSocket): one JSON text message per event: a file arrived, a
//!   transfer completed, failed or was cancelled, a next hop fell silent or returned.
//!
//! Errors are JSON `{"error": CODE, "message": TEXT}` with an HTTP status per code. There is
//! no authentication: anyone who reaches the address can send and receive as this node, so
//! it belongs on a loopback address (or behind a proxy that authenticates).

use std::io::SeekFrom;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures_util::StreamExt;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::net::{TcpListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use crate::api::{self, ErrorCode, Reply, DATA_CHUNK};
use crate::daemon::cmd::{Cmd, InboxEntry};

/// Serve the HTTP API on `listener` until the daemon stops.
pub async fn serve(listener: TcpListener, cmds: mpsc::Sender<Cmd>) {
    let app = Router::new()
        .route("/v1/status", get(status))
        .route("/v1/transfers", get(transfers).post(send))
        .route("/v1/transfers/{flow}", axum::routing::delete(cancel))
        .route("/v1/inbox", get(inbox))
        .route("/v1/inbox/{flow}", get(download).delete(ack))
        .route("/v1/events", get(events))
        .with_state(cmds);
    if let Err(e) = axum::serve(listener, app).await {
        warn!(error = %e, "HTTP API stopped");
    }
}

fn error(code: ErrorCode, message: impl Into<String>) -> Response {
    let status = match code {
        ErrorCode::BadRequest => StatusCode::BAD_REQUEST,
        ErrorCode::UnknownNode => StatusCode::NOT_FOUND,
        ErrorCode::NoSpace => StatusCode::INSUFFICIENT_STORAGE,
        ErrorCode::Failed => StatusCode::BAD_GATEWAY,
        ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let body = serde_json::json!({"error": code, "message": message.into()});
    (status, Json(body)).into_response()
}

fn stopping() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(serde_json::json!({"error": "stopping", "message": "hopd is stopping"})),
    )
        .into_response()
}

/// Ask the core something and wait for its answer.
async fn ask<T>(
    cmds: &mpsc::Sender<Cmd>,
    make: impl FnOnce(oneshot::Sender<T>) -> Cmd,
) -> Option<T> {
    let (tx, rx) = oneshot::channel();
    cmds.send(make(tx)).await.ok()?;
    rx.await.ok()
}

async fn status(State(cmds): State<mpsc::Sender<Cmd>>) -> Response {
    match ask(&cmds, |reply| Cmd::Status { reply }).await {
        Some(v) => Json(v).into_response(),
        None => stopping(),
    }
}

async fn transfers(State(cmds): State<mpsc::Sender<Cmd>>) -> Response {
    match ask(&cmds, |reply| Cmd::List { reply }).await {
        Some(v) => Json(serde_json::json!({ "outgoing": v })).into_response(),
        None => stopping(),
    }
}

async fn cancel(State(cmds): State<mpsc::Sender<Cmd>>, Path(flow): Path<String>) -> Response {
    match ask(&cmds, |reply| Cmd::Cancel {
        flow: flow.clone(),
        reply,
    })
    .await
    {
        Some(Ok(())) => Json(serde_json::json!({ "cancelled": flow })).into_response(),
        Some(Err(msg)) => error(ErrorCode::UnknownNode, msg),
        None => stopping(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SendQuery {
    to: u32,
    service: Option<String>,
    name: Option<String>,
    lifetime_s: Option<u64>,
    priority: Option<crate::api::Priority>,
}

/// A detached send: the body goes through the same path as a Unix-socket client's file
/// (an in-process socket pair), so it is checked, hashed and kept on disk the same way.
async fn send(
    State(cmds): State<mpsc::Sender<Cmd>>,
    query: Result<Query<SendQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Query(q) = match query {
        Ok(q) => q,
        Err(e) => return error(ErrorCode::BadRequest, format!("query: {e} (need to=NODE)")),
    };
    let Some(size) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return (
            StatusCode::LENGTH_REQUIRED,
            Json(serde_json::json!({"error": "bad_request", "message": "Content-Length is required: the file's size travels ahead of it"})),
        )
            .into_response();
    };
    let name = q.name.unwrap_or_else(|| "upload".into());
    let (mut client, server) = match UnixStream::pair() {
        Ok(p) => p,
        Err(e) => return error(ErrorCode::Internal, e.to_string()),
    };
    let req = crate::server::SendReq {
        to: q.to,
        name,
        size,
        detach: true,
        lifetime: q.lifetime_s.map(std::time::Duration::from_secs),
        service: q.service,
        priority: q.priority.unwrap_or_default(),
    };
    let task = tokio::spawn(crate::server::send(server, cmds, req));
    let flow = match next_reply(&mut client).await {
        Some(Reply::Accepted { flow }) => flow,
        Some(Reply::Error { code, message }) => return error(code, message),
        _ => return error(ErrorCode::Internal, "no answer from the daemon"),
    };
    // Stream the body as data frames, then the end frame; replies (progress) are read as
    // they come so that the daemon never waits on this side.
    let mut stream = body.into_data_stream();
    let mut sent = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            // The client went away: dropping the socket cancels the flow.
            Err(e) => return error(ErrorCode::BadRequest, format!("reading the body: {e}")),
        };
        for piece in chunk.chunks(DATA_CHUNK) {
            sent += piece.len() as u64;
            if api::write_frame(&mut client, piece).await.is_err() {
                break;
            }
        }
    }
    if sent != size {
        return error(
            ErrorCode::BadRequest,
            format!("Content-Length said {size} bytes, the body had {sent}"),
        );
    }
    if api::write_frame(&mut client, &[]).await.is_err() {
        return error(ErrorCode::Internal, "the daemon closed the transfer");
    }
    let result = loop {
        match next_reply(&mut client).await {
            Some(Reply::Progress { .. }) | Some(Reply::Waiting { .. }) => continue,
            other => break other,
        }
    };
    let _ = task.await;
    match result {
        Some(Reply::Queued { flow, bytes }) => (
            StatusCode::ACCEPTED,
            Json(serde_json::json!({"flow": flow, "bytes": bytes, "to": q.to})),
        )
            .into_response(),
        Some(Reply::Error { code, message }) => error(code, message),
        _ => error(
            ErrorCode::Internal,
            format!("flow {flow}: no result from the daemon"),
        ),
    }
}

async fn next_reply(s: &mut UnixStream) -> Option<Reply> {
    let frame = api::read_frame(s).await.ok()??;
    api::parse_reply(&frame).ok()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InboxQuery {
    service: Option<String>,
}

fn entry_json(e: &InboxEntry) -> serde_json::Value {
    serde_json::json!({
        "flow": e.flow, "from": e.from, "name": e.name, "size": e.size,
        "blake3": e.blake3, "service": e.service,
    })
}

async fn inbox(State(cmds): State<mpsc::Sender<Cmd>>, Query(q): Query<InboxQuery>) -> Response {
    match ask(&cmds, |reply| Cmd::Inbox { reply }).await {
        Some(entries) => {
            let files: Vec<_> = entries
                .iter()
                .filter(|e| e.service == q.service)
                .map(entry_json)
                .collect();
            Json(serde_json::json!({ "files": files })).into_response()
        }
        None => stopping(),
    }
}

async fn download(State(cmds): State<mpsc::Sender<Cmd>>, Path(flow): Path<String>) -> Response {
    let Some(entries) = ask(&cmds, |reply| Cmd::Inbox { reply }).await else {
        return stopping();
    };
    let Some(e) = entries.into_iter().find(|e| e.flow == flow) else {
        return error(
            ErrorCode::UnknownNode,
            format!("no file {flow} in the inbox"),
        );
    };
    let mut f = match tokio::fs::File::open(&e.path).await {
        Ok(f) => f,
        Err(err) => return error(ErrorCode::Internal, format!("{}: {err}", e.path.display())),
    };
    if let Err(err) = f.seek(SeekFrom::Start(e.content_offset)).await {
        return error(ErrorCode::Internal, err.to_string());
    }
    let stream = tokio_util_like_stream(f.take(e.size));
    let mut r = Response::new(Body::from_stream(stream));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        "application/octet-stream".parse().expect("static"),
    );
    h.insert(header::CONTENT_LENGTH, e.size.into());
    for (k, v) in [
        ("x-hop-name", e.name.clone()),
        ("x-hop-from", e.from.to_string()),
        ("x-hop-blake3", e.blake3.clone()),
    ] {
        if let Ok(v) = v.parse() {
            h.insert(k, v);
        }
    }
    r
}

/// A reader as a stream of chunks (what `Body::from_stream` takes).
fn tokio_util_like_stream<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
    r: R,
) -> impl futures_util::Stream<Item = std::io::Result<Vec<u8>>> + Send {
    futures_util::stream::unfold(r, |mut r| async move {
        let mut buf = vec![0u8; 64 * 1024];
        match r.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(buf), r))
            }
            Err(e) => Some((Err(e), r)),
        }
    })
}

async fn ack(State(cmds): State<mpsc::Sender<Cmd>>, Path(flow): Path<String>) -> Response {
    let Some(entries) = ask(&cmds, |reply| Cmd::Inbox { reply }).await else {
        return stopping();
    };
    if !entries.iter().any(|e| e.flow == flow) {
        return error(
            ErrorCode::UnknownNode,
            format!("no file {flow} in the inbox"),
        );
    }
    if cmds.send(Cmd::Ack { flow: flow.clone() }).await.is_err() {
        return stopping();
    }
    StatusCode::NO_CONTENT.into_response()
}

/// The event stream: each event as a JSON text message; a listener too slow to keep up is
/// told how many it missed (`{"event":"lagged","missed":N}`).
async fn events(
    State(cmds): State<mpsc::Sender<Cmd>>,
    ws: axum::extract::ws::WebSocketUpgrade,
) -> Response {
    let Some(mut rx) = ask(&cmds, |reply| Cmd::Events { reply }).await else {
        return stopping();
    };
    ws.on_upgrade(move |mut socket| async move {
        use axum::extract::ws::Message;
        use tokio::sync::broadcast::error::RecvError;
        loop {
            let text = tokio::select! {
                e = rx.recv() => match e {
                    Ok(v) => v.to_string(),
                    Err(RecvError::Lagged(n)) => serde_json::json!({"event": "lagged", "missed": n}).to_string(),
                    Err(RecvError::Closed) => break,
                },
                // The listener closed (or sent something): a closed socket ends the stream.
                m = socket.recv() => match m {
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => continue,
                },
            };
            if socket.send(Message::Text(text.into())).await.is_err() {
                break;
            }
        }
    })
}
