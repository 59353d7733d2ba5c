//! Transport registry: scenario names -> transport constructors with config overrides.
//!
//! Adding a transport is one `register` line in [`Registry::builtin`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use hop_proto::atp::AtpVariant;
use hop_proto::{Transport, TransportId};

/// Builds one transport instance from the scenario's `[transports.NAME]` table, for a node on
/// the scenario's medium.
pub type Factory = Box<dyn Fn(&toml::Table, &Link) -> Result<Box<dyn Transport>, String>>;

/// What a node's runtime knows of its link, as hopd knows it of its interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// The link retries control frames (`medium.retry_limit` > 0), as an 802.11 MAC does.
    pub control_retries: bool,
}

struct Entry {
    id: TransportId,
    factory: Factory,
}

/// Named transport constructors.
#[derive(Default)]
pub struct Registry {
    entries: BTreeMap<String, Entry>,
}

impl Registry {
    /// A registry with no transports (tests register their own).
    pub fn empty() -> Self {
        Self::default()
    }

    /// Every transport the project ships.
    pub fn builtin() -> Self {
        let mut r = Self::empty();
        r.register("hop", TransportId::Hop, |o, link| {
            let cfg = hop_config(o)?.for_link(link.control_retries);
            Ok(Box::new(hop_proto::hop::HopTransport::new(cfg)))
        });
        r.register("hxh", TransportId::Hxh, |o, _| {
            Ok(Box::new(hop_proto::hxh::HxhTransport::new(hxh_config(o)?)))
        });
        r.register("atp", TransportId::Atp, |o, _| {
            Ok(Box::new(hop_proto::atp::AtpTransport::new(atp_config(
                AtpVariant::Default,
                o,
            )?)))
        });
        r.register("atp-aggressive", TransportId::Atp, |o, _| {
            let cfg = atp_config(AtpVariant::Aggressive, o)?;
            Ok(Box::new(hop_proto::atp::AtpTransport::new(cfg)))
        });
        r.register("atp-adaptive", TransportId::Atp, |o, _| {
            let cfg = atp_config(AtpVariant::Adaptive, o)?;
            Ok(Box::new(hop_proto::atp::AtpTransport::new(cfg)))
        });
        r.register("tcp", TransportId::Tcp, |o, _| {
            Ok(Box::new(hop_proto::tcp::TcpTransport::new(tcp_config(o)?)))
        });
        r
    }

    /// Register (or replace) a transport under `name`.
    pub fn register(
        &mut self,
        name: &str,
        id: TransportId,
        f: impl Fn(&toml::Table, &Link) -> Result<Box<dyn Transport>, String> + 'static,
    ) {
        self.entries.insert(
            name.to_string(),
            Entry {
                id,
                factory: Box::new(f),
            },
        );
    }

    pub fn names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    pub fn id_of(&self, name: &str) -> Option<TransportId> {
        self.entries.get(name).map(|e| e.id)
    }

    /// Build an instance of `name` with `overrides` applied, for a node on `link`.
    pub fn build(
        &self,
        name: &str,
        overrides: &toml::Table,
        link: &Link,
    ) -> Result<Box<dyn Transport>, String> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| format!("unknown transport; known: {}", self.names().join(", ")))?;
        (e.factory)(overrides, link)
    }
}

/// Applies a TOML table onto config fields, then rejects keys nobody consumed.
pub struct Overrides<'a> {
    table: &'a toml::Table,
    used: BTreeSet<&'a str>,
}

impl<'a> Overrides<'a> {
    pub fn new(table: &'a toml::Table) -> Self {
        Overrides {
            table,
            used: BTreeSet::new(),
        }
    }

    fn get(&mut self, key: &'a str) -> Option<&'a toml::Value> {
        let v = self.table.get(key)?;
        self.used.insert(key);
        Some(v)
    }

    pub fn bool(&mut self, key: &'a str, field: &mut bool) -> Result<(), String> {
        if let Some(v) = self.get(key) {
            *field = v
                .as_bool()
                .ok_or_else(|| format!("{key} must be true or false"))?;
        }
        Ok(())
    }

    pub fn uint<T: TryFrom<i64>>(&mut self, key: &'a str, field: &mut T) -> Result<(), String> {
        if let Some(v) = self.get(key) {
            let i = v
                .as_integer()
                .ok_or_else(|| format!("{key} must be an integer"))?;
            *field = T::try_from(i).map_err(|_| format!("{key} = {i} is out of range"))?;
        }
        Ok(())
    }

    pub fn float(&mut self, key: &'a str, field: &mut f64) -> Result<(), String> {
        if let Some(v) = self.get(key) {
            *field = v
                .as_float()
                .or_else(|| v.as_integer().map(|i| i as f64))
                .ok_or_else(|| format!("{key} must be a number"))?;
        }
        Ok(())
    }

    /// A duration given in seconds (integer or float).
    pub fn secs(&mut self, key: &'a str, field: &mut Duration) -> Result<(), String> {
        if let Some(v) = self.get(key) {
            let s = v
                .as_float()
                .or_else(|| v.as_integer().map(|i| i as f64))
                .ok_or_else(|| format!("{key} must be a number of seconds"))?;
            *field = Duration::try_from_secs_f64(s)
                .map_err(|_| format!("{key} = {s} is not a valid duration in seconds"))?;
        }
        Ok(())
    }

    /// Error if the table holds a key that no field consumed.
    pub fn finish(self) -> Result<(), String> {
        let unknown: Vec<&str> = self
            .table
            .keys()
            .map(|k| k.as_str())
            .filter(|k| !self.used.contains(k))
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(format!("unknown config key(s): {}", unknown.join(", ")))
        }
    }
}

