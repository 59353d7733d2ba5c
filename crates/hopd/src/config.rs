//! The daemon's configuration file (TOML).
//!
//! Unknown keys are errors. [`Config::load`] reports problems with the file name, the line
//! and column, and a hint on how to fix them.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::path::{Path, PathBuf};

use hop_proto::hop::HopConfig;
use hop_wire::NodeId;
use serde::Deserialize;
use toml::Spanned;

/// Default UDP port of hopd.
pub const DEFAULT_PORT: u16 = 7470;
/// Default bound on bytes of blocks held in memory by the daemon's custody store.
pub const DEFAULT_MAX_MEMORY_BYTES: u64 = 256 * 1024 * 1024;
/// Default bound on bytes of custody storage on disk.
pub const DEFAULT_MAX_DISK_BYTES: u64 = 4 * 1024 * 1024 * 1024;
/// Default bound on peers (senders) for which replay state is kept.
pub const DEFAULT_MAX_PEERS: usize = 1024;
/// Default bound on concurrent incoming flows accepted at a destination.
pub const DEFAULT_MAX_INCOMING_FLOWS: usize = 256;
/// How long a relay holds a block in memory before writing it to disk: a block its next hop
/// takes within this never touches the disk (custody.rs).
pub const DEFAULT_CUSTODY_WRITE_DELAY: std::time::Duration = std::time::Duration::from_secs(1);
/// DSCP EF (46): Linux's 802.11 stack puts it in the voice access category (AC_VO). Default
/// for control datagrams: the Hop paper sends BSYNs and their micro-blocks "with link-layer
/// ARQ via the voice queue" (§3.6).
pub const DSCP_EF: u8 = 46;
/// DSCP CS1 (8): 802.11e background (AC_BK). Default for data: "Hop traffic is sent using the
/// lowest priority background queue" (§3.6).
pub const DSCP_CS1: u8 = 8;
/// Control datagrams wait for room at a full link like data (`link_control_when_full`).
/// Not from the papers (they had no link status); the lab's A/B is in docs/hopd.md.
pub const DEFAULT_LINK_CONTROL_WHEN_FULL: bool = false;

/// Which transport the daemon's flows use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum TransportKind {
    /// Hop: block-switched transfer (the default).
    #[default]
    Hop,
    /// HxH: hop-by-hop credit-based transport, for comparison.
    Hxh,
    /// ATP with the original parameters (ATP paper §II, Table I), for comparison.
    Atp,
    /// ATP with E = 0.04 s and κ = 0.5 (ATP paper §V-A2).
    AtpAggressive,
    /// Aggressive ATP plus immediate feedback and hop-count-based η (ATP paper §V-A3).
    AtpAdaptive,
}

impl TransportKind {
    /// Every kind, in the order the documentation lists them.
    pub const ALL: [TransportKind; 5] = [
        TransportKind::Hop,
        TransportKind::Hxh,
        TransportKind::Atp,
        TransportKind::AtpAggressive,
        TransportKind::AtpAdaptive,
    ];

    /// The name used in the configuration file.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Hop => "hop",
            TransportKind::Hxh => "hxh",
            TransportKind::Atp => "atp",
            TransportKind::AtpAggressive => "atp-aggressive",
            TransportKind::AtpAdaptive => "atp-adaptive",
        }
    }
}

