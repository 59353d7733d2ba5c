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
//! The rules that keep bundles from being lost or duplicated are in docs/dtn.md. One file per
//! side: `dtnd.rs`, `to_hop.rs`, `outcome.rs`, `from_hop.rs`.

mod dtnd;
mod from_hop;
mod outcome;
mod to_hop;

use dtnd::ecla_task;
use from_hop::receiver_task;
use outcome::{events_task, failed};
use to_hop::{hopd_list, sender_task};

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
use crate::durable::write_durably;

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

/// Moves `path` into `state_dir/<sub>/`.
fn keep(shared: &Shared, path: &Path, sub: &str, why: &str) {
    let Some(name) = path.file_name() else { return };
    let to = shared.dir(sub).join(name);
    if let Err(e) = std::fs::rename(path, &to) {
        warn!(error = %e, path = %path.display(), why, "could not move a bundle copy");
    }
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
