//! hop-dtn: carries dtn7-rs bundles over the local hopd (docs/dtn.md).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use hopd::dtn::config::{parse_peer, Config, Peer};

/// Bundle Protocol bridge: a convergence layer for dtnd (dtn7-rs) that carries bundles
/// over Hop. Settings come from --config, each overridden by its flag.
#[derive(Parser, Debug)]
#[command(name = "hop-dtn", version)]
struct Args {
    /// TOML configuration file (keys as the flags below, peers as [[peers]] eid/node).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// hopd's API socket [default: /var/lib/hopd/hopd.sock].
    #[arg(long, env = "HOPD_SOCKET")]
    hopd_socket: Option<PathBuf>,
    /// dtnd's web port on this host (dtnd must run with --ecla) [default: 127.0.0.1:3000].
    #[arg(long)]
    dtnd: Option<std::net::SocketAddr>,
    /// Where the bridge keeps its journals and the bundles it carries (required).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// A DTN peer served by a Hop node, EID=NODE (e.g. dtn://n3/=3); repeatable.
    #[arg(long = "peer", value_parser = parse_peer)]
    peers: Vec<Peer>,
    /// The convergence layer's name in dtnd [default: hop].
    #[arg(long)]
    cla_name: Option<String>,
    /// The hopd service bundles travel to [default: dtn].
    #[arg(long)]
    service: Option<String>,
    /// How often peers are announced to dtnd [default: 5s].
    #[arg(long, value_parser = humantime::parse_duration)]
    announce_interval: Option<std::time::Duration>,
    /// Give a bundle Hop has not delivered within this time back to dtnd to route again
    /// [default: never; Hop carries it for its lifetime].
    #[arg(long, value_parser = humantime::parse_duration)]
    route_again_after: Option<std::time::Duration>,
    /// Keep failed bundles in STATE_DIR/failed/ instead of giving them back to dtnd.
    #[arg(long)]
    no_hand_back: bool,
    /// Check the settings, print them and exit.
    #[arg(long)]
    check_config: bool,
    /// Log filter (tracing's EnvFilter syntax) [default: info].
    #[arg(long, default_value = "info")]
    log_level: String,
}

fn settings(a: &Args) -> Result<Config, String> {
    let mut c = match &a.config {
        Some(p) => Config::load(p).map_err(|e| e.to_string())?,
        None => {
            let Some(state_dir) = a.state_dir.clone() else {
                return Err("give --state-dir DIR (or --config FILE with state_dir)".into());
            };
            toml::from_str::<Config>(&format!(
                "state_dir = {:?}",
                state_dir.display().to_string()
            ))
            .map_err(|e| e.to_string())?
        }
    };
    if let Some(v) = &a.hopd_socket {
        c.hopd_socket = v.clone();
    }
    if let Some(v) = a.dtnd {
        c.dtnd = v;
    }
    if let Some(v) = &a.state_dir {
        c.state_dir = v.clone();
    }
    if let Some(v) = &a.cla_name {
        c.cla_name = v.clone();
    }
    if let Some(v) = &a.service {
        c.service = v.clone();
    }
    if let Some(v) = a.announce_interval {
        c.announce_interval = v;
    }
    if let Some(v) = a.route_again_after {
        c.route_again_after = Some(v);
    }
    if a.no_hand_back {
        c.hand_back = false;
    }
    c.peers.extend(a.peers.iter().cloned());
    c.validate().map_err(|e| e.to_string())?;
    Ok(c)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let cfg = match settings(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hop-dtn: {e}");
            return ExitCode::from(2);
        }
    };
    if args.check_config {
        println!(
            "ok: dtnd {} (CLA {:?}), hopd {} (service {:?}), state {}, {} peers",
            cfg.dtnd,
            cfg.cla_name,
            cfg.hopd_socket.display(),
            cfg.service,
            cfg.state_dir.display(),
            cfg.peers.len()
        );
        for p in &cfg.peers {
            println!("  {} -> node {}", p.eid, p.node);
        }
        return ExitCode::SUCCESS;
    }
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hop-dtn: cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    rt.block_on(async {
        tokio::select! {
            r = hopd::dtn::bridge::run(cfg) => match r {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("hop-dtn: {e}");
                    ExitCode::from(1)
                }
            },
            _ = shutdown() => ExitCode::SUCCESS,
        }
    })
}

/// SIGTERM or SIGINT. Every step the bridge takes is durable before it is acknowledged, so it
/// stops at once.
async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