/// How data-class datagrams reach the next hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LinkMode {
    /// Datagrams go to the next hop's address only.
    #[default]
    Unicast,
    /// Data datagrams go to the subnet's broadcast address, so every neighbour overhears them
    /// (Hop paper §3.3, virtual retransmission relies on overhearing).
    Broadcast,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    node_id: Option<Spanned<NodeId>>,
    listen: Spanned<String>,
    interface: Option<String>,
    #[serde(default)]
    link_mode: LinkMode,
    #[serde(default)]
    transport: TransportKind,
    broadcast_address: Option<Spanned<String>>,
    control_dscp: Option<Spanned<u8>>,
    data_dscp: Option<Spanned<u8>>,
    api_socket: Option<PathBuf>,
    api_group: Option<Spanned<String>>,
    metrics_listen: Option<Spanned<String>>,
    http_listen: Option<Spanned<String>>,
    discovery_address: Option<Spanned<String>>,
    discovery_addresses: Option<Spanned<Vec<Spanned<String>>>>,
    hello_interval: Option<Spanned<String>>,
    default_lifetime: Option<Spanned<String>>,
    log_level: Option<String>,
    #[serde(default)]
    neighbours: Vec<RawNeighbour>,
    #[serde(default)]
    routes: Vec<RawRoute>,
    #[serde(default)]
    kernel_routes: bool,
    batman_interface: Option<String>,
    #[serde(default)]
    overhear: bool,
    link_retries: Option<bool>,
    link_status_socket: Option<PathBuf>,
    link_queue_frames: Option<Spanned<u32>>,
    link_control_when_full: Option<Spanned<bool>>,
    #[serde(default)]
    hosts: Vec<RawNeighbour>,
    storage: RawStorage,
    security: RawSecurity,
    hop: Option<Spanned<toml::Table>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNeighbour {
    id: Spanned<NodeId>,
    address: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    destination: Spanned<NodeId>,
    next_hop: Spanned<NodeId>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStorage {
    dir: PathBuf,
    max_memory_bytes: Option<u64>,
    max_disk_bytes: Option<u64>,
    max_incoming_flows: Option<usize>,
    custody_write_delay: Option<Spanned<String>>,
    spool_thread: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecurity {
    mesh_key: Option<Spanned<String>>,
    mesh_key_file: Option<Spanned<PathBuf>>,
    max_peers: Option<usize>,
    encrypt: Option<bool>,
    cipher: Option<crate::auth::CipherSetting>,
    node_key_file: Option<Spanned<PathBuf>>,
    members_file: Option<Spanned<PathBuf>>,
    sessions: Option<Spanned<bool>>,
}

/// The IPv6 group hellos go to with `discovery_address = "auto"` (link-local scope).
pub const AUTO_DISCOVERY_GROUP: std::net::Ipv6Addr =
    std::net::Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x7470);

/// A neighbour: node id and UDP address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbour {
    pub id: NodeId,
    pub addr: SocketAddr,
}

