//! Building the transport the daemon hosts from its configuration.

use std::sync::{Arc, Mutex};

use hop_proto::atp::{AtpConfig, AtpTransport, AtpVariant};
use hop_proto::hop::{HopConfig, HopTransport};
use hop_proto::hxh::{HxhConfig, HxhTransport};
use hop_proto::{Instant, Transport};
use tracing::info;

use crate::config::{Config, TransportKind};
use crate::custody::{CustodyDone, CustodyUsage, DiskCustody};

/// The transport and a view of its custody storage.
pub struct Built {
    pub transport: Box<dyn Transport>,
    pub custody: Arc<Mutex<CustodyUsage>>,
    /// Custody writes finished off the event loop, to hand to the transport (Hop only).
    pub custody_done: Option<Arc<CustodyDone>>,
}

/// The Hop parameters of `cfg` (the `[hop]` section as the configuration resolved it), for
/// this host's link: `control_copies = "auto"` follows whether it retries control frames
/// ([`link_retries`]).
pub fn hop_config(cfg: &Config) -> HopConfig {
    cfg.hop.clone().for_link(link_retries(cfg).retries)
}

/// Whether the node's link retries control frames: `link_retries` if the configuration
/// sets it, else what the interface is (linkkind.rs).
pub fn link_retries(cfg: &Config) -> crate::linkkind::LinkRetries {
    crate::linkkind::for_host(cfg.link_retries, cfg.interface.as_deref(), cfg.listen)
}

/// File bytes the API server gathers before its first hand-over to Hop: a block's worth
/// (`max_block_bytes`) unless `[hop] first_block_bytes` says otherwise; 0 hands each data
/// frame over as it arrives. Never more than Hop's largest block.
pub fn first_block_bytes(cfg: &Config) -> usize {
    let block = cfg.hop.block_bytes();
    cfg.first_block_bytes.map_or(block, |v| v.min(block))
}

/// The HxH parameters of `cfg`: the HxH paper's defaults; the `[hop]` section does not apply,
/// only the daemon-wide bound on flows with state (`[storage] max_incoming_flows`). A node
/// that overhears its neighbours (`overhear = true`) uses the paper's passive feedback
/// (§3.2); otherwise every packet is acknowledged by the next hop (§3.4's explicit variant).
pub fn hxh_config(cfg: &Config) -> HxhConfig {
    HxhConfig {
        max_flows: cfg.max_incoming_flows,
        passive_feedback: cfg.overhear,
        ..HxhConfig::default()
    }
}

/// The ATP parameters of `cfg` for `variant`: the ATP paper's values for that variant; the
/// `[hop]` section does not apply, only `[storage] max_incoming_flows`.
pub fn atp_config(cfg: &Config, variant: AtpVariant) -> AtpConfig {
    AtpConfig {
        max_flows: cfg.max_incoming_flows,
        ..AtpConfig::for_variant(variant)
    }
}

/// The ATP variant a transport kind names, if it names one.
pub fn atp_variant(kind: TransportKind) -> Option<AtpVariant> {
    match kind {
        TransportKind::Atp => Some(AtpVariant::Default),
        TransportKind::AtpAggressive => Some(AtpVariant::Aggressive),
        TransportKind::AtpAdaptive => Some(AtpVariant::Adaptive),
        TransportKind::Hop | TransportKind::Hxh => None,
    }
}

