//! The commands API clients (the server and the route watcher) send to the daemon core, and
//! what the core answers with.

use std::path::PathBuf;

use bytes::Bytes;
use hop_proto::{FlowKey, NodeId};
use tokio::sync::{mpsc, oneshot};

use crate::api::ErrorCode;

/// An update about a local outgoing flow, for the API client that opened it.
#[derive(Debug)]
pub enum FlowUpdate {
    /// The destination acknowledged the flow's first `bytes` bytes end to end.
    Acked {
        bytes: u64,
    },
    /// Why the transfer waits (`Some`), or that it moves again (`None`).
    Waiting {
        reason: Option<String>,
    },
    Complete {
        bytes: u64,
    },
    Failed {
        reason: String,
    },
}

/// A verified file waiting for a receiving application.
#[derive(Debug, Clone)]
pub struct InboxEntry {
    pub flow: String,
    pub from: NodeId,
    pub path: PathBuf,
    pub name: String,
    pub size: u64,
    pub content_offset: u64,
    pub blake3: String,
    /// The service it was sent to (none: the default inbox).
    pub service: Option<String>,
}

/// A flow the daemon opened for a sending client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub flow: FlowKey,
    /// File bytes to gather before handing the first of them to the transport: Hop cuts a
    /// block from whatever the source holds and never waits for more (§4.2), so a file's
    /// first block is only as large as the first hand-over. The client has announced the
    /// whole file and streams it over a local socket, so gathering costs a few copies, not a
    /// wait for data that may never come. 0: hand bytes over as they arrive.
    pub first_bytes: usize,
}

/// Commands from API clients to the core task.
pub enum Cmd {
    Open {
        to: NodeId,
        /// The file's name and size, for `list`.
        name: String,
        size: u64,
        /// The transfer's lifetime (`hop send --lifetime`).
        lifetime: Option<std::time::Duration>,
        /// The transfer's class (`hop send --priority`).
        priority: crate::api::Priority,
        /// The client leaves the transfer to the daemon, which keeps it on disk.
        detach: bool,
        service: Option<String>,
        reply: oneshot::Sender<Result<Opened, (ErrorCode, String)>>,
        updates: mpsc::UnboundedSender<FlowUpdate>,
    },
    /// Application bytes for a flow; `last`: no more follow, the flow finishes after them.
    /// The last bytes and the finish come as one command so that the transport cuts the
    /// flow's last block with them: a finish handed over after the transport had already
    /// formed that block would cost a further, empty block (a BSYN/BACK round per hop, and
    /// for a small file a second round before the destination delivers it).
    Data {
        flow: FlowKey,
        data: Bytes,
        done: oneshot::Sender<()>,
        last: bool,
    },
    /// The sending client went away before the end: the flow is aborted.
    Abort {
        flow: FlowKey,
    },
    /// The sending client leaves the flow to the daemon (`detach`).
    Detach {
        flow: FlowKey,
    },
    /// `hop cancel`: abort an outgoing flow named by its id.
    Cancel {
        flow: String,
        reply: oneshot::Sender<Result<(), String>>,
    },
    /// SIGHUP or `hop reload`: re-read the configuration file.
    Reload {
        reply: Option<oneshot::Sender<Result<super::reload::ReloadReport, String>>>,
    },
    /// Subscribe to the daemon's events (HTTP API, `/v1/events`).
    Events {
        reply: oneshot::Sender<tokio::sync::broadcast::Receiver<serde_json::Value>>,
    },
    /// The files waiting in the inbox (HTTP API).
    Inbox {
        reply: oneshot::Sender<Vec<InboxEntry>>,
    },
    /// `hop list`.
    List {
        reply: oneshot::Sender<(Vec<crate::api::OutgoingFlow>, crate::api::HeldHere)>,
    },
    /// A receiving client, for the files of one service (none: the default inbox).
    Subscribe {
        tx: mpsc::UnboundedSender<InboxEntry>,
        service: Option<String>,
    },
    Ack {
        flow: String,
    },
    /// Files offered to a receiving client that it did not acknowledge (it left, or took
    /// fewer files than it was offered): offered to the other clients again.
    Return {
        entries: Vec<InboxEntry>,
    },
    Status {
        reply: oneshot::Sender<serde_json::Value>,
    },
    Metrics {
        reply: oneshot::Sender<String>,
    },
    /// The kernel's IPv4 routes, read again after a change.
    Routes {
        routes: Vec<crate::netlink::Route>,
    },
    /// batman-adv's originator table, read again (batman.rs).
    Originators {
        table: Vec<crate::batman::Originator>,
    },
}