/// A checked configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub node_id: NodeId,
    pub listen: SocketAddr,
    pub interface: Option<String>,
    pub link_mode: LinkMode,
    pub transport: TransportKind,
    pub broadcast_address: Option<SocketAddr>,
    /// DSCP of control datagrams (BSYN, BACK, end-to-end BACK); Linux maps it to the 802.11e
    /// access category of the frames.
    pub control_dscp: u8,
    /// DSCP of data datagrams.
    pub data_dscp: u8,
    pub api_socket: PathBuf,
    /// Members of this group (its id) may use the API socket (mode 0660); without it only
    /// the daemon's user can.
    pub api_gid: Option<u32>,
    pub metrics_listen: Option<SocketAddr>,
    /// The HTTP API (off unless set).
    pub http_listen: Option<SocketAddr>,
    /// Hellos go to this IPv4 broadcast address:port, and neighbours are learned from theirs
    /// (off unless set).
    pub discovery_address: Option<SocketAddr>,
    /// Every address hellos go to: `discovery_address`, or the IPv4 broadcast address of
    /// each mesh link of a node on several (`discovery_addresses`).
    pub discovery_addresses: Vec<SocketAddr>,
    /// `discovery_address = "auto"`: the addresses are those of `interface`, found by
    /// [`Config::resolve_discovery`] when hopd starts.
    pub discovery_auto: bool,
    pub hello_interval: std::time::Duration,
    /// The lifetime of a transfer sent without one (`hop send --lifetime`); none: it is
    /// tried until `[hop] give_up_after` without progress.
    pub default_lifetime: Option<std::time::Duration>,
    pub log_level: Option<String>,
    pub neighbours: Vec<Neighbour>,
    pub routes: BTreeMap<NodeId, NodeId>,
    pub kernel_routes: bool,
    /// Next hops from batman-adv's originator table of this interface (batman.rs).
    pub batman_interface: Option<String>,
    /// Read the unicast datagrams neighbours send each other from a packet socket
    /// (CAP_NET_RAW): HxH then uses passive feedback (HxH §3.2) and Hop caches what it hears.
    pub overhear: bool,
    /// Whether the link retries control frames (an 802.11 MAC does); unset: found from the
    /// interface at start (linkkind.rs). Decides `[hop] control_copies = "auto"`.
    pub link_retries: Option<bool>,
    /// A Unix datagram socket on which the link reports its transmit backlog
    /// ([`crate::linkstatus`]); hopd then keeps at most `link_queue_frames` frames queued there.
    pub link_status_socket: Option<PathBuf>,
    pub link_queue_frames: u32,
    /// While the link holds `link_queue_frames`, still send the control datagrams the
    /// transport has queued (acks, feedback), never data: they then wait behind no data
    /// frame in hopd (in the link they may take a higher access category, `control_dscp`).
    pub link_control_when_full: bool,
    /// IP addresses of nodes that are not neighbours (for kernel routes).
    pub hosts: Vec<(NodeId, IpAddr)>,
    pub storage_dir: PathBuf,
    pub max_memory_bytes: u64,
    pub max_disk_bytes: u64,
    pub max_incoming_flows: usize,
    /// A relay acknowledges a block at once and writes it to disk only if it still holds it
    /// after this long (`[storage] custody_write_delay`, default 1 s); zero: written before
    /// the acknowledgement (custody.rs).
    pub custody_write_delay: std::time::Duration,
    /// A destination writes and fsyncs its deliveries on a thread of its own, off the event
    /// loop (`[storage] spool_thread`, on by default; custody/spool_writer.rs).
    pub spool_thread: bool,
    /// The key every node seals with (none with `sessions`).
    pub mesh_key: Option<[u8; 32]>,
    /// Per-neighbour sessions instead of a mesh key (`[security] sessions`; session.rs).
    pub sessions: bool,
    pub max_peers: usize,
    /// This node's key pair (`[security] node_key_file`; identity.rs).
    pub node_key: Option<std::sync::Arc<crate::identity::NodeKey>>,
    /// The members file (`[security] members_file`), re-read on reload.
    pub members_file: Option<PathBuf>,
    /// The mesh's members, when a members file is given: only they are learned as
    /// neighbours and heard.
    pub members: Option<Vec<crate::identity::Member>>,
    /// Send bodies encrypted (`[security] encrypt`, default on); received datagrams may be
    /// either.
    pub encrypt: bool,
    /// The AEAD this node seals with (`[security] cipher`, default `auto`: AES-256-GCM on
    /// CPUs with AES instructions, ChaCha20-Poly1305 elsewhere); received datagrams may use
    /// either.
    pub cipher: crate::auth::CipherSetting,
    /// The Hop parameters: `[hop]` read as `HopConfig::from_toml` reads it (a preset and
    /// overrides), with the cache and flow bounds of `[storage]`.
    pub hop: HopConfig,
    /// File bytes the API gathers before its first hand-over to Hop (`[hop]
    /// first_block_bytes`, hopd's, not the protocol's).
    pub first_block_bytes: Option<usize>,
    /// `[hop] packet_payload_bytes` is in the file: hopd does not fit it to the path MTU.
    pub packet_payload_given: bool,
}

/// A configuration problem, located in the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}\n  hint: {hint}")]
pub struct ConfigError {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
    pub hint: String,
}

struct Ctx<'a> {
    file: &'a str,
    text: &'a str,
}

impl Ctx<'_> {
    fn err(&self, span: Option<Range<usize>>, message: String, hint: &str) -> ConfigError {
        let (line, column) = match span {
            Some(r) => line_col(self.text, r.start),
            None => (1, 1),
        };
        ConfigError {
            file: self.file.to_string(),
            line,
            column,
            message,
            hint: hint.to_string(),
        }
    }
}

/// 1-based line and column of byte `offset` in `text`.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text.as_bytes()[..offset];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let col = offset
        - before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |p| p + 1)
        + 1;
    (line, col)
}

fn hint_for_parse(msg: &str) -> &'static str {
    if msg.contains("unknown field") {
        "remove the key or fix its spelling; docs/hopd.md lists every key"
    } else if msg.contains("missing field") {
        "add the missing key; docs/hopd.md lists the required keys"
    } else if msg.contains("invalid type") {
        "give the value the type docs/hopd.md names (numbers unquoted, addresses quoted)"
    } else if msg.contains("unknown variant") {
        "use one of the values listed in the message"
    } else {
        "check the TOML syntax near this position"
    }
}

