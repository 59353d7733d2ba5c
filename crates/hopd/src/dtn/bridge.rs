//! The running bridge: dtnd's external convergence layer on one side, hopd's local API on the
//! other. Four tasks share the state below:
//!
//! - **ecla**: keeps a registered WebSocket session with dtnd, announces the peers, and passes
//!   the bundles dtnd routes to them to the sender;
//! - **sender**: keeps a copy of each bundle (`state_dir/outgoing/`, fsynced), hands it to
//!   hopd as a detached transfer to the peer's node (kept on hopd's disk, resumed across
//!   restarts), with the bundle's remaining lifetime;
//! - **events**: follows hopd's events; a complete transfer drops the copy, a failed one gives
//!   the bundle back to dtnd (or keeps it in `state_dir/failed/`);
//! - **receiver**: takes the files hopd receives for the bridge's service, hands each bundle to
//!   dtnd once (journal `state_dir/delivered`), then acknowledges the file to hopd.
//!
//! The rules that keep bundles from being lost or duplicated are in docs/dtn.md.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_tungstenite::tungstenite::Message;
use tracing::{debug, info, warn};

use super::bundle::{hop_name, inspect, unix_ms_now};
use super::config::Config;
use super::ecla::{self, Beacon, ForwardData, Packet, Register};
use super::journal::Journal;
use crate::api::{self, ErrorCode, OutgoingFlow, Reply, Request, API_VERSION, DATA_CHUNK};

/// Journal entries outlive the bundle's lifetime by this much: a copy that arrives later
/// than its lifetime is dropped by dtnd anyway, and clocks differ.
const JOURNAL_MARGIN_S: u64 = 3600;

/// What the bridge has done, written to `state_dir/counters.json` (docs/dtn.md).
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct Counters {
    /// Bundles dtnd handed to the bridge for a peer.
    pub from_dtnd: u64,
    /// Of those, handed to hopd (its transfer open).
    pub to_hop: u64,
    /// Transfers the destination node acknowledged.
    pub hop_complete: u64,
    /// Transfers that failed (hopd gave up, refused, or the flow was cancelled).
    pub hop_failed: u64,
    /// Failed bundles given back to dtnd.
    pub handed_back: u64,
    /// Failed bundles kept in `failed/` (no hand-back, or it failed).
    pub kept_failed: u64,
    /// Bundles whose lifetime ended before or during their transfer (dropped, as a bundle node
    /// deletes a bundle past its lifetime).
    pub expired: u64,
    /// A bundle dtnd handed over again for the same node while the first copy was carried.
    pub duplicates_from_dtnd: u64,
    /// Bundles received from Hop and handed to dtnd.
    pub to_dtnd: u64,
    /// Bundles received from Hop that had been handed to dtnd before (not handed again).
    pub duplicates_from_hop: u64,
    /// Files received for the service that are not bundles (kept in `rejected/`).
    pub not_bundles: u64,
    /// Transfers that ended while the bridge was not running (copy kept in `unresolved/`).
    pub outcome_unknown: u64,
}

/// The registered session with dtnd, as the other tasks use it.
#[derive(Clone)]
struct EclaLink {
    tx: mpsc::Sender<(Packet, oneshot::Sender<bool>)>,
}

impl EclaLink {
    async fn send(&self, p: Packet) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.tx.send((p, tx)).await.is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }
}

struct Open {
    id: String,
    copy: PathBuf,
    /// hopd took the transfer (`queued`); before that the sender still owns it.
    queued: bool,
}

struct Shared {
    cfg: Config,
    counters: Mutex<Counters>,
    /// `"<node> <bundle id>"` of bundles handed to hopd, until their lifetime ends.
    sent: Mutex<Journal>,
    /// Ids of bundles handed to dtnd, until their lifetime ends.
    delivered: Mutex<Journal>,
    /// Transfers open in hopd, by (node, name).
    open: Mutex<HashMap<(u32, String), Open>>,
    ecla: watch::Sender<Option<EclaLink>>,
    /// Whether hopd takes lifetimes (Hop does; HxH and ATP refuse them).
    lifetimes: Mutex<bool>,
}