/// The scenario's `[transports.hop]` table read as a `hop_proto::hop::HopConfig`: an
/// optional `preset` ("default" or "paper") and overrides of its fields, durations as strings
/// ("200ms", "60s"), as hopd reads its `[hop]` table.
pub fn hop_config(table: &toml::Table) -> Result<hop_proto::hop::HopConfig, String> {
    hop_proto::hop::HopConfig::from_toml(table).map_err(|e| e.to_string())
}

/// The scenario's `[transports.tcp]` table read as a `hop_proto::tcp::TcpConfig`: its
/// defaults with the table's fields over them, durations as strings ("200ms").
pub fn tcp_config(table: &toml::Table) -> Result<hop_proto::tcp::TcpConfig, String> {
    hop_proto::tcp::TcpConfig::from_toml(table)
}

/// `hop_proto::hxh::HxhConfig::default()` with `[transports.hxh]` overrides (durations in s).
pub fn hxh_config(table: &toml::Table) -> Result<hop_proto::hxh::HxhConfig, String> {
    let mut c = hop_proto::hxh::HxhConfig::default();
    let mut o = Overrides::new(table);
    o.uint("packet_payload_bytes", &mut c.packet_payload_bytes)?;
    o.uint("buffer_packets", &mut c.buffer_packets)?;
    o.uint("reserve_packets", &mut c.reserve_packets)?;
    o.uint("stall_multiplier", &mut c.stall_multiplier)?;
    o.secs("flow_timeout", &mut c.flow_timeout)?;
    o.secs("hop_delay_initial", &mut c.hop_delay_initial)?;
    o.float("hop_delay_gain", &mut c.hop_delay_gain)?;
    o.uint("hop_rto_multiplier", &mut c.hop_rto_multiplier)?;
    o.secs("hop_rto_min", &mut c.hop_rto_min)?;
    o.secs("hop_rto_max", &mut c.hop_rto_max)?;
    o.uint("hop_retry_limit", &mut c.hop_retry_limit)?;
    o.secs("nack_timeout", &mut c.nack_timeout)?;
    o.bool("nack_holdoff", &mut c.nack_holdoff)?;
    o.secs("explicit_ack_interval", &mut c.explicit_ack_interval)?;
    o.secs("source_rto", &mut c.source_rto)?;
    o.secs("give_up", &mut c.give_up)?;
    o.uint("send_buffer_bytes", &mut c.send_buffer_bytes)?;
    o.uint("max_flows", &mut c.max_flows)?;
    o.uint("finished_memory", &mut c.finished_memory)?;
    o.bool("passive_feedback", &mut c.passive_feedback)?;
    o.finish()?;
    Ok(c)
}

/// `AtpConfig::for_variant(variant)` with `[transports.atp*]` overrides (durations in s).
pub fn atp_config(
    variant: AtpVariant,
    table: &toml::Table,
) -> Result<hop_proto::atp::AtpConfig, String> {
    let mut c = hop_proto::atp::AtpConfig::for_variant(variant);
    let mut o = Overrides::new(table);
    o.uint("packet_payload_bytes", &mut c.packet_payload_bytes)?;
    o.secs("epoch", &mut c.epoch)?;
    o.float("alpha", &mut c.alpha)?;
    o.float("beta", &mut c.beta)?;
    o.float("eta", &mut c.eta)?;
    o.float("phi", &mut c.phi)?;
    o.float("kappa", &mut c.kappa)?;
    o.uint("max_sack_blocks", &mut c.max_sack_blocks)?;
    o.float("feedback_slack", &mut c.feedback_slack)?;
    o.uint("missed_feedback_restart", &mut c.missed_feedback_restart)?;
    o.bool("immediate_feedback", &mut c.immediate_feedback)?;
    o.uint("adaptive_run", &mut c.adaptive_run)?;
    o.uint("adaptive_drops", &mut c.adaptive_drops)?;
    o.bool("hop_scaled_eta", &mut c.hop_scaled_eta)?;
    o.bool("idle_updates_t", &mut c.idle_updates_t)?;
    o.float("eta_per_hop", &mut c.eta_per_hop)?;
    o.uint("queue_limit_packets", &mut c.queue_limit_packets)?;
    o.secs("min_delay", &mut c.min_delay)?;
    o.secs("max_delay", &mut c.max_delay)?;
    o.secs("give_up", &mut c.give_up)?;
    o.uint("send_buffer_bytes", &mut c.send_buffer_bytes)?;
    o.float(
        "send_buffer_feedback_intervals",
        &mut c.send_buffer_feedback_intervals,
    )?;
    o.uint("send_buffer_max_bytes", &mut c.send_buffer_max_bytes)?;
    o.uint("max_flows", &mut c.max_flows)?;
    o.uint("finished_memory", &mut c.finished_memory)?;
    o.finish()?;
    Ok(c)
}