fn parse_addr(
    ctx: &Ctx<'_>,
    s: &Spanned<String>,
    what: &str,
    default_port: Option<u16>,
) -> Result<SocketAddr, ConfigError> {
    let v = s.get_ref().trim();
    if let Ok(a) = v.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let (Some(port), Ok(ip)) = (default_port, v.parse::<IpAddr>()) {
        return Ok(SocketAddr::new(ip, port));
    }
    Err(ctx.err(
        Some(s.span()),
        format!("{what}: `{v}` is not an IP address with port"),
        "write it as \"192.0.2.1:7470\" or \"[2001:db8::1]:7470\"",
    ))
}

/// Decode a 32-byte key from 64 hex digits (whitespace ignored).
/// The id of the group named `name` (or given as a number).
fn group_id(name: &str) -> Option<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        return Some(gid);
    }
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: getgrnam reads a NUL-terminated name and returns a pointer into static
    // storage (or null), read at once here; hopd reads its configuration on one thread.
    let g = unsafe { libc::getgrnam(c.as_ptr()) };
    if g.is_null() {
        return None;
    }
    // SAFETY: g is a valid group entry (checked non-null above).
    Some(unsafe { (*g).gr_gid })
}

/// The members in file `p` (identity.rs), or a message naming the file and line.
pub fn read_members(p: &Path) -> Result<Vec<crate::identity::Member>, String> {
    let text = std::fs::read_to_string(p)
        .map_err(|e| format!("cannot read members_file {}: {e}", p.display()))?;
    crate::identity::parse_members(&text)
        .map_err(|(line, m)| format!("{}:{line}: {m}", p.display()))
}

pub fn parse_hex_key(s: &str) -> Option<[u8; 32]> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if digits.len() != 64 {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, pair) in digits.chunks(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        key[i] = (hi * 16 + lo) as u8;
    }
    Some(key)
}