#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("state directory {path}: {source}")]
    State {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn now_s() -> u64 {
    unix_ms_now() / 1000
}

impl Shared {
    fn count(&self, f: impl FnOnce(&mut Counters)) {
        f(&mut self.counters.lock().unwrap());
    }

    fn dir(&self, sub: &str) -> PathBuf {
        self.cfg.state_dir.join(sub)
    }
}

/// Runs the bridge until the process is stopped.
pub async fn run(cfg: Config) -> Result<(), BridgeError> {
    let state = |path: &Path, source| BridgeError::State {
        path: path.to_path_buf(),
        source,
    };
    for sub in ["outgoing", "failed", "rejected", "unresolved"] {
        let d = cfg.state_dir.join(sub);
        std::fs::create_dir_all(&d).map_err(|e| state(&d, e))?;
    }
    let sent_path = cfg.state_dir.join("sent");
    let delivered_path = cfg.state_dir.join("delivered");
    let sent = Journal::open(&sent_path, now_s()).map_err(|e| state(&sent_path, e))?;
    let delivered =
        Journal::open(&delivered_path, now_s()).map_err(|e| state(&delivered_path, e))?;
    let (ecla_tx, _) = watch::channel(None);
    let shared = Arc::new(Shared {
        cfg,
        counters: Mutex::new(Counters::default()),
        sent: Mutex::new(sent),
        delivered: Mutex::new(delivered),
        open: Mutex::new(HashMap::new()),
        ecla: ecla_tx,
        lifetimes: Mutex::new(true),
    });
    info!(
        state_dir = %shared.cfg.state_dir.display(),
        dtnd = %shared.cfg.dtnd,
        hopd = %shared.cfg.hopd_socket.display(),
        cla = %shared.cfg.cla_name,
        service = %shared.cfg.service,
        peers = shared.cfg.peers.len(),
        "hop-dtn starting"
    );
    let (fwd_tx, fwd_rx) = mpsc::unbounded_channel();
    tokio::spawn(ecla_task(shared.clone(), fwd_tx));
    tokio::spawn(events_task(shared.clone()));
    tokio::spawn(receiver_task(shared.clone()));
    tokio::spawn(counters_task(shared.clone()));
    sender_task(shared, fwd_rx).await;
    Ok(())
}

// ---- dtnd side ------------------------------------------------------------------------------

async fn ecla_task(shared: Arc<Shared>, fwd: mpsc::UnboundedSender<ForwardData>) {
    let url = format!("ws://{}/ws/ecla", shared.cfg.dtnd);
    let mut failures = 0u32;
    loop {
        match ecla_session(&shared, &url, &fwd).await {
            Ok(()) => {
                failures = 0;
                warn!(%url, "dtnd closed the convergence layer session; reconnecting");
            }
            Err(e) => {
                if failures == 0 {
                    warn!(%url, error = %e, "dtnd's external convergence layer not reachable: is dtnd running on this host with --ecla and web port {}? retrying", shared.cfg.dtnd.port());
                } else {
                    debug!(%url, error = %e, "dtnd still not reachable");
                }
                failures += 1;
            }
        }
        shared.ecla.send_replace(None);
        tokio::time::sleep(Duration::from_millis(
            (250 * u64::from(failures.min(8))).max(250),
        ))
        .await;
    }
}

async fn ecla_session(
    shared: &Arc<Shared>,
    url: &str,
    fwd: &mpsc::UnboundedSender<ForwardData>,
) -> Result<(), String> {
    let (ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sink, mut stream) = ws.split();
    let register = Packet::Register(Register {
        name: shared.cfg.cla_name.clone(),
        enable_beacon: false,
        port: None,
    });
    let text = serde_json::to_string(&register).expect("packets serialise");
    sink.send(Message::Text(text.into()))
        .await
        .map_err(|e| e.to_string())?;
    // dtnd answers Registered, or Error (e.g. the name is taken by another module).
    let reply = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(m) = stream.next().await {
            match m {
                Ok(Message::Text(t)) => match serde_json::from_str::<Packet>(&t) {
                    Ok(Packet::Registered(r)) => return Ok(r),
                    Ok(Packet::Error(e)) => return Err(format!("dtnd refused the registration: {} (another hop-dtn, or a CLA of that name?)", e.reason)),
                    _ => continue,
                },
                Ok(_) => continue,
                Err(e) => return Err(e.to_string()),
            }
        }
        Err("closed before registering".to_string())
    })
    .await
    .map_err(|_| "no answer to the registration in 10 s".to_string())??;
    // The peers first: a bundle dtnd dispatches before it knows a route waits for its
    // janitor (if it runs at all).
    for b in beacons(&shared.cfg) {
        let text = serde_json::to_string(&b).expect("packets serialise");
        sink.send(Message::Text(text.into()))
            .await
            .map_err(|e| e.to_string())?;
    }
    info!(eid = %reply.eid, node = %reply.nodeid, cla = %shared.cfg.cla_name, peers = shared.cfg.peers.len(), "registered with dtnd");

    let (tx, mut rx) = mpsc::channel::<(Packet, oneshot::Sender<bool>)>(64);
    let writer = tokio::spawn(async move {
        while let Some((p, done)) = rx.recv().await {
            let text = serde_json::to_string(&p).expect("packets serialise");
            let ok = sink.send(Message::Text(text.into())).await.is_ok();
            let _ = done.send(ok);
            if !ok {
                break;
            }
        }
    });
    let link = EclaLink { tx };
    shared.ecla.send_replace(Some(link.clone()));
    let beacons = tokio::spawn(announce(shared.clone(), link));
    let mut result = Ok(());
    while let Some(m) = stream.next().await {
        match m {
            Ok(Message::Text(t)) => match serde_json::from_str::<Packet>(&t) {
                Ok(Packet::ForwardData(f)) => {
                    shared.count(|c| c.from_dtnd += 1);
                    let _ = fwd.send(f);
                }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "unreadable packet from dtnd, ignored"),
            },
            Ok(Message::Close(_)) => break,
            Ok(_) => {}
            Err(e) => {
                result = Err(e.to_string());
                break;
            }
        }
    }
    beacons.abort();
    writer.abort();
    result
}

