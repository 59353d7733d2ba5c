//! The local socket API (Unix domain socket), version 1.
//!
//! Every message is a frame: a 4-byte big-endian length, then that many bytes. Control frames
//! hold one JSON object; data frames (file content) hold raw bytes and follow the control
//! frame that announces them, ending with an empty frame. See `docs/hopd.md`.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Version of this API; requests carry it in `v`.
pub const API_VERSION: u32 = 1;
/// Largest frame accepted.
pub const MAX_FRAME: usize = 4 * 1024 * 1024;
/// Size of data frames written by the daemon and by `hop`.
pub const DATA_CHUNK: usize = 256 * 1024;

/// A request from an application.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// Send a file to node `to`; `size` bytes of data frames follow, then an empty frame.
    Send {
        v: u32,
        to: u32,
        name: String,
        size: u64,
        /// Leave the transfer to the daemon once every byte is handed over (the reply is
        /// `queued`); without it a client that goes away before the end-to-end
        /// acknowledgement cancels the transfer.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        detach: bool,
        /// Seconds the transfer is tried, however long its path is down; it fails as
        /// expired then (Hop only). Without it: the node's `give_up_after` without progress.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lifetime_s: Option<u64>,
        /// The service (endpoint) at the destination the file is for; none: its default
        /// inbox.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        service: Option<String>,
        /// The transfer's class (Hop); none: normal.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        priority: Option<Priority>,
    },
    /// Receive files: the daemon sends each complete, verified file as a `file` reply plus
    /// data frames; the client answers `ack` once it has stored it.
    Recv {
        v: u32,
        /// Only files for this service; none: files sent without a service.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        service: Option<String>,
    },
    /// Confirms a received file; the daemon then deletes its copy.
    Ack { v: u32, flow: String },
    /// Daemon status.
    Status { v: u32 },
    /// This node's outgoing transfers (the reply is `flows`).
    List { v: u32 },
    /// Cancel an outgoing transfer: it is aborted along its path and never delivered.
    Cancel { v: u32, flow: String },
    /// Re-read the daemon's configuration file (as SIGHUP does).
    Reload { v: u32 },
    /// Follow the daemon's events: one control frame per event (a JSON object with `event`:
    /// `complete`, `failed`, `cancelled`, `file`, `neighbour_silent`, `neighbour_returned`,
    /// or `lagged` with `missed` when the client fell behind), until the client closes.
    Events { v: u32 },
}

/// A transfer's class: every node on its path sends the data of a higher class first (the
/// Bundle Protocol's bulk, normal and expedited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    Bulk,
    #[default]
    Normal,
    Expedited,
}

impl Priority {
    /// The value in Hop's header (hop-wire `PRIORITY_*`).
    pub fn wire(self) -> u8 {
        match self {
            Priority::Bulk => hop_wire::hop::PRIORITY_BULK,
            Priority::Normal => hop_wire::hop::PRIORITY_NORMAL,
            Priority::Expedited => hop_wire::hop::PRIORITY_EXPEDITED,
        }
    }
}

/// What a node holds of transfers between other nodes (as a relay), for `list`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct HeldHere {
    /// Relayed flows with state on this node.
    pub flows: u64,
    /// Blocks in custody on disk, and their bytes.
    pub blocks: u64,
    pub bytes: u64,
}

/// One outgoing transfer, as `list` reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OutgoingFlow {
    pub flow: String,
    pub to: u32,
    pub name: String,
    /// File bytes.
    pub size: u64,
    /// Bytes the transport took so far (file, header and hash).
    pub bytes_accepted: u64,
    /// Of those, the bytes the destination acknowledged end to end (Hop).
    pub bytes_acked: u64,
    pub age_s: u64,
    /// Seconds until its lifetime ends, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_s: Option<u64>,
    /// A client waits for its result (false: detached, or its client left).
    pub attached: bool,
    #[serde(default)]
    pub priority: Priority,
}

