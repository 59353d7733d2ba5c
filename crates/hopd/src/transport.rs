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

/// The Hop parameters of `cfg`: the paper's defaults with the file's overrides.
pub fn hop_config(cfg: &Config) -> HopConfig {
    let mut h = HopConfig::default();
    let p = &cfg.hop;
    if let Some(v) = p.max_block_bytes {
        h.max_block_bytes = v;
    }
    if let Some(v) = p.packet_payload_bytes {
        h.packet_payload_bytes = v;
    }
    if let Some(v) = p.txop_bytes {
        h.txop_bytes = v;
    }
    if let Some(v) = p.micro_block_threshold {
        h.micro_block_threshold = v;
    }
    if let Some(v) = p.backpressure_limit {
        h.backpressure_limit = v;
    }
    if let Some(v) = p.backpressure {
        h.backpressure = v;
    }
    if let Some(v) = p.ack_withholding {
        h.ack_withholding = v;
    }
    if let Some(v) = cfg.vtx_initial_timeout() {
        h.vtx_initial_timeout = v;
    }
    if let Some(v) = p.vtx_ttl {
        h.vtx_ttl = v;
    }
    if let Some(v) = p.queue_aware {
        h.queue_aware = v;
    }
    if let Some(v) = p.hold_tail_losses {
        h.hold_tail_losses = v;
    }
    if let Some(v) = p.duplicate_feedback {
        h.duplicate_feedback = v;
    }
    if let Some(v) = p.link_queue_lifetime_ms {
        h.link_queue_lifetime = std::time::Duration::from_millis(v);
    }
    match p.link_window_packets {
        Some(v) => h.link_window_packets = v,
        // A link that reports its backlog (`link_status_socket`) bounds the queue itself:
        // hopd hands it a frame only while it holds fewer than `link_queue_frames`, as the
        // paper's driver queue pushed back (§4.1). The link window, which bounds that queue
        // from BACKs when nothing else does (docs/wire-format.md), would only add a
        // BSYN/BACK round per window; without it a transfer hands whole rounds of its block
        // to the link and asks once per round, as in §3.1.
        None if cfg.link_status_socket.is_some() => h.link_window_packets = 0,
        None => {}
    }
    if let Some(v) = p.link_window_max_packets {
        h.link_window_max_packets = v;
    }
    if let Some(v) = p.link_queue_target_ms {
        h.link_queue_target = std::time::Duration::from_millis(v);
    }
    if let Some(v) = p.adaptive_bsyn_timeout {
        h.adaptive_bsyn_timeout = v;
    }
    if let Some(v) = p.early_bsyn {
        h.early_bsyn = v;
    }
    if let Some(v) = p.round_per_next_hop {
        h.round_per_next_hop = v;
    }
    if let Some(v) = p.wait_notice {
        h.wait_notice = v;
    }
    if let Some(v) = p.withhold_turn_sends {
        h.withhold_turn_sends = v;
    }
    if let Some(v) = p.txop_past_full_window {
        h.txop_past_full_window = v;
    }
    if let Some(v) = p.pipelining {
        h.pipelining = v;
    }
    h.cache_limit_bytes = cfg.max_memory_bytes;
    h.max_flows = cfg.max_incoming_flows;
    h
}

/// File bytes the API server gathers before its first hand-over to Hop: a block's worth
/// (`max_block_bytes`) unless `[hop] first_block_bytes` says otherwise; 0 hands each data
/// frame over as it arrives. Never more than Hop's largest block.
pub fn first_block_bytes(cfg: &Config) -> usize {
    let block = hop_config(cfg).block_bytes();
    cfg.hop.first_block_bytes.map_or(block, |v| v.min(block))
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
            let hc = hop_config(cfg);
            let (store, progress) = store.with_spool(
                &cfg.storage_dir.join("incoming"),
                hc.unfinished_flow_idle_timeout(),
            )?;
            let (store, done) = store.with_writer()?;
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
    fn hop_section_sets_the_sender_knobs() {
        let d = hop_config(&config("hop"));
        assert!(d.queue_aware);
        assert!(d.pipelining);
        assert!(!d.hold_tail_losses);
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
            "[hop]\nqueue_aware = false\nhold_tail_losses = true\nduplicate_feedback = false\nlink_queue_lifetime_ms = 200\nlink_window_packets = 0\nadaptive_bsyn_timeout = false\npipelining = false\n",
        ));
        assert!(!h.queue_aware);
        assert_eq!(h.link_window_packets, 0);
        assert!(!h.adaptive_bsyn_timeout);
        assert!(!h.pipelining);
        assert!(h.hold_tail_losses);
        assert!(!h.duplicate_feedback);
        assert_eq!(h.link_queue_lifetime, std::time::Duration::from_millis(200));
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