/// The transport for `cfg`, with custody blocks of an earlier run restored.
///
/// Only Hop keeps blocks in custody (hop-by-hop reliability): with HxH or ATP the custody directory
/// is neither read nor written and the custody counters stay zero. Blocks left there by an
/// earlier Hop run stay on disk for a later Hop run.
pub fn build(cfg: &Config) -> std::io::Result<Built> {
    let custody = Arc::new(Mutex::new(CustodyUsage::default()));
    let mut custody_done = None;
    info!("hosting transport {}", cfg.transport.name());
    let transport: Box<dyn Transport> = match cfg.transport {
        TransportKind::Hxh => Box::new(HxhTransport::new(hxh_config(cfg))),
        TransportKind::Atp | TransportKind::AtpAggressive | TransportKind::AtpAdaptive => {
            let variant = atp_variant(cfg.transport).unwrap_or_default();
            Box::new(AtpTransport::new(atp_config(cfg, variant)))
        }
        TransportKind::Hop => {
            let (store, blocks) = DiskCustody::open(
                &cfg.storage_dir.join("custody"),
                cfg.max_disk_bytes,
                custody.clone(),
            )?;
            let link = link_retries(cfg);
            let hc = cfg.hop.clone().for_link(link.retries);
            info!(
                control_copies = ?hc.control_copies,
                link_retries = link.retries,
                "{}",
                link.reason
            );
            let (store, progress) = store.with_spool(
                &cfg.storage_dir.join("incoming"),
                hc.unfinished_flow_idle_timeout(),
            )?;
            let (store, done) = store.with_writer(cfg.spool_thread)?;
            let store = store.with_write_delay(cfg.custody_write_delay);
            custody_done = Some(done);
            let mut t = HopTransport::with_store(hc, Box::new(store));
            if !blocks.is_empty() {
                info!(blocks = blocks.len(), "restoring blocks in custody");
                t.restore(Instant::ZERO, cfg.node_id, blocks);
            }
            if !progress.is_empty() {
                info!(flows = progress.len(), "resuming incoming flows");
                t.restore_destination(Instant::ZERO, cfg.node_id, progress);
            }
            Box::new(t)
        }
    };
    Ok(Built {
        transport,
        custody,
        custody_done,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(transport: &str) -> Config {
        let text = format!(
            "transport = \"{transport}\"\nnode_id = 1\nlisten = \"127.0.0.1:7000\"\n[storage]\ndir = \"s\"\nmax_incoming_flows = 7\n[security]\nmesh_key = \"{}\"\n",
            "ab".repeat(32)
        );
        Config::parse("t.toml", &text, Path::new("/")).unwrap()
    }

    /// A Hop node's configuration with `hop` appended (e.g. a `[hop]` section).
    fn with_hop(hop: &str) -> Config {
        let text = format!(
            "node_id = 1\nlisten = \"127.0.0.1:7000\"\n[storage]\ndir = \"s\"\n[security]\nmesh_key = \"{}\"\n{hop}",
            "ab".repeat(32)
        );
        Config::parse("t.toml", &text, Path::new("/")).unwrap()
    }

    #[test]
    fn control_copies_follow_the_link_unless_the_hop_section_says() {
        use hop_proto::hop::ControlCopies;
        let copies = |top: &str, hop: &str| {
            let text = format!(
                "node_id = 1\nlisten = \"127.0.0.1:7000\"\n{top}\n[storage]\ndir = \"s\"\n[security]\nmesh_key = \"{}\"\n{hop}",
                "ab".repeat(32)
            );
            hop_config(&Config::parse("t.toml", &text, Path::new("/")).unwrap()).control_copies
        };
        assert_eq!(copies("link_retries = true", ""), ControlCopies::Off);
        assert_eq!(copies("link_retries = false", ""), ControlCopies::On);
        // Loopback sends every datagram once.
        assert_eq!(copies("", ""), ControlCopies::On);
        for top in ["link_retries = true", "link_retries = false", ""] {
            assert_eq!(
                copies(top, "[hop]\ncontrol_copies = false\n"),
                ControlCopies::Off
            );
            assert_eq!(
                copies(top, "[hop]\ncontrol_copies = true\n"),
                ControlCopies::On
            );
            assert_eq!(
                copies(top, "[hop]\npreset = \"paper\"\n"),
                ControlCopies::Off
            );
        }
    }

    #[test]
    fn hop_section_sets_the_sender_knobs() {
        let d = hop_config(&config("hop"));
        assert!(d.queue_aware);
        assert!(d.pipelining);
        assert!(d.duplicate_feedback);
        assert_eq!(
            d.link_window_packets,
            HopConfig::default().link_window_packets
        );
        // With a link that reports its backlog, no link window unless the file sets one.
        let with_link = |hop: &str| {
            let text = format!(
                "node_id = 1\nlisten = \"127.0.0.1:7000\"\nlink_status_socket = \"/run/l.sock\"\n[storage]\ndir = \"s\"\n[security]\nmesh_key = \"{}\"\n{hop}",
                "ab".repeat(32)
            );
            hop_config(&Config::parse("t.toml", &text, Path::new("/")).unwrap())
        };
        assert_eq!(with_link("").link_window_packets, 0);
        assert_eq!(
            with_link("[hop]\nlink_window_packets = 32\n").link_window_packets,
            32
        );
        let h = hop_config(&with_hop(
            "[hop]\nqueue_aware = false\nduplicate_feedback = false\nlink_queue_lifetime = \"200ms\"\nlink_window_packets = 0\nadaptive_bsyn_timeout = false\npipelining = false\n",
        ));
        assert!(!h.queue_aware);
        assert_eq!(h.link_window_packets, 0);
        assert!(!h.adaptive_bsyn_timeout);
        assert!(!h.pipelining);
        assert!(!h.duplicate_feedback);
        assert_eq!(h.link_queue_lifetime, std::time::Duration::from_millis(200));
    }

    #[test]
    fn the_paper_preset_switches_the_extensions_off_and_storage_still_bounds_it() {
        let h = hop_config(&with_hop("[hop]\npreset = \"paper\"\nvtx_ttl = 9\n"));
        let paper = HopConfig::paper();
        assert_eq!(h.vtx_ttl, 9);
        assert_eq!(h.queue_aware, paper.queue_aware);
        assert_eq!(h.round_per_next_hop, paper.round_per_next_hop);
        assert_eq!(h.cache_limit_bytes, crate::config::DEFAULT_MAX_MEMORY_BYTES);
        assert_eq!(h.max_flows, crate::config::DEFAULT_MAX_INCOMING_FLOWS);
    }

    #[test]
    fn a_quarter_of_the_flow_table_sends_at_once_unless_hop_says_otherwise() {
        let h = hop_config(&with_hop(""));
        let table = crate::config::DEFAULT_MAX_INCOMING_FLOWS;
        assert_eq!(h.max_sending_flows, (table / 4).max(1));
        let h = hop_config(&with_hop("[hop]\nmax_sending_flows = 100\n"));
        assert_eq!(h.max_sending_flows, 100);
    }

    #[test]
    fn hop_section_errors_name_the_key_and_what_to_do() {
        let parse = |hop: &str| {
            let text = format!(
                "node_id = 1\nlisten = \"127.0.0.1:7000\"\n[storage]\ndir = \"s\"\n[security]\nmesh_key = \"{}\"\n{hop}",
                "ab".repeat(32)
            );
            Config::parse("t.toml", &text, Path::new("/"))
                .unwrap_err()
                .to_string()
        };
        let e = parse("[hop]\nvtx_initial_timeout_ms = 60000\n");
        assert!(e.contains("vtx_initial_timeout_ms"), "{e}");
        let e = parse("[hop]\nbsyn_timeout = 0.2\n");
        assert!(e.contains("bsyn_timeout") || e.contains("string"), "{e}");
        assert!(e.contains("\"200ms\""), "{e}");
        let e = parse("[hop]\ncache_limit_bytes = 1000\n");
        assert!(e.contains("max_memory_bytes"), "{e}");
        let e = parse("[hop]\npreset = \"fast\"\n");
        assert!(e.contains("paper"), "{e}");
    }

    #[test]
    fn the_first_hand_over_is_a_block_unless_the_file_says_otherwise() {
        let block = HopConfig::default().block_bytes();
        assert_eq!(first_block_bytes(&with_hop("")), block);
        assert_eq!(
            first_block_bytes(&with_hop("[hop]\nfirst_block_bytes = 0\n")),
            0
        );
        assert_eq!(
            first_block_bytes(&with_hop("[hop]\nfirst_block_bytes = 300000\n")),
            300_000
        );
        // Never more than a block, which follows max_block_bytes.
        assert_eq!(
            first_block_bytes(&with_hop(
                "[hop]\nmax_block_bytes = 200000\nfirst_block_bytes = 300000\n"
            )),
            200_000
        );
    }

    #[test]
    fn atp_names_select_their_variant() {
        for (name, variant) in [
            ("atp", AtpVariant::Default),
            ("atp-aggressive", AtpVariant::Aggressive),
            ("atp-adaptive", AtpVariant::Adaptive),
        ] {
            let cfg = config(name);
            assert_eq!(atp_variant(cfg.transport), Some(variant), "{name}");
            let a = atp_config(&cfg, variant);
            assert_eq!(a.variant, variant);
            assert_eq!(a.epoch, AtpConfig::for_variant(variant).epoch, "{name}");
            assert_eq!(a.max_flows, 7);
        }
        assert_eq!(atp_variant(config("hop").transport), None);
        assert_eq!(atp_variant(config("hxh").transport), None);
    }

    #[test]
    fn built_transport_has_the_configured_id() {
        use hop_proto::TransportId;
        let dir = tempfile::tempdir().unwrap();
        for (name, id) in [
            ("hop", TransportId::Hop),
            ("hxh", TransportId::Hxh),
            ("atp", TransportId::Atp),
            ("atp-aggressive", TransportId::Atp),
            ("atp-adaptive", TransportId::Atp),
        ] {
            let mut cfg = config(name);
            cfg.storage_dir = dir.path().join(name);
            let built = build(&cfg).unwrap();
            assert_eq!(built.transport.id(), id, "{name}");
            // Only Hop opens (and so creates) the custody directory.
            assert_eq!(
                cfg.storage_dir.join("custody").exists(),
                name == "hop",
                "{name}"
            );
        }
    }
}