/// The beacons that announce each peer as reachable through this convergence layer.
fn beacons(cfg: &Config) -> Vec<Packet> {
    let block = ecla::service_block(&cfg.cla_name);
    cfg.peers
        .iter()
        .filter_map(|p| {
            // Checked when the configuration was read.
            let eid = bp7::EndpointID::try_from(p.eid.as_str()).ok()?;
            Some(Packet::Beacon(Beacon {
                eid,
                addr: p.node.to_string(),
                service_block: block.clone(),
            }))
        })
        .collect()
}

/// Announces the peers again every `announce_interval` (dtnd forgets a peer it has not
/// heard of for its peer timeout, 20 s by default, when its janitor runs).
async fn announce(shared: Arc<Shared>, link: EclaLink) {
    let mut tick = tokio::time::interval(shared.cfg.announce_interval);
    tick.tick().await; // the first round went out with the registration
    loop {
        tick.tick().await;
        for b in beacons(&shared.cfg) {
            if !link.send(b).await {
                return;
            }
        }
    }
}

// ---- bundles from dtnd to Hop ---------------------------------------------------------------

/// A bundle waiting to be handed to hopd.
struct ToSend {
    node: u32,
    id: String,
    name: String,
    data: Vec<u8>,
    remaining: Duration,
    copy: PathBuf,
}

