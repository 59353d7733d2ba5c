//! hop-dtn: carries dtn7-rs bundles over the local hopd (docs/dtn.md).

use std::process::ExitCode;

use clap::Parser;
use hopd::cli::BridgeArgs as Args;
use hopd::dtn::config::Config;

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