impl Config {
    /// Read and check a configuration file.
    /// With `discovery_address = "auto"`, find the discovery addresses on `interface`: its
    /// IPv4 broadcast addresses (the listening port), or with an IPv6 `listen` the group
    /// `ff02::7470` on it. An error names the interface and what it lacks.
    pub fn resolve_discovery(&mut self) -> Result<(), String> {
        if !self.discovery_auto {
            return Ok(());
        }
        let Some(ifname) = self.interface.clone() else {
            return Err("discovery_address = \"auto\" needs interface".into());
        };
        let port = self.listen.port();
        let mut found: Vec<SocketAddr> = if self.listen.is_ipv4() {
            crate::ifaddr::broadcasts(&ifname)
                .into_iter()
                .map(|b| SocketAddr::new(IpAddr::V4(b), port))
                .collect()
        } else {
            let group = SocketAddr::new(IpAddr::V6(AUTO_DISCOVERY_GROUP), port);
            let g = crate::socket::scoped(group, &ifname);
            match g {
                SocketAddr::V6(v6) if v6.scope_id() != 0 => vec![g],
                _ => vec![],
            }
        };
        if found.is_empty() {
            return Err(format!(
                "discovery_address = \"auto\": interface {ifname} has no {}; bring it up with an \
                 address, or give discovery_address",
                if self.listen.is_ipv4() {
                    "IPv4 address with a broadcast address"
                } else {
                    "index (is it there?)"
                }
            ));
        }
        if !self.listen.ip().is_unspecified() {
            // One socket hears the broadcasts of the one address listened on.
            found.truncate(1);
        }
        self.discovery_address = found.first().copied();
        self.discovery_addresses = found;
        Ok(())
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: 0,
            column: 0,
            message: format!("cannot read the file: {e}"),
            hint: "check the path and its permissions".into(),
        })?;
        Self::parse(&file, &text, path.parent().unwrap_or(Path::new(".")))
    }

    /// Check configuration `text`; `file` names it in errors and relative key files are
    /// resolved against `base`.
    pub fn parse(file: &str, text: &str, base: &Path) -> Result<Config, ConfigError> {
        let ctx = Ctx { file, text };
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let msg = e.message().to_string();
            ctx.err(e.span(), msg.clone(), hint_for_parse(&msg))
        })?;
        let Security {
            node_key,
            node_id,
            members_file,
            members,
            sessions,
            mesh_key,
        } = security::section(&ctx, &raw, base)?;
        let listen = parse_addr(&ctx, &raw.listen, "listen", Some(DEFAULT_PORT))?;
        // A link-wide destination (IPv4 broadcast, IPv6 multicast group) in `listen`'s family;
        // an IPv6 link-local group is scoped to `interface`.
        let link_wide = |s: &Spanned<String>, key: &str, a: SocketAddr| {
            if a.is_ipv4() != listen.is_ipv4() {
                return Err(ctx.err(
                    Some(s.span()),
                    format!("{key} {a} is not in listen's address family ({})", listen.ip()),
                    "use IPv4 for both (a subnet broadcast address) or IPv6 for both (a multicast group such as [ff02::7470]:7470 with listen = \"[::]:7470\")",
                ));
            }
            match a {
                SocketAddr::V4(_) => Ok(a),
                SocketAddr::V6(v6) if !v6.ip().is_multicast() => Err(ctx.err(
                    Some(s.span()),
                    format!("{key} {a}: IPv6 has no broadcast; give a multicast group"),
                    "e.g. \"[ff02::7470]:7470\" (link-local scope) together with interface = \"<mesh interface>\"",
                )),
                SocketAddr::V6(v6) => {
                    let link_local = v6.ip().segments()[0] & 0x000f == 2;
                    match (&raw.interface, link_local) {
                        (Some(ifname), _) => Ok(crate::socket::scoped(a, ifname)),
                        (None, true) => Err(ctx.err(
                            Some(s.span()),
                            format!("{key} {a} is a link-local group: it needs the interface it is on"),
                            "add interface = \"<mesh interface>\" (e.g. \"wlan0\")",
                        )),
                        (None, false) => Ok(a),
                    }
                }
            }
        };
        let broadcast_address = match &raw.broadcast_address {
            Some(b) => Some(link_wide(
                b,
                "broadcast_address",
                parse_addr(&ctx, b, "broadcast_address", Some(listen.port()))?,
            )?),
            None => None,
        };
        if raw.link_mode == LinkMode::Broadcast && broadcast_address.is_none() {
            return Err(ctx.err(
                None,
                "link_mode = \"broadcast\" needs broadcast_address".into(),
                "add broadcast_address = \"<subnet broadcast>:<port>\", e.g. \"10.0.0.255:7470\"",
            ));
        }
        let dscp = |v: &Option<Spanned<u8>>, key: &str, default: u8| match v {
            None => Ok(default),
            Some(s) if *s.get_ref() <= 63 => Ok(*s.get_ref()),
            Some(s) => Err(ctx.err(
                Some(s.span()),
                format!("{key} = {} is not a DSCP", s.get_ref()),
                "use 0..63, e.g. 46 (EF, 802.11e voice), 0 (best effort) or 8 (CS1, background)",
            )),
        };
        let control_dscp = dscp(&raw.control_dscp, "control_dscp", DSCP_EF)?;
        let data_dscp = dscp(&raw.data_dscp, "data_dscp", DSCP_CS1)?;
        let link_queue_frames = match &raw.link_queue_frames {
            None => crate::linkstatus::DEFAULT_QUEUE_FRAMES,
            Some(f) if (1..=1024).contains(f.get_ref()) => *f.get_ref(),
            Some(f) => {
                return Err(ctx.err(
                    Some(f.span()),
                    format!("link_queue_frames = {} is out of range", f.get_ref()),
                    "use 1..1024 frames (the default is 4)",
                ))
            }
        };
        if raw.link_queue_frames.is_some() && raw.link_status_socket.is_none() {
            return Err(ctx.err(
                raw.link_queue_frames.as_ref().map(|f| f.span()),
                "link_queue_frames needs link_status_socket".into(),
                "add link_status_socket = \"/run/...\" (where the link reports its backlog), or remove the key",
            ));
        }
        if raw.link_control_when_full.is_some() && raw.link_status_socket.is_none() {
            return Err(ctx.err(
                raw.link_control_when_full.as_ref().map(|f| f.span()),
                "link_control_when_full needs link_status_socket".into(),
                "add link_status_socket = \"/run/...\" (where the link reports its backlog), or remove the key",
            ));
        }
        let link_control_when_full = raw
            .link_control_when_full
            .as_ref()
            .map_or(DEFAULT_LINK_CONTROL_WHEN_FULL, |f| *f.get_ref());
        let metrics_listen = match &raw.metrics_listen {
            Some(m) => Some(parse_addr(&ctx, m, "metrics_listen", None)?),
            None => None,
        };
        let http_listen = match &raw.http_listen {
            Some(m) => Some(parse_addr(&ctx, m, "http_listen", None)?),
            None => None,
        };
        // "auto": the mesh interface's own broadcast addresses, found at start.
        let discovery_auto = raw
            .discovery_address
            .as_ref()
            .is_some_and(|m| m.get_ref() == "auto");
        if let (true, Some(m)) = (
            discovery_auto && raw.interface.is_none(),
            &raw.discovery_address,
        ) {
            return Err(ctx.err(
                Some(m.span()),
                "discovery_address = \"auto\" needs the mesh interface".into(),
                "add interface = \"<mesh interface>\" (e.g. \"wlan0\"), or give the link's broadcast address",
            ));
        }
        let discovery_address = match &raw.discovery_address {
            Some(_) if discovery_auto => None,
            Some(m) => {
                let a = parse_addr(&ctx, m, "discovery_address", None)?;
                Some(link_wide(m, "discovery_address", a)?)
            }
            None => None,
        };
        // A node on several mesh links says hello on each: IPv4 broadcast addresses, heard
        // by a socket listening on the wildcard address.
        let mut discovery_addresses: Vec<SocketAddr> = discovery_address.into_iter().collect();
        if let Some(list) = &raw.discovery_addresses {
            if raw.discovery_address.is_some() {
                return Err(ctx.err(
                    Some(list.span()),
                    "both discovery_address and discovery_addresses are set".into(),
                    "keep one: discovery_addresses lists every link's broadcast address",
                ));
            }
            if !listen.ip().is_unspecified() || !listen.is_ipv4() || list.get_ref().is_empty() {
                return Err(ctx.err(
                    Some(list.span()),
                    "discovery_addresses needs listen on the IPv4 wildcard address".into(),
                    "set listen = \"0.0.0.0:<port>\" (the socket then hears every link's broadcasts), and list at least one address",
                ));
            }
            for m in list.get_ref() {
                let a = parse_addr(&ctx, m, "discovery_addresses", None)?;
                discovery_addresses.push(link_wide(m, "discovery_addresses", a)?);
            }
        }
        let discovery_address = discovery_addresses.first().copied();
        let default_lifetime = match &raw.default_lifetime {
            None => None,
            Some(l) => {
                let d = humantime::parse_duration(l.get_ref())
                    .ok()
                    .filter(|d| *d >= std::time::Duration::from_secs(1))
                    .ok_or_else(|| {
                        ctx.err(
                            Some(l.span()),
                            format!(
                                "default_lifetime = {:?} is not a duration of 1s or more",
                                l.get_ref()
                            ),
                            "a duration such as \"3d\" or \"90m\"",
                        )
                    })?;
                if raw.transport != TransportKind::Hop {
                    return Err(ctx.err(
                        Some(l.span()),
                        "default_lifetime needs transport = \"hop\"".into(),
                        "remove it, or run Hop",
                    ));
                }
                Some(d)
            }
        };
        let hello_interval = match &raw.hello_interval {
            None => std::time::Duration::from_secs(5),
            Some(h) => humantime::parse_duration(h.get_ref())
                .ok()
                .filter(|d| *d >= std::time::Duration::from_millis(100))
                .ok_or_else(|| {
                    ctx.err(
                        Some(h.span()),
                        format!(
                            "hello_interval = {:?} is not a duration of 100ms or more",
                            h.get_ref()
                        ),
                        "a duration such as \"5s\"",
                    )
                })?,
        };
        let mut neighbours: Vec<Neighbour> = Vec::new();
        for n in &raw.neighbours {
            let id = *n.id.get_ref();
            if id == node_id {
                return Err(ctx.err(
                    Some(n.id.span()),
                    format!("neighbour {id} is this node itself"),
                    "remove the entry or correct node_id",
                ));
            }
            if neighbours.iter().any(|x| x.id == id) {
                return Err(ctx.err(
                    Some(n.id.span()),
                    format!("neighbour {id} is listed twice"),
                    "keep one entry per neighbour id",
                ));
            }
            let addr = parse_addr(&ctx, &n.address, "neighbour address", Some(DEFAULT_PORT))?;
            neighbours.push(Neighbour { id, addr });
        }
        let mut routes = BTreeMap::new();
        for r in &raw.routes {
            let dst = *r.destination.get_ref();
            let nh = *r.next_hop.get_ref();
            if !neighbours.iter().any(|n| n.id == nh) {
                return Err(ctx.err(
                    Some(r.next_hop.span()),
                    format!("route to {dst}: next hop {nh} is not a neighbour"),
                    "add a [[neighbours]] entry for the next hop, or fix next_hop",
                ));
            }
            if dst == node_id {
                return Err(ctx.err(
                    Some(r.destination.span()),
                    format!("route to {dst}: that is this node"),
                    "remove the route",
                ));
            }
            if routes.insert(dst, nh).is_some() {
                return Err(ctx.err(
                    Some(r.destination.span()),
                    format!("two routes to destination {dst}"),
                    "keep one route per destination",
                ));
            }
        }
        let mut hosts = Vec::new();
        for h in &raw.hosts {
            let addr = parse_addr(&ctx, &h.address, "host address", Some(DEFAULT_PORT))?;
            hosts.push((*h.id.get_ref(), addr.ip()));
        }
        let max_memory_bytes = raw
            .storage
            .max_memory_bytes
            .unwrap_or(DEFAULT_MAX_MEMORY_BYTES);
        let max_incoming_flows = raw
            .storage
            .max_incoming_flows
            .unwrap_or(DEFAULT_MAX_INCOMING_FLOWS);
        let custody_write_delay = match &raw.storage.custody_write_delay {
            None => DEFAULT_CUSTODY_WRITE_DELAY,
            Some(d) => humantime::parse_duration(d.get_ref())
                .ok()
                .or_else(|| (d.get_ref().trim() == "0").then_some(std::time::Duration::ZERO))
                .filter(|d| *d <= std::time::Duration::from_secs(3600))
                .ok_or_else(|| {
                    ctx.err(
                        Some(d.span()),
                        format!(
                            "custody_write_delay = {:?} is not a duration of at most 1h",
                            d.get_ref()
                        ),
                        "a duration such as \"1s\", or \"0s\" to write every block before acknowledging it",
                    )
                })?,
        };
        let (hop, first_block_bytes, packet_payload_given) = hop_section(
            &ctx,
            raw.hop,
            raw.link_status_socket.is_some(),
            max_memory_bytes,
            max_incoming_flows,
        )?;
        let storage_dir = base.join(&raw.storage.dir);
        let api_socket = raw
            .api_socket
            .map(|p| base.join(p))
            .unwrap_or_else(|| storage_dir.join("hopd.sock"));
        let api_gid = match raw.api_group {
            None => None,
            Some(g) => Some(group_id(g.get_ref()).ok_or_else(|| {
                ctx.err(
                    Some(g.span()),
                    format!("api_group: no group named `{}`", g.get_ref()),
                    "create it (groupadd hop) or name an existing group; see docs/hopd.md",
                )
            })?),
        };
        Ok(Config {
            node_id,
            listen,
            interface: raw.interface,
            link_mode: raw.link_mode,
            transport: raw.transport,
            broadcast_address,
            control_dscp,
            data_dscp,
            api_socket,
            api_gid,
            metrics_listen,
            http_listen,
            discovery_address,
            discovery_addresses,
            discovery_auto,
            hello_interval,
            default_lifetime,
            log_level: raw.log_level,
            neighbours,
            routes,
            kernel_routes: raw.kernel_routes,
            batman_interface: raw.batman_interface.clone(),
            overhear: raw.overhear,
            link_retries: raw.link_retries,
            link_status_socket: raw.link_status_socket,
            link_queue_frames,
            link_control_when_full,
            hosts,
            storage_dir,
            max_memory_bytes,
            max_disk_bytes: raw.storage.max_disk_bytes.unwrap_or(DEFAULT_MAX_DISK_BYTES),
            max_incoming_flows,
            custody_write_delay,
            spool_thread: raw.storage.spool_thread.unwrap_or(true),
            mesh_key,
            sessions,
            max_peers: raw.security.max_peers.unwrap_or(DEFAULT_MAX_PEERS),
            node_key,
            members_file,
            members,
            encrypt: raw.security.encrypt.unwrap_or(true),
            cipher: raw.security.cipher.unwrap_or_default(),
            hop,
            first_block_bytes,
            packet_payload_given,
        })
    }

    /// The neighbour with UDP address `addr`'s IP, if any.
    pub fn neighbour_by_ip(&self, ip: IpAddr) -> Option<NodeId> {
        self.neighbours
            .iter()
            .find(|n| n.addr.ip() == ip)
            .map(|n| n.id)
    }

    pub fn neighbour_addr(&self, id: NodeId) -> Option<SocketAddr> {
        self.neighbours.iter().find(|n| n.id == id).map(|n| n.addr)
    }
}