/// A reply from the daemon.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Reply {
    /// The flow was opened.
    Accepted {
        flow: String,
    },
    /// Bytes handed to the transport so far.
    Progress {
        bytes: u64,
        /// File bytes the destination acknowledged end to end (in order), from transports
        /// that report it (Hop).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        acked: Option<u64>,
    },
    /// Why the transfer waits (e.g. its next hop answers nothing), or, with no reason, that
    /// it moves again.
    Waiting {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Every byte was handed to the daemon, which carries on with the transfer alone
    /// (`send` with `detach`).
    Queued {
        flow: String,
        bytes: u64,
    },
    /// The outgoing transfers (`list`), and what this node holds of other nodes' transfers.
    Flows {
        outgoing: Vec<OutgoingFlow>,
        #[serde(default)]
        held: HeldHere,
    },
    /// The transfer was cancelled (`cancel`).
    Cancelled {
        flow: String,
    },
    /// The configuration was re-read (`reload`): the settings applied, and those that
    /// changed but take effect at the next start.
    Reloaded {
        applied: Vec<String>,
        need_restart: Vec<String>,
    },
    /// The destination acknowledged every byte end to end.
    Complete {
        flow: String,
        bytes: u64,
    },
    /// A received file follows as data frames.
    File {
        flow: String,
        from: u32,
        name: String,
        size: u64,
        blake3: String,
    },
    Status(serde_json::Value),
    Error {
        code: ErrorCode,
        message: String,
    },
}

/// Error classes, each with its own exit status in `hop`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    BadRequest,
    UnknownNode,
    NoSpace,
    Failed,
    Internal,
}

/// `hop` exit statuses (documented in docs/hopd.md).
pub mod exit {
    /// Success.
    pub const OK: i32 = 0;
    /// A transfer failed (timeout, no route, refused, aborted).
    pub const FAILED: i32 = 1;
    /// Bad command line or unreadable input file.
    pub const USAGE: i32 = 2;
    /// The daemon is not running or its socket cannot be reached.
    pub const NO_DAEMON: i32 = 3;
    /// The destination node is unknown to the daemon.
    pub const UNKNOWN_NODE: i32 = 4;
    /// Out of space (local disk, or the daemon's storage limits).
    pub const NO_SPACE: i32 = 5;
    /// Integrity check failed or the daemon broke the protocol.
    pub const PROTOCOL: i32 = 6;
}

impl ErrorCode {
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorCode::BadRequest => exit::USAGE,
            ErrorCode::UnknownNode => exit::UNKNOWN_NODE,
            ErrorCode::NoSpace => exit::NO_SPACE,
            ErrorCode::Failed => exit::FAILED,
            ErrorCode::Internal => exit::PROTOCOL,
        }
    }
}

/// Read one frame; `Ok(None)` at a clean end of stream.
pub async fn read_frame<R: AsyncReadExt + Unpin>(r: &mut R) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds {MAX_FRAME}"),
        ));
    }
    // Read into spare capacity: a data frame (up to MAX_FRAME) is not zeroed first.
    let mut buf = Vec::with_capacity(len);
    (&mut *r).take(len as u64).read_to_end(&mut buf).await?;
    if buf.len() < len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("frame ended after {} of {len} bytes", buf.len()),
        ));
    }
    Ok(Some(buf))
}

pub async fn write_frame<W: AsyncWriteExt + Unpin>(w: &mut W, data: &[u8]) -> std::io::Result<()> {
    w.write_all(&(data.len() as u32).to_be_bytes()).await?;
    w.write_all(data).await?;
    Ok(())
}

pub async fn write_json<W: AsyncWriteExt + Unpin, T: Serialize>(
    w: &mut W,
    msg: &T,
) -> std::io::Result<()> {
    let data = serde_json::to_vec(msg)?;
    write_frame(w, &data).await
}

pub fn parse_reply(frame: &[u8]) -> std::io::Result<Reply> {
    serde_json::from_slice(frame)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_json_shape() {
        let r = Request::Send {
            v: 1,
            to: 3,
            name: "f".into(),
            size: 9,
            detach: false,
            lifetime_s: None,
            service: None,
            priority: None,
        };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(s, r#"{"op":"send","v":1,"to":3,"name":"f","size":9}"#);
        assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r);
        assert!(serde_json::from_str::<Request>(r#"{"op":"status","v":1,"x":2}"#).is_err());
        let d: Request =
            serde_json::from_str(r#"{"op":"send","v":1,"to":3,"name":"f","size":9,"detach":true}"#)
                .unwrap();
        assert!(matches!(d, Request::Send { detach: true, .. }));
        let c = Request::Cancel {
            v: 1,
            flow: "1:2a".into(),
        };
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"op":"cancel","v":1,"flow":"1:2a"}"#
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn frames_round_trip() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        write_frame(&mut a, b"abc").await.unwrap();
        write_frame(&mut a, b"").await.unwrap();
        drop(a);
        assert_eq!(read_frame(&mut b).await.unwrap().unwrap(), b"abc");
        assert_eq!(read_frame(&mut b).await.unwrap().unwrap(), b"");
        assert_eq!(read_frame(&mut b).await.unwrap(), None);
    }
}