fn copy_path(shared: &Shared, node: u32, name: &str) -> PathBuf {
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

/// Moves `path` into `state_dir/<sub>/`.
fn keep(shared: &Shared, path: &Path, sub: &str, why: &str) {
    let Some(name) = path.file_name() else { return };
    let to = shared.dir(sub).join(name);
    if let Err(e) = std::fs::rename(path, &to) {
        warn!(error = %e, path = %path.display(), why, "could not move a bundle copy");
    }
}

fn write_durably(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(d) = path.parent() {
        std::fs::File::open(d)?.sync_all()?;
    }
    Ok(())
}

async fn sender_task(shared: Arc<Shared>, mut fwd: mpsc::UnboundedReceiver<ForwardData>) {
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

async fn hopd_list(socket: &Path) -> std::io::Result<Vec<OutgoingFlow>> {
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

/// The outcome of a transfer, from hopd's events.
async fn events_task(shared: Arc<Shared>) {
    let mut first = true;
    loop {
        if let Err(e) = follow_events(&shared, first).await {
            debug!(error = %e, "hopd's event stream ended");
        }
        first = false;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn follow_events(shared: &Arc<Shared>, first: bool) -> std::io::Result<()> {
    let mut s = UnixStream::connect(&shared.cfg.hopd_socket).await?;
    api::write_json(&mut s, &Request::Events { v: API_VERSION }).await?;
    if !first {
        // Events may have been missed while the stream was down.
        reconcile(shared).await?;
    }
    while let Some(frame) = api::read_frame(&mut s).await? {
        let v: serde_json::Value = serde_json::from_slice(&frame)?;
        let kind = v["event"].as_str().unwrap_or("");
        let key = || -> Option<(u32, String)> {
            Some((
                u32::try_from(v["to"].as_u64()?).ok()?,
                v["name"].as_str()?.to_string(),
            ))
        };
        match kind {
            "complete" => {
                let Some(k) = key() else { continue };
                let Some(o) = shared.open.lock().unwrap().remove(&k) else {
                    continue;
                };
                let _ = std::fs::remove_file(&o.copy);
                shared.count(|c| c.hop_complete += 1);
                info!(bundle = %o.id, node = k.0, "bundle delivered to its Hop node");
            }
            "failed" | "cancelled" => {
                let Some(k) = key() else { continue };
                let Some(o) = shared.open.lock().unwrap().remove(&k) else {
                    continue;
                };
                let reason = v["reason"].as_str().unwrap_or("cancelled (`hop cancel`)");
                shared.count(|c| c.hop_failed += 1);
                let data = std::fs::read(&o.copy).unwrap_or_default();
                if inspect(&data, unix_ms_now()).is_ok_and(|i| i.remaining.is_zero()) {
                    info!(bundle = %o.id, "lifetime ended during the transfer; dropped");
                    shared.count(|c| c.expired += 1);
                    let _ = std::fs::remove_file(&o.copy);
                    continue;
                }
                warn!(bundle = %o.id, node = k.0, %reason, "transfer failed");
                // The bundle may be sent to that node again.
                let _ = shared
                    .sent
                    .lock()
                    .unwrap()
                    .remove(&format!("{} {}", k.0, o.id));
                failed(shared, &o.id, &o.copy, data).await;
            }
            "lagged" => reconcile(shared).await?,
            _ => {}
        }
    }
    Ok(())
}

/// Open transfers hopd no longer lists ended unseen: outcome unknown.
async fn reconcile(shared: &Arc<Shared>) -> std::io::Result<()> {
    let listed = hopd_list(&shared.cfg.hopd_socket).await?;
    let gone: Vec<((u32, String), Open)> = {
        let mut open = shared.open.lock().unwrap();
        let keys: Vec<(u32, String)> = open
            .iter()
            .filter(|(k, o)| o.queued && !listed.iter().any(|f| f.to == k.0 && f.name == k.1))
            .map(|(k, _)| k.clone())
            .collect();
        keys.into_iter()
            .filter_map(|k| open.remove(&k).map(|o| (k, o)))
            .collect()
    };
    for ((node, _), o) in gone {
        shared.count(|c| c.outcome_unknown += 1);
        warn!(bundle = %o.id, node, "its transfer ended while hop-dtn was not following hopd's events; the copy is in unresolved/");
        keep(shared, &o.copy, "unresolved", "outcome unknown");
    }
    Ok(())
}

/// A bundle whose transfer failed: back to dtnd, whose routing decides again, or kept.
async fn failed(shared: &Arc<Shared>, id: &str, copy: &Path, data: Vec<u8>) {
    if shared.cfg.hand_back && !data.is_empty() {
        match hand_back(shared.cfg.dtnd, id, &data).await {
            Ok(()) => {
                shared.count(|c| c.handed_back += 1);
                info!(bundle = %id, "given back to dtnd to be routed again");
                let _ = std::fs::remove_file(copy);
                return;
            }
            Err(e) => warn!(bundle = %id, error = %e, "could not give the bundle back to dtnd"),
        }
    }
    shared.count(|c| c.kept_failed += 1);
    keep(shared, copy, "failed", "transfer failed");
    warn!(bundle = %id, dir = %shared.dir("failed").display(), "bundle kept in failed/ (dtnd can take it again: dtnsend --raw, or POST /insert)");
}

/// dtnd's HTTP API: `GET /delete?<id>` (so the bundle is new to it again), then
/// `POST /insert` with the bundle, which dtnd dispatches as if sent locally.
async fn hand_back(dtnd: std::net::SocketAddr, id: &str, data: &[u8]) -> Result<(), String> {
    // dtnd reads the raw query as the id; one that needs escaping cannot be named.
    if id
        .bytes()
        .all(|b| b.is_ascii_graphic() && !b"#%&+".contains(&b))
    {
        let (code, _) = http(dtnd, "GET", &format!("/delete?{id}"), &[]).await?;
        if code != 200 && code != 404 {
            return Err(format!("dtnd answered {code} to the deletion"));
        }
    }
    let (code, body) = http(dtnd, "POST", "/insert", data).await?;
    if code != 200 {
        return Err(format!(
            "dtnd answered {code} to the insertion: {}",
            String::from_utf8_lossy(&body)
        ));
    }
    Ok(())
}

/// One HTTP/1.1 request to dtnd's local API (`Connection: close`): status and body.
async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    target: &str,
    body: &[u8],
) -> Result<(u16, Vec<u8>), String> {
    let go = async {
        let mut s = TcpStream::connect(addr).await?;
        let head = format!(
            "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await?;
        s.write_all(body).await?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).await?;
        Ok::<_, std::io::Error>(resp)
    };
    let resp = tokio::time::timeout(Duration::from_secs(30), go)
        .await
        .map_err(|_| "dtnd's HTTP API did not answer in 30 s".to_string())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&resp[..resp.len().min(64)]);
    let code = text
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| text.strip_prefix("HTTP/1.0 "))
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {text:?}"))?;
    let body = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(Vec::new(), |i| resp[i + 4..].to_vec());
    Ok((code, body))
}

// ---- bundles from Hop to dtnd ---------------------------------------------------------------

async fn receiver_task(shared: Arc<Shared>) {
    let mut warned = false;
    loop {
        match receive(&shared).await {
            Ok(()) => warned = false,
            Err(e) => {
                if !warned {
                    warn!(error = %e, socket = %shared.cfg.hopd_socket.display(), "not receiving from hopd; retrying");
                    warned = true;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn receive(shared: &Arc<Shared>) -> std::io::Result<()> {
    let mut s = UnixStream::connect(&shared.cfg.hopd_socket).await?;
    let req = Request::Recv {
        v: API_VERSION,
        service: Some(shared.cfg.service.clone()),
    };
    api::write_json(&mut s, &req).await?;
    info!(service = %shared.cfg.service, "receiving bundles from hopd");
    loop {
        let Some(frame) = api::read_frame(&mut s).await? else {
            return Ok(());
        };
        let (flow, from, size) = match api::parse_reply(&frame)? {
            Reply::File {
                flow, from, size, ..
            } => (flow, from, size),
            Reply::Error { message, .. } => return Err(std::io::Error::other(message)),
            _ => continue,
        };
        let mut data = Vec::with_capacity(size.min(64 << 20) as usize);
        loop {
            let chunk = api::read_frame(&mut s)
                .await?
                .ok_or_else(|| std::io::Error::other("hopd closed during a file"))?;
            if chunk.is_empty() {
                break;
            }
            data.extend_from_slice(&chunk);
        }
        if data.len() as u64 != size {
            return Err(std::io::Error::other(format!(
                "file {flow}: {} bytes, announced {size}",
                data.len()
            )));
        }
        to_dtnd(shared, &flow, from, data).await;
        api::write_json(
            &mut s,
            &Request::Ack {
                v: API_VERSION,
                flow,
            },
        )
        .await?;
    }
}

/// Hands a received bundle to dtnd once; returns when it may be acknowledged to hopd.
async fn to_dtnd(shared: &Arc<Shared>, flow: &str, from: u32, data: Vec<u8>) {
    let info = match inspect(&data, unix_ms_now()) {
        Ok(i) => i,
        Err(e) => {
            let p = shared.dir("rejected").join(flow.replace(':', "-"));
            warn!(%flow, from, error = %e, path = %p.display(), "a file for the bundle service is not a bundle; kept aside");
            if let Err(e) = write_durably(&p, &data) {
                warn!(error = %e, "could not keep it");
            }
            shared.count(|c| c.not_bundles += 1);
            return;
        }
    };
    if shared.delivered.lock().unwrap().contains(&info.id, now_s()) {
        info!(bundle = %info.id, from, "bundle already handed to dtnd; this copy is dropped");
        shared.count(|c| c.duplicates_from_hop += 1);
        return;
    }
    let mut rx = shared.ecla.subscribe();
    let mut waited = false;
    loop {
        let link = rx.borrow_and_update().clone();
        if let Some(link) = link {
            let p = Packet::ForwardData(ForwardData {
                src: from.to_string(),
                dst: String::new(),
                bundle_id: info.id.clone(),
                data: data.clone(),
            });
            if link.send(p).await {
                break;
            }
        } else if !waited {
            info!(bundle = %info.id, "waiting for dtnd to hand over a received bundle");
            waited = true;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
    let expires = now_s() + info.remaining.as_secs() + JOURNAL_MARGIN_S;
    if let Err(e) = shared.delivered.lock().unwrap().insert(&info.id, expires) {
        warn!(error = %e, "could not record a delivered bundle; a second copy would reach dtnd (which drops a bundle it still stores)");
    }
    shared.count(|c| c.to_dtnd += 1);
    debug!(bundle = %info.id, from, bytes = data.len(), "bundle handed to dtnd");
}

/// Writes `counters.json` when the counters change (at most once a second).
async fn counters_task(shared: Arc<Shared>) {
    let path = shared.cfg.state_dir.join("counters.json");
    let mut last = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let now = shared.counters.lock().unwrap().clone();
        if last.as_ref() == Some(&now) {
            continue;
        }
        let text = serde_json::to_string_pretty(&now).expect("counters serialise");
        let tmp = path.with_extension("tmp");
        if std::fs::write(&tmp, text + "\n").is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
        last = Some(now);
    }
}
