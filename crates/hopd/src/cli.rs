//! The command lines of `hop` and `hopd`, here so that one place defines them for the
//! binaries, their manual pages and their shell completions (`hop generate`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Send and receive files over a Hop mesh through the local hopd.
#[derive(Parser, Debug)]
#[command(name = "hop", version)]
pub struct Args {
    /// The daemon's API socket.
    #[arg(
        long,
        env = "HOPD_SOCKET",
        default_value = "/var/lib/hopd/hopd.sock",
        global = true
    )]
    pub socket: PathBuf,
    /// Print machine-readable JSON lines instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Send files to a node; exits 0 once the destination acknowledged every byte.
    /// Interrupting it (Ctrl-C) before then cancels the transfer along its path.
    Send {
        /// Files to send; a directory sends every file under it (its tree is rebuilt under
        /// the receiver's directory); `-` sends standard input (see --name).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The name standard input is sent under (with `-`).
        #[arg(long, default_value = "stdin")]
        name: String,
        /// Destination: a node id, or NODE/SERVICE for a service (endpoint) there, received by
        /// `hop recv --service SERVICE`.
        #[arg(long, value_parser = parse_destination, value_name = "NODE[/SERVICE]")]
        to: (u32, Option<String>),
        /// No progress bar.
        #[arg(long, short)]
        quiet: bool,
        /// Exit once hopd holds every byte and leave the transfer to it (`hop list` shows
        /// it, `hop cancel` cancels it).
        #[arg(long)]
        detach: bool,
        /// Keep trying this long, however long the path is down (e.g. 90m, 3d); the
        /// transfer fails as expired then. Default: hopd's `give_up_after` without progress.
        #[arg(long, value_parser = humantime::parse_duration)]
        lifetime: Option<std::time::Duration>,
        /// The transfer's class: every node on its path sends the data of a higher class
        /// first (needs transport = "hop").
        #[arg(long, value_enum, default_value_t = crate::api::Priority::Normal)]
        priority: crate::api::Priority,
    },
    /// List this node's outgoing transfers.
    List,
    /// Print hop's shell completions (e.g. `hop completions bash > /etc/bash_completion.d/hop`).
    Completions { shell: clap_complete::Shell },
    /// Write the manual pages and shell completions of hop and hopd into DIR (packaging).
    #[command(hide = true)]
    Generate { dir: PathBuf },
    /// Make hopd re-read its configuration file (as SIGHUP does): neighbours and routes
    /// change at once, without dropping transfers; other changed settings are named and
    /// wait for a restart.
    Reload,
    /// Cancel outgoing transfers (ids as `hop list` prints them): each is aborted along its
    /// path, and what nodes hold of it is freed and never delivered.
    Cancel {
        #[arg(required = true)]
        flows: Vec<String>,
    },
    /// Receive files into a directory (each written atomically after its integrity check).
    Recv {
        /// Directory the files are written to.
        #[arg(long)]
        dir: PathBuf,
        /// Receive the files sent to this service (`hop send --to NODE/SERVICE`); without
        /// it, the files sent to the node itself.
        #[arg(long)]
        service: Option<String>,
        /// Exit after this many files (default: run until interrupted).
        #[arg(long)]
        count: Option<u64>,
        /// Run this shell command after each file is stored, with HOP_FILE (its path),
        /// HOP_NAME, HOP_FROM (sender node), HOP_FLOW, HOP_SIZE and HOP_BLAKE3 in its
        /// environment. A command that fails is reported; the file stays received.
        #[arg(long, value_name = "COMMAND")]
        exec: Option<String>,
    },
    /// Show flows, neighbours, storage use and counters.
    Status,
    /// Create this node's key pair (for `[security] node_key_file`) and print its public key
    /// and the node id it gives. An existing file is kept, and its public key printed.
    Keygen {
        /// Where to write the key (mode 0600), e.g. /etc/hopd/node.key.
        #[arg(long)]
        out: PathBuf,
        /// Also admit this node to the members file given (created if missing), as a new
        /// node's own file starts: with its own key.
        #[arg(long)]
        members: Option<PathBuf>,
        /// The name for people in the members file (default: the host's name).
        #[arg(long)]
        name: Option<String>,
    },
    /// Admit a node to the mesh: add its public key (as `hop keygen` printed it on that
    /// node) to the members file, then make the local hopd re-read it.
    Admit {
        /// The node's public key (64 hex digits).
        key: String,
        /// A name for people (e.g. roof-3).
        #[arg(long, default_value = "")]
        name: String,
        /// The members file (`[security] members_file`).
        #[arg(long, default_value = "/etc/hopd/members")]
        members: PathBuf,
    },
    /// Revoke a node: remove its public key from the members file, then make the local hopd
    /// re-read it (its hellos and datagrams are dropped from then on).
    Revoke {
        /// The node's public key (64 hex digits).
        key: String,
        /// The members file (`[security] members_file`).
        #[arg(long, default_value = "/etc/hopd/members")]
        members: PathBuf,
    },
}

