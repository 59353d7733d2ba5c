//! The `[security]` section and the node's identity: its key and id, the members, sessions
//! or the mesh key (docs/hopd.md, Node keys and members, Sessions, Datagrams on the wire).

use std::path::{Path, PathBuf};

use hop_wire::NodeId;

use super::{parse_hex_key, read_members, ConfigError, Ctx, RawConfig};

/// What `[security]` (and `node_id`) say, checked together.
pub(super) struct Security {
    pub(super) node_key: Option<std::sync::Arc<crate::identity::NodeKey>>,
    pub(super) node_id: NodeId,
    pub(super) members_file: Option<PathBuf>,
    pub(super) members: Option<Vec<crate::identity::Member>>,
    pub(super) sessions: bool,
    pub(super) mesh_key: Option<[u8; 32]>,
}

/// Read the node's key, id, members file, sessions and mesh key of `raw`; relative paths
/// start at `base`.
pub(super) fn section(ctx: &Ctx, raw: &RawConfig, base: &Path) -> Result<Security, ConfigError> {
    let node_key = match &raw.security.node_key_file {
        Some(f) => {
            let p = base.join(f.get_ref());
            let k = crate::identity::read_node_key(&p).map_err(|e| {
                ctx.err(
                    Some(f.span()),
                    e,
                    "create one with `hop keygen --out <file>` (relative paths start at the config file's folder)",
                )
            })?;
            Some(std::sync::Arc::new(k))
        }
        None => None,
    };
    let node_id = match (&raw.node_id, &node_key) {
        (Some(n), Some(k)) if *n.get_ref() != k.node_id() => {
            return Err(ctx.err(
                Some(n.span()),
                format!(
                    "node_id {} is not the id of this node's key ({})",
                    n.get_ref(),
                    k.node_id()
                ),
                "remove node_id (a node with a key takes its key's id) or give the key's id",
            ))
        }
        (Some(n), _) => *n.get_ref(),
        (None, Some(k)) => k.node_id(),
        (None, None) => {
            return Err(ctx.err(
                None,
                "the node needs an id: node_id, or [security] node_key_file".into(),
                "generate a key with `hop keygen --out /etc/hopd/node.key` and set node_key_file, or add node_id = <1..4294967294>",
            ))
        }
    };
    if node_id == hop_wire::BROADCAST_NODE || node_id == 0 {
        return Err(ctx.err(
            raw.node_id.as_ref().map(|n| n.span()),
            format!("node_id {node_id} is reserved"),
            "pick a node id between 1 and 4294967294",
        ));
    }
    let members_file = raw
        .security
        .members_file
        .as_ref()
        .map(|f| base.join(f.get_ref()));
    let members = match (&raw.security.members_file, &members_file) {
        (Some(f), Some(p)) => {
            if node_key.is_none() {
                return Err(ctx.err(
                    Some(f.span()),
                    "members_file needs this node's own key".into(),
                    "add node_key_file (create it with `hop keygen --out <file>`)",
                ));
            }
            Some(read_members(p).map_err(|e| {
                ctx.err(
                    Some(f.span()),
                    e,
                    "one member per line: <64 hex digits of its public key> [name]; `hop admit KEY` adds one",
                )
            })?)
        }
        _ => None,
    };
    let sessions = raw.security.sessions.as_ref().is_some_and(|s| *s.get_ref());
    if let Some(s) = raw.security.sessions.as_ref().filter(|s| *s.get_ref()) {
        if members.is_none() {
            return Err(ctx.err(
                Some(s.span()),
                "sessions need this node's key and a members file".into(),
                "add node_key_file (`hop keygen --out /etc/hopd/node.key`) and members_file (`hop admit KEY` on each node)",
            ));
        }
        if let Some(k) = raw.security.mesh_key_file.as_ref().map(|f| f.span()).or(raw
            .security
            .mesh_key
            .as_ref()
            .map(|k| k.span()))
        {
            return Err(ctx.err(
                Some(k),
                "sessions replace the mesh key: both are set".into(),
                "remove mesh_key / mesh_key_file (every node of the mesh needs sessions = true)",
            ));
        }
    }
    let mesh_key = match (&raw.security.mesh_key, &raw.security.mesh_key_file) {
        (None, None) if sessions => None,
        (Some(k), None) => Some(parse_hex_key(k.get_ref()).ok_or_else(|| {
            ctx.err(
                Some(k.span()),
                "mesh_key is not 64 hex digits".into(),
                "generate one with `head -c32 /dev/urandom | xxd -p -c64`",
            )
        })?),
        (None, Some(f)) => {
            let p = base.join(f.get_ref());
            let s = std::fs::read_to_string(&p).map_err(|e| {
                ctx.err(
                    Some(f.span()),
                    format!("cannot read mesh_key_file {}: {e}", p.display()),
                    "check the path (relative paths start at the config file's folder)",
                )
            })?;
            Some(parse_hex_key(&s).ok_or_else(|| {
                ctx.err(
                    Some(f.span()),
                    format!("{} does not hold 64 hex digits", p.display()),
                    "write the key as 64 hex digits, e.g. `head -c32 /dev/urandom | xxd -p -c64`",
                )
            })?)
        }
        (Some(k), Some(_)) => {
            return Err(ctx.err(
                Some(k.span()),
                "both mesh_key and mesh_key_file are set".into(),
                "keep exactly one of them",
            ))
        }
        (None, None) => return Err(ctx.err(
            None,
            "[security] needs mesh_key or mesh_key_file, or sessions".into(),
            "add mesh_key_file = \"/etc/hopd/mesh.key\" (64 hex digits, same on every node), or node keys, members and sessions = true (docs/hopd.md, Node keys and members)",
        )),
    };
    Ok(Security {
        node_key,
        node_id,
        members_file,
        members,
        sessions,
        mesh_key,
    })
}
