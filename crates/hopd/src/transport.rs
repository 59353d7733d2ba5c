//! Building the transport the daemon hosts from its configuration.

use std::sync::{Arc, Mutex};

use hop_proto::hop::{HopConfig, HopTransport};
use hop_proto::hxh::{HxhConfig, HxhTransport};
use hop_proto::{Instant, Transport};
use tracing::info;

use crate::config::{Config, TransportKind};
use crate::custody::{CustodyUsage, DiskCustody};

/// The transport and a view of its custody storage.
pub struct Built {
    pub transport: Box<dyn Transport>,
    pub custody: Arc<Mutex<CustodyUsage>>,
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
    h.cache_limit_bytes = cfg.max_memory_bytes;
    h.max_flows = cfg.max_incoming_flows;
    h
}

/// The transport for `cfg`, with custody blocks of an earlier run restored.
pub fn build(cfg: &Config) -> std::io::Result<Built> {
    let custody = Arc::new(Mutex::new(CustodyUsage::default()));
    let transport: Box<dyn Transport> = match cfg.transport {
        TransportKind::Hxh => Box::new(HxhTransport::new(HxhConfig::default())),
        TransportKind::Hop => {
            let (store, blocks) = DiskCustody::open(
                &cfg.storage_dir.join("custody"),
                cfg.max_disk_bytes,
                custody.clone(),
            )?;
            let mut t = HopTransport::with_store(hop_config(cfg), Box::new(store));
            if !blocks.is_empty() {
                info!(blocks = blocks.len(), "restoring blocks in custody");
                t.restore(Instant::ZERO, cfg.node_id, blocks);
            }
            Box::new(t)
        }
    };
    Ok(Built { transport, custody })
}
