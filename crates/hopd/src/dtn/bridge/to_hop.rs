//! Bundles from dtnd to Hop: checked, kept on disk, handed to hopd as detached transfers.

use super::*;

/// A bundle waiting to be handed to hopd.
struct ToSend {
    node: u32,
    id: String,
    name: String,
    data: Vec<u8>,
    remaining: Duration,
    copy: PathBuf,
}

pub(super) fn copy_path(shared: &Shared, node: u32, name: &str) -> PathBuf {
    shared.dir("outgoing").join(format!("{node}-{name}"))
}

/// Copies in `outgoing/` from an earlier run: hopd's `list` tells which transfers are still
/// open; the `sent` journal tells which ones hopd took. A copy hopd never took is sent again;
/// one it took and no longer lists ended while the bridge was away (outcome unknown).
async fn leftover_copies(shared: &Arc<Shared>) -> Vec<ToSend> {
    let Ok(rd) = std::fs::read_dir(shared.dir("outgoing")) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    for e in rd.flatten() {
        let path = e.path();
        let Some(fname) = path
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        let Some((node, name)) = fname
            .split_once('-')
            .and_then(|(n, name)| Some((n.parse::<u32>().ok()?, name.to_string())))
        else {
            continue;
        };
        files.push((node, name, path));
    }
    if files.is_empty() {
        return Vec::new();
    }
    let listed = loop {
        match hopd_list(&shared.cfg.hopd_socket).await {
            Ok(l) => break l,
            Err(e) => {
                warn!(error = %e, "hopd not reachable; waiting to check {} transfers left by the last run", files.len());
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let mut again = Vec::new();
    for (node, name, path) in files {
        let Ok(data) = std::fs::read(&path) else {
            continue;
        };
        let Ok(info) = inspect(&data, unix_ms_now()) else {
            keep(shared, &path, "failed", "a copy that is not a bundle");
            continue;
        };
        let key = format!("{node} {}", info.id);
        let taken = shared.sent.lock().unwrap().contains(&key, now_s());
        if listed.iter().any(|f| f.to == node && f.name == name) {
            shared.open.lock().unwrap().insert(
                (node, name),
                Open {
                    id: info.id,
                    copy: path,
                    queued: true,
                },
            );
        } else if taken {
            shared.count(|c| c.outcome_unknown += 1);
            warn!(bundle = %info.id, node, "its transfer ended while hop-dtn was not running (hopd's log has the outcome); the copy is in unresolved/");
            keep(shared, &path, "unresolved", "outcome unknown");
        } else {
            again.push(ToSend {
                node,
                id: info.id,
                name,
                data,
                remaining: info.remaining,
                copy: path,
            });
        }
    }
    again
}

pub(super) async fn sender_task(
    shared: Arc<Shared>,
    mut fwd: mpsc::UnboundedReceiver<ForwardData>,
) {
    // Copies left by an earlier run go first: the ones hopd never took are sent again. Bundles
    // dtnd hands over meanwhile wait in the channel.
    for t in leftover_copies(&shared).await {
        info!(bundle = %t.id, node = t.node, "sending a bundle hopd had not taken before the restart");
        hand_to_hopd(&shared, t).await;
    }
    while let Some(f) = fwd.recv().await {
        if let Some(t) = admit(&shared, f) {
            hand_to_hopd(&shared, t).await;
        }
    }
}

/// Checks a bundle dtnd handed over and keeps a durable copy; `None` when it is not sent.
fn admit(shared: &Arc<Shared>, f: ForwardData) -> Option<ToSend> {
    let node = ecla::parse_dst(&f.dst).filter(|n| shared.cfg.peer_of(*n).is_some());
    let info = inspect(&f.data, unix_ms_now());
    let Some(node) = node else {
        let p = shared.dir("failed").join(hop_name(&f.bundle_id));
        warn!(dst = %f.dst, bundle = %f.bundle_id, "dtnd routed a bundle to an address this bridge did not announce; kept in failed/");
        let _ = write_durably(&p, &f.data);
        shared.count(|c| c.kept_failed += 1);
        return None;
    };
    let info = match info {
        Ok(i) => i,
        Err(e) => {
            let p = shared.dir("failed").join(hop_name(&f.bundle_id));
            warn!(error = %e, bundle = %f.bundle_id, "dtnd handed over something that does not decode; kept in failed/");
            let _ = write_durably(&p, &f.data);
            shared.count(|c| c.kept_failed += 1);
            return None;
        }
    };
    if info.remaining.is_zero() {
        info!(bundle = %info.id, "lifetime ended before the transfer; dropped");
        shared.count(|c| c.expired += 1);
        return None;
    }
    let name = hop_name(&info.id);
    let key = format!("{node} {}", info.id);
    if shared.sent.lock().unwrap().contains(&key, now_s())
        || shared
            .open
            .lock()
            .unwrap()
            .contains_key(&(node, name.clone()))
    {
        info!(bundle = %info.id, node, "dtnd handed over a bundle already on its way to that node; not sent twice");
        shared.count(|c| c.duplicates_from_dtnd += 1);
        return None;
    }
    let copy = copy_path(shared, node, &name);
    if let Err(e) = write_durably(&copy, &f.data) {
        // Without the copy the bundle still goes; a restart before hopd takes it loses it.
        warn!(error = %e, path = %copy.display(), "could not keep a copy of the bundle");
    }
    Some(ToSend {
        node,
        id: info.id,
        name,
        data: f.data,
        remaining: info.remaining,
        copy,
    })
}

enum SendOutcome {
    Queued,
    Refused(ErrorCode, String),
}

/// Hands one bundle to hopd, retrying while hopd is not reachable.
async fn hand_to_hopd(shared: &Arc<Shared>, t: ToSend) {
    shared.open.lock().unwrap().insert(
        (t.node, t.name.clone()),
        Open {
            id: t.id.clone(),
            copy: t.copy.clone(),
            queued: false,
        },
    );
    let mut warned = false;
    loop {
        // The bundle's own lifetime, or less to have dtnd route it again sooner.
        let span = shared
            .cfg
            .route_again_after
            .map_or(t.remaining, |r| r.min(t.remaining));
        let lifetime = (*shared.lifetimes.lock().unwrap())
            .then(|| span.as_secs().max(1) + u64::from(span.subsec_nanos() > 0));
        match hopd_send(shared, &t, lifetime).await {
            Ok(SendOutcome::Queued) => break,
            Ok(SendOutcome::Refused(ErrorCode::BadRequest, m))
                if lifetime.is_some() && m.contains("lifetime") =>
            {
                info!("hopd's transport takes no lifetimes; bundles are sent without one (hopd's give_up_after applies)");
                *shared.lifetimes.lock().unwrap() = false;
            }
            Ok(SendOutcome::Refused(ErrorCode::NoSpace, m)) => {
                if !warned {
                    warn!(bundle = %t.id, message = %m, "hopd is out of room for new transfers; retrying every 5 s");
                    warned = true;
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            Ok(SendOutcome::Refused(code, m)) => {
                shared
                    .open
                    .lock()
                    .unwrap()
                    .remove(&(t.node, t.name.clone()));
                shared.count(|c| c.hop_failed += 1);
                let hint = match code {
                    ErrorCode::UnknownNode => {
                        " (hopd's configuration has no route or host for that node)"
                    }
                    _ => "",
                };
                warn!(bundle = %t.id, node = t.node, message = %m, "hopd refused the transfer{hint}");
                failed(shared, &t.id, &t.copy, t.data).await;
                return;
            }
            Err(e) => {
                if !warned {
                    warn!(error = %e, socket = %shared.cfg.hopd_socket.display(), "hopd not reachable; the bundle waits");
                    warned = true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    let expires = now_s() + t.remaining.as_secs() + JOURNAL_MARGIN_S;
    if let Err(e) = shared
        .sent
        .lock()
        .unwrap()
        .insert(&format!("{} {}", t.node, t.id), expires)
    {
        warn!(error = %e, "could not record a sent bundle; a copy dtnd hands over again would be sent twice");
    }
    if let Some(o) = shared
        .open
        .lock()
        .unwrap()
        .get_mut(&(t.node, t.name.clone()))
    {
        o.queued = true;
    }
    shared.count(|c| c.to_hop += 1);
    debug!(bundle = %t.id, node = t.node, bytes = t.data.len(), "bundle handed to hopd");
}

async fn hopd_send(
    shared: &Shared,
    t: &ToSend,
    lifetime_s: Option<u64>,
) -> std::io::Result<SendOutcome> {
    let mut s = UnixStream::connect(&shared.cfg.hopd_socket).await?;
    let req = Request::Send {
        v: API_VERSION,
        to: t.node,
        name: t.name.clone(),
        size: t.data.len() as u64,
        detach: true,
        lifetime_s,
        service: Some(shared.cfg.service.clone()),
        priority: None,
    };
    api::write_json(&mut s, &req).await?;
    for chunk in t.data.chunks(DATA_CHUNK) {
        api::write_frame(&mut s, chunk).await?;
    }
    api::write_frame(&mut s, &[]).await?;
    loop {
        let Some(frame) = api::read_frame(&mut s).await? else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "hopd closed the connection before taking the bundle",
            ));
        };
        match api::parse_reply(&frame)? {
            Reply::Queued { .. } => return Ok(SendOutcome::Queued),
            Reply::Error { code, message } => return Ok(SendOutcome::Refused(code, message)),
            _ => continue,
        }
    }
}

pub(super) async fn hopd_list(socket: &Path) -> std::io::Result<Vec<OutgoingFlow>> {
    let mut s = UnixStream::connect(socket).await?;
    api::write_json(&mut s, &Request::List { v: API_VERSION }).await?;
    let frame = api::read_frame(&mut s)
        .await?
        .ok_or_else(|| std::io::Error::other("hopd closed the connection"))?;
    match api::parse_reply(&frame)? {
        Reply::Flows { outgoing, .. } => Ok(outgoing),
        r => Err(std::io::Error::other(format!("unexpected reply {r:?}"))),
    }
}
