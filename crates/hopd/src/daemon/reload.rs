//! Re-reading the configuration without a restart (SIGHUP, `hop reload`): neighbours and
//! static routes change at once, flows keep going; settings that shape sockets, storage,
//! keys or the transport are named and wait for the next start.

use std::fmt::Debug;

use tracing::{info, warn};

use super::Daemon;
use crate::config::Config;

/// After a change of the mesh key, how long datagrams sealed with the old key are taken:
/// the time to give every node of a mesh the new key and reload it.
pub const MESH_KEY_GRACE: std::time::Duration = std::time::Duration::from_secs(600);

/// What a reload did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReloadReport {
    /// Settings applied now.
    pub applied: Vec<String>,
    /// Settings that changed in the file and take effect at the next start.
    pub need_restart: Vec<String>,
}

fn differs<T: Debug>(name: &str, a: &T, b: &T, out: &mut Vec<String>) {
    if format!("{a:?}") != format!("{b:?}") {
        out.push(name.to_string());
    }
}

impl Daemon {
    /// Re-read the configuration file this daemon started from and apply what can change
    /// while it runs. A file with an error changes nothing (the error is returned).
    pub(super) fn reload(&mut self) -> Result<ReloadReport, String> {
        let Some(path) = self.config_path.clone() else {
            return Err("this daemon was not started from a configuration file".into());
        };
        let mut new = Config::load(&path).map_err(|e| e.to_string())?;
        // "auto" discovery addresses as found now: a change shows as one needing a restart.
        if new.resolve_discovery().is_err() {
            new.discovery_addresses = self.cfg.discovery_addresses.clone();
            new.discovery_address = self.cfg.discovery_address;
        }
        let report = self.apply_config(new);
        if report.applied.is_empty() && report.need_restart.is_empty() {
            info!(file = %path.display(), "configuration re-read: nothing changed");
        } else {
            info!(
                file = %path.display(),
                applied = ?report.applied,
                "configuration re-read"
            );
        }
        if !report.need_restart.is_empty() {
            warn!(
                settings = ?report.need_restart,
                "changed settings take effect only when hopd restarts"
            );
        }
        Ok(report)
    }