/// The `[hop]` section: `HopConfig::from_toml` (a `preset` and overrides), less hopd's own
/// `first_block_bytes`, with the bounds `[storage]` sets. Without a `link_window_packets`
/// of its own, a node whose link reports its backlog (`link_status_socket`) runs without a
/// link window: hopd hands the link a frame only while it holds fewer than
/// `link_queue_frames`, as the paper's driver queue pushed back (§4.1), and the link window,
/// which bounds that queue from BACKs when nothing else does
/// (docs/design/hop.md#link-window), would only add a BSYN/BACK round per window.
fn hop_section(
    ctx: &Ctx<'_>,
    section: Option<Spanned<toml::Table>>,
    link_status: bool,
    max_memory_bytes: u64,
    max_incoming_flows: usize,
) -> Result<(HopConfig, Option<usize>, bool), ConfigError> {
    let span = section.as_ref().map(|s| s.span());
    let mut table = section.map(Spanned::into_inner).unwrap_or_default();
    for (key, instead) in [
        ("cache_limit_bytes", "[storage] max_memory_bytes"),
        ("max_flows", "[storage] max_incoming_flows"),
    ] {
        if table.contains_key(key) {
            return Err(ctx.err(
                span.clone(),
                format!("[hop] {key} is set by hopd"),
                &format!("remove it and set {instead}"),
            ));
        }
    }
    let first_block_bytes = match table.remove("first_block_bytes") {
        None => None,
        Some(v) => Some(
            v.as_integer()
                .and_then(|i| usize::try_from(i).ok())
                .ok_or_else(|| {
                    ctx.err(
                        span.clone(),
                        format!("[hop] first_block_bytes = {v} is not a byte count"),
                        "a whole number of bytes, 0 or more",
                    )
                })?,
        ),
    };
    let window_given = table.contains_key("link_window_packets");
    let payload_given = table.contains_key("packet_payload_bytes");
    let sending_given = table.contains_key("max_sending_flows");
    let mut hop = HopConfig::from_toml(&table).map_err(|e| {
        ctx.err(
            span.clone(),
            format!("[hop]: {e}"),
            "durations are strings such as \"200ms\" or \"60s\"; see docs/hopd.md for the keys",
        )
    })?;
    if !(64..=65000).contains(&hop.packet_payload_bytes) {
        return Err(ctx.err(
            span,
            format!(
                "hop.packet_payload_bytes = {} is out of range",
                hop.packet_payload_bytes
            ),
            "use a value between 64 and 65000 (fit the link MTU, e.g. 1400)",
        ));
    }
    if link_status && !window_given {
        hop.link_window_packets = 0;
    }
    hop.cache_limit_bytes = max_memory_bytes;
    hop.max_flows = max_incoming_flows;
    if !sending_given {
        // A router's own flows leave room to relay others': a quarter of the flow table
        // sends at once, the rest waits (docs/design/hop.md#flows-waiting-to-start).
        hop.max_sending_flows = hop.max_sending_flows.min((max_incoming_flows / 4).max(1));
    }
    Ok((hop, first_block_bytes, payload_given))
}

mod security;
use security::Security;

#[cfg(test)]
mod tests;