/// `NODE` or `NODE/SERVICE`.
pub fn parse_destination(s: &str) -> Result<(u32, Option<String>), String> {
    let (node, service) = match s.split_once('/') {
        Some((n, sv)) => (n, Some(sv.to_string())),
        None => (s, None),
    };
    let node = node
        .parse::<u32>()
        .map_err(|_| format!("`{node}` is not a node id (a number)"))?;
    if let Some(sv) = service.as_deref() {
        if !crate::flowfmt::valid_service(sv) {
            return Err(format!(
                "`{sv}` is not a service name: 1-64 of a-z, 0-9, `.`, `_`, `-`"
            ));
        }
    }
    Ok((node, service))
}

/// Hop node daemon: reliable block-switched transfer over multi-hop wireless meshes.
#[derive(Parser, Debug)]
#[command(name = "hopd", version)]
pub struct DaemonArgs {
    /// Configuration file (TOML; see docs/hopd.md).
    #[arg(short, long, default_value = "/etc/hopd/hopd.toml")]
    pub config: PathBuf,
    /// Check the configuration file and exit (0 if it is valid).
    #[arg(long, value_name = "FILE")]
    pub check_config: Option<PathBuf>,
    /// Log level (error, warn, info, debug, trace) or a tracing filter; overrides the file.
    #[arg(long)]
    pub log_level: Option<String>,
    /// Write logs as JSON lines.
    #[arg(long)]
    pub log_json: bool,
}

/// Bundle Protocol bridge: a convergence layer for dtnd (dtn7-rs) that carries bundles
/// over Hop. Settings come from --config, each overridden by its flag.
#[derive(Parser, Debug)]
#[command(name = "hop-dtn", version)]
pub struct BridgeArgs {
    /// TOML configuration file (keys as the flags below, peers as [[peers]] eid/node).
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// hopd's API socket [default: /var/lib/hopd/hopd.sock].
    #[arg(long, env = "HOPD_SOCKET")]
    pub hopd_socket: Option<PathBuf>,
    /// dtnd's web port on this host (dtnd must run with --ecla) [default: 127.0.0.1:3000].
    #[arg(long)]
    pub dtnd: Option<std::net::SocketAddr>,
    /// Where the bridge keeps its journals and the bundles it carries (required).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// A DTN peer served by a Hop node, EID=NODE (e.g. dtn://n3/=3); repeatable.
    #[arg(long = "peer", value_parser = crate::dtn::config::parse_peer)]
    pub peers: Vec<crate::dtn::config::Peer>,
    /// The convergence layer's name in dtnd [default: hop].
    #[arg(long)]
    pub cla_name: Option<String>,
    /// The hopd service bundles travel to [default: dtn].
    #[arg(long)]
    pub service: Option<String>,
    /// How often peers are announced to dtnd [default: 5s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub announce_interval: Option<std::time::Duration>,
    /// Give a bundle Hop has not delivered within this time back to dtnd to route again
    /// [default: never; Hop carries it for its lifetime].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub route_again_after: Option<std::time::Duration>,
    /// Keep failed bundles in STATE_DIR/failed/ instead of giving them back to dtnd.
    #[arg(long)]
    pub no_hand_back: bool,
    /// Check the settings, print them and exit.
    #[arg(long)]
    pub check_config: bool,
    /// Log filter (tracing's EnvFilter syntax) [default: info].
    #[arg(long, default_value = "info")]
    pub log_level: String,
}

/// Write the manual pages of `hop` (hop.1, one per subcommand as hop-SUB.1), `hopd`
/// (hopd.8) and `hop-dtn` (hop-dtn.8) and the shell completions of `hop` and `hopd` into `dir`.
pub fn generate(dir: &std::path::Path) -> std::io::Result<Vec<PathBuf>> {
    use clap::CommandFactory;
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let hop = Args::command();
    let hopd = DaemonArgs::command();
    let pages = [
        (clap_mangen::Man::new(hop.clone()), "hop.1".to_string()),
        // A daemon's page is in section 8.
        (
            clap_mangen::Man::new(hopd.clone()).section("8"),
            "hopd.8".to_string(),
        ),
        (
            clap_mangen::Man::new(BridgeArgs::command()).section("8"),
            "hop-dtn.8".to_string(),
        ),
    ]
    .into_iter()
    .chain(
        hop.get_subcommands()
            .filter(|c| !c.is_hide_set())
            .map(|sub| {
                let name = format!("hop-{}", sub.get_name());
                let page = sub
                    .clone()
                    .display_name(name.clone())
                    .bin_name(format!("hop {}", sub.get_name()));
                (
                    clap_mangen::Man::new(page).title(name.clone()),
                    format!("{name}.1"),
                )
            }),
    );
    for (man, file) in pages {
        let path = dir.join(file);
        let mut out = Vec::new();
        man.render(&mut out)?;
        std::fs::write(&path, out)?;
        written.push(path);
    }
    for shell in [
        clap_complete::Shell::Bash,
        clap_complete::Shell::Zsh,
        clap_complete::Shell::Fish,
    ] {
        for (mut cmd, name) in [(hop.clone(), "hop"), (hopd.clone(), "hopd")] {
            let path = clap_complete::generate_to(shell, &mut cmd, name, dir)?;
            written.push(path);
        }
    }
    Ok(written)
}