    fn apply_config(&mut self, new: Config) -> ReloadReport {
        let old = &self.cfg;
        let mut r = ReloadReport::default();
        differs(
            "neighbours",
            &old.neighbours,
            &new.neighbours,
            &mut r.applied,
        );
        differs("routes", &old.routes, &new.routes, &mut r.applied);
        // Receivers take both forms: switching what this node sends is safe at any time.
        differs(
            "security.encrypt",
            &old.encrypt,
            &new.encrypt,
            &mut r.applied,
        );
        differs("security.cipher", &old.cipher, &new.cipher, &mut r.applied);
        // Admissions and revocations apply at once (the file's keys, not its names).
        let keys = |c: &Config| {
            c.members
                .as_ref()
                .map(|m| m.iter().map(|m| m.key).collect::<Vec<_>>())
        };
        differs("security.members", &keys(old), &keys(&new), &mut r.applied);
        let n = &mut r.need_restart;
        differs("node_id", &old.node_id, &new.node_id, n);
        let public = |c: &Config| c.node_key.as_ref().map(|k| *k.public());
        differs("security.node_key_file", &public(old), &public(&new), n);
        differs("listen", &old.listen, &new.listen, n);
        differs("interface", &old.interface, &new.interface, n);
        differs("link_mode", &old.link_mode, &new.link_mode, n);
        differs("link_retries", &old.link_retries, &new.link_retries, n);
        differs("transport", &old.transport, &new.transport, n);
        differs(
            "broadcast_address",
            &old.broadcast_address,
            &new.broadcast_address,
            n,
        );
        differs("control_dscp", &old.control_dscp, &new.control_dscp, n);
        differs("data_dscp", &old.data_dscp, &new.data_dscp, n);
        differs("api_socket", &old.api_socket, &new.api_socket, n);
        differs(
            "metrics_listen",
            &old.metrics_listen,
            &new.metrics_listen,
            n,
        );
        differs("log_level", &old.log_level, &new.log_level, n);
        differs("kernel_routes", &old.kernel_routes, &new.kernel_routes, n);
        differs(
            "batman_interface",
            &old.batman_interface,
            &new.batman_interface,
            n,
        );
        differs("overhear", &old.overhear, &new.overhear, n);
        differs(
            "link_status_socket",
            &old.link_status_socket,
            &new.link_status_socket,
            n,
        );
        differs(
            "link_queue_frames",
            &old.link_queue_frames,
            &new.link_queue_frames,
            n,
        );
        differs(
            "link_control_when_full",
            &old.link_control_when_full,
            &new.link_control_when_full,
            n,
        );
        differs("hosts", &old.hosts, &new.hosts, n);
        differs("storage.dir", &old.storage_dir, &new.storage_dir, n);
        differs(
            "storage.max_memory_bytes",
            &old.max_memory_bytes,
            &new.max_memory_bytes,
            n,
        );
        differs(
            "storage.max_disk_bytes",
            &old.max_disk_bytes,
            &new.max_disk_bytes,
            n,
        );
        differs(
            "storage.max_incoming_flows",
            &old.max_incoming_flows,
            &new.max_incoming_flows,
            n,
        );
        differs(
            "storage.custody_write_delay",
            &old.custody_write_delay,
            &new.custody_write_delay,
            n,
        );
        differs(
            "storage.spool_thread",
            &old.spool_thread,
            &new.spool_thread,
            n,
        );
        differs("security.sessions", &old.sessions, &new.sessions, n);
        differs(
            "discovery_addresses",
            &old.discovery_addresses,
            &new.discovery_addresses,
            n,
        );
        differs(
            "hello_interval",
            &old.hello_interval,
            &new.hello_interval,
            n,
        );
        // The key itself is never logged.
        if old.mesh_key != new.mesh_key && old.sessions == new.sessions {
            r.applied.push("security.mesh_key".into());
        }
        differs("security.max_peers", &old.max_peers, &new.max_peers, n);
        differs("hop", &old.hop, &new.hop, n);
        differs(
            "hop.first_block_bytes",
            &old.first_block_bytes,
            &new.first_block_bytes,
            n,
        );
        if old.encrypt != new.encrypt {
            self.auth.set_encrypt(new.encrypt);
            self.cfg.encrypt = new.encrypt;
        }
        if self.cfg.cipher != new.cipher {
            self.auth.set_cipher(new.cipher.resolve());
            self.cfg.cipher = new.cipher;
        }
        if let Some(key) = new
            .mesh_key
            .filter(|k| self.cfg.mesh_key.is_some_and(|o| o != *k))
        {
            // Seal with the new key now; take the old one from neighbours not yet changed.
            self.auth.rotate(&key, MESH_KEY_GRACE);
            self.cfg.mesh_key = new.mesh_key;
            warn!(
                grace_s = MESH_KEY_GRACE.as_secs(),
                "mesh key changed: sealing with the new key, taking the old one as well for the \
                 grace period; give every node the new key (and `hop reload`) before it ends"
            );
        }
        if r.applied.iter().any(|a| a == "security.members") {
            self.cfg.members = new.members.clone();
            self.cfg.members_file = new.members_file.clone();
            // A revoked neighbour is forgotten now; its hellos and datagrams are dropped.
            let revoked: Vec<_> = self
                .discovered
                .keys()
                .copied()
                .filter(|id| !self.is_member_id(*id))
                .collect();
            for id in &revoked {
                self.discovered.remove(id);
                self.addrs.remove(id);
                info!(
                    neighbour = id,
                    "neighbour revoked: no longer in members_file"
                );
            }
            if !revoked.is_empty() {
                self.apply_routes();
            }
            self.revoke_sessions();
        }
        let old = &self.cfg;
        if r.applied.iter().any(|a| a == "neighbours" || a == "routes") {
            for gone in old
                .neighbours
                .iter()
                .filter(|o| !new.neighbours.iter().any(|x| x.id == o.id))
            {
                self.addrs.remove(&gone.id);
            }
            for nb in &new.neighbours {
                self.addrs.insert(nb.id, nb.addr);
            }
            self.cfg.neighbours = new.neighbours;
            self.cfg.routes = new.routes;
            // Kernel routes name gateways by address: map them with the new neighbours.
            self.refresh_kernel_routes();
            self.apply_routes();
        }
        r
    }
}
