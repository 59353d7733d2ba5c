//! hopd: the Hop node daemon.

use std::process::ExitCode;

use clap::Parser;
use hopd::config::Config;
use hopd::daemon::cmd::Cmd;
use tokio::sync::{mpsc, oneshot};
use tracing::{error, info};

fn main() -> ExitCode {
    let args = hopd::cli::DaemonArgs::parse();
    if let Some(path) = &args.check_config {
        return match Config::load(path) {
            Ok(c) => {
                println!(
                    "{}: ok (node {}, {} neighbours, {} routes)",
                    path.display(),
                    c.node_id,
                    c.neighbours.len(),
                    c.routes.len()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(1)
            }
        };
    }
    let cfg = match Config::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    let level = args
        .log_level
        .clone()
        .or_else(|| cfg.log_level.clone())
        .unwrap_or_else(|| "info".into());
    let filter = tracing_subscriber::EnvFilter::try_new(&level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal: a log file or journald would keep the escape codes. Under
    // systemd (JOURNAL_STREAM set) journald stamps each line itself.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let journald = std::env::var_os("JOURNAL_STREAM").is_some();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    if args.log_json {
        builder.json().init();
    } else if journald {
        builder.without_time().init();
    } else {
        builder.init();
    }
    tune_allocator(&cfg);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hopd: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cfg, args.config.clone())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            eprintln!("hopd: {e}");
            ExitCode::from(1)
        }
    }
}

/// Keep block buffers in the heap. Each block a node receives, forwards or writes is a buffer
/// of up to `max_block_bytes` (1 MiB by default) that lives a few milliseconds on a fast
/// link; with glibc's defaults such buffers cycle through fresh `mmap`s or a heap top that
/// is trimmed and regrown, and every cycle page-faults the whole buffer in again. Buffers
/// below the mmap threshold (4 MiB, or two blocks if larger) come from the heap, and up to
/// `max_memory_bytes` (what hopd may hold in blocks anyway) of free heap is kept.
fn tune_allocator(cfg: &Config) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let block = cfg.hop.max_block_bytes;
        let mmap = (2 * block).max(4 << 20).min(i32::MAX as usize) as libc::c_int;
        let trim = cfg.max_memory_bytes.min(i32::MAX as u64) as libc::c_int;
        // SAFETY: mallopt only sets allocator parameters; called before any other thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, mmap);
            libc::mallopt(libc::M_TRIM_THRESHOLD, trim);
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = cfg;
}

async fn run(mut cfg: Config, config_path: std::path::PathBuf) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    if cfg.transport == hopd::config::TransportKind::Hop {
        if let Some(f) = hopd::mtu::fit(&mut cfg) {
            info!(
                payload = f.payload,
                mtu = f.mtu,
                to = %f.to,
                "packet payload lowered to fit the path MTU (set [hop] packet_payload_bytes to choose)"
            );
        }
    }
    hopd::server::check_api_free(&cfg.api_socket)?;
    let built = hopd::transport::build(&cfg)?;
    // The API socket is bound last: its file appearing tells clients (and scripts waiting
    // for it) that the node holds its network port, and a node that cannot start leaves
    // no socket file behind.
    let mut daemon = hopd::daemon::Daemon::new(cfg.clone(), built)?;
    daemon.set_config_path(config_path);
    let metrics = match cfg.metrics_listen {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .map_err(|e| std::io::Error::new(e.kind(), format!("binding metrics {a}: {e}")))?,
        ),
        None => None,
    };
    let http = match cfg.http_listen {
        Some(a) => {
            if !a.ip().is_loopback() {
                tracing::warn!(addr = %a, "the HTTP API has no authentication: anyone who reaches this address can send and receive as this node");
            }
            Some(tokio::net::TcpListener::bind(a).await.map_err(|e| {
                std::io::Error::new(e.kind(), format!("binding http_listen {a}: {e}"))
            })?)
        }
        None => None,
    };
    let api = hopd::server::bind_api(&cfg.api_socket, cfg.api_gid)?;
    let kernel_routes = cfg.kernel_routes;
    let batman = cfg.batman_interface.clone();
    let api_path = cfg.api_socket.clone();
    let (ctx, crx) = mpsc::channel(1024);
    // Detached transfers a previous run kept on disk are sent again.
    daemon.restore_outgoing(ctx.clone());
    info!(addr = %daemon.local_addr()?, api = %api_path.display(), "listening");
    tokio::spawn(hopd::server::serve_api(api, ctx.clone()));
    if let Some(m) = metrics {
        tokio::spawn(hopd::server::serve_metrics(m, ctx.clone()));
    }
    if let Some(h) = http {
        tokio::spawn(hopd::http::serve(h, ctx.clone()));
    }
    if kernel_routes {
        hopd::netlink::spawn(ctx.clone());
    }
    if let Some(ifname) = batman {
        hopd::batman::spawn(ifname, ctx.clone());
    }
    // SIGHUP re-reads the configuration (neighbours and routes at once, without dropping
    // flows); it used to end the daemon, the signal's default action.
    let mut hup = signal(SignalKind::hangup())?;
    let reload = ctx.clone();
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            info!("SIGHUP: re-reading the configuration");
            if reload.send(Cmd::Reload { reply: None }).await.is_err() {
                break;
            }
        }
    });
    let (stx, srx) = oneshot::channel();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: shutting down"),
            _ = int.recv() => info!("SIGINT: shutting down"),
        }
        let _ = stx.send(());
    });
    // systemd (Type=notify): ready once the API socket exists; the watchdog, if the unit
    // sets WatchdogSec, pinged at half its interval from the event loop. Outside systemd
    // these do nothing.
    let mut usec = 0u64;
    if sd_notify::watchdog_enabled(false, &mut usec) && usec > 0 {
        daemon.set_watchdog(std::time::Duration::from_micros(usec / 2));
    }
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
    let res = daemon.run(crx, srx).await;
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    let _ = std::fs::remove_file(&api_path);
    res
}
