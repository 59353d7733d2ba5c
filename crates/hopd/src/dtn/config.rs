//! hop-dtn's configuration: a TOML file, each key also a command-line flag (docs/dtn.md).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// A DTN node reached through Hop: dtnd learns it as a peer with the bridge's convergence
/// layer, and the bridge carries its bundles to Hop node `node`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Peer {
    /// Its node id, e.g. `dtn://relay2/` (the EID dtnd routes to).
    pub eid: String,
    /// The Hop node whose hop-dtn serves it.
    pub node: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// hopd's local API socket.
    #[serde(default = "default_socket")]
    pub hopd_socket: PathBuf,
    /// dtnd's web port on this host: its external convergence layer interface
    /// (`ws://ADDR/ws/ecla`, dtnd started with `--ecla`) and HTTP API.
    #[serde(default = "default_dtnd")]
    pub dtnd: SocketAddr,
    /// The convergence layer's name in dtnd (what its peers' service blocks list).
    #[serde(default = "default_cla")]
    pub cla_name: String,
    /// The hopd service bundles travel to (a receiving hop-dtn takes only its files).
    #[serde(default = "default_service")]
    pub service: String,
    /// Where the bridge keeps its journals and the bundles whose transfer is open.
    pub state_dir: PathBuf,
    /// How often the peers are announced to dtnd again (a restarted dtnd learns them
    /// within this time; dtnd forgets a peer not announced for its `--peer-timeout`).
    #[serde(default = "default_announce", with = "humantime_serde_opt")]
    pub announce_interval: Duration,
    /// A bundle whose Hop transfer failed before its lifetime ended is given back to dtnd
    /// (deleted from its store and inserted again through its HTTP API) so its routing can
    /// try again or elsewhere. Off: such bundles are kept in `state_dir/failed/`.
    #[serde(default = "yes")]
    pub hand_back: bool,
    /// A bundle Hop has not delivered within this time fails (as expired) and, while its own
    /// lifetime lasts, goes back to dtnd, whose routing decides again (with `hand_back`).
    /// None: Hop carries it for its whole lifetime, through partitions, in custody.
    #[serde(default, with = "humantime_serde_opt::option")]
    pub route_again_after: Option<Duration>,
    #[serde(default)]
    pub peers: Vec<Peer>,
}

fn default_socket() -> PathBuf {
    PathBuf::from("/var/lib/hopd/hopd.sock")
}
fn default_dtnd() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 3000))
}
fn default_cla() -> String {
    "hop".into()
}
fn default_service() -> String {
    "dtn".into()
}
fn default_announce() -> Duration {
    Duration::from_secs(5)
}
fn yes() -> bool {
    true
}

mod humantime_serde_opt {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }

    pub mod option {
        use super::*;

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            super::deserialize(d).map(Some)
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let c: Config = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        c.validate()?;
        Ok(c)
    }

    /// Checks what dtnd or hopd would otherwise refuse later, with what to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.cla_name.is_empty() || self.cla_name.len() > super::ecla::MAX_NAME {
            return bad(format!(
                "cla_name {:?}: dtnd accepts 1-{} bytes",
                self.cla_name,
                super::ecla::MAX_NAME
            ));
        }
        let ok_service = |s: &str| {
            !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        };
        if !ok_service(&self.service) {
            return bad(format!(
                "service {:?}: 1-64 of a-z 0-9 . _ - (a hopd service name)",
                self.service
            ));
        }
        if self
            .route_again_after
            .is_some_and(|d| d < Duration::from_secs(1))
        {
            return bad(
                "route_again_after: at least 1s (hopd's lifetimes are whole seconds)".into(),
            );
        }
        if self.announce_interval < Duration::from_millis(100) {
            return bad("announce_interval: at least 100ms".into());
        }
        let mut eids = HashSet::new();
        for p in &self.peers {
            if let Err(e) = bp7::EndpointID::try_from(p.eid.as_str()) {
                return bad(format!(
                    "peer {:?}: not an endpoint id ({e}); e.g. dtn://node3/",
                    p.eid
                ));
            }
            if !eids.insert(p.eid.as_str()) {
                return bad(format!("peer {:?} is listed twice", p.eid));
            }
        }
        Ok(())
    }

    /// The peer (and its EID) that Hop node `node` serves, if any.
    pub fn peer_of(&self, node: u32) -> Option<&Peer> {
        self.peers.iter().find(|p| p.node == node)
    }
}

/// `EID=NODE`, as `--peer` takes it.
pub fn parse_peer(s: &str) -> Result<Peer, String> {
    let (eid, node) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("{s:?}: expected EID=NODE, e.g. dtn://n3/=3"))?;
    let node = node
        .parse()
        .map_err(|_| format!("{s:?}: {node:?} is not a Hop node id"))?;
    Ok(Peer {
        eid: eid.to_string(),
        node,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        let c: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: "t".into(),
            message: e.to_string(),
        })?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn defaults_and_peers() {
        let c = parse(
            "state_dir = \"/tmp/x\"\n[[peers]]\neid = \"dtn://n3/\"\nnode = 3\n[[peers]]\neid = \"ipn:4.0\"\nnode = 4\n",
        )
        .unwrap();
        assert_eq!(c.cla_name, "hop");
        assert_eq!(c.service, "dtn");
        assert_eq!(c.dtnd, "127.0.0.1:3000".parse().unwrap());
        assert_eq!(c.announce_interval, Duration::from_secs(5));
        assert_eq!(c.route_again_after, None);
        assert_eq!(c.peer_of(4).unwrap().eid, "ipn:4.0");
        let c = parse("state_dir = \"x\"\nroute_again_after = \"10m\"\n").unwrap();
        assert_eq!(c.route_again_after, Some(Duration::from_secs(600)));
    }

    #[test]
    fn mistakes_are_named() {
        let e = parse("state_dir = \"x\"\n[[peers]]\neid = \"n3\"\nnode = 3\n").unwrap_err();
        assert!(e.to_string().contains("not an endpoint id"), "{e}");
        let e = parse("state_dir = \"x\"\nservice = \"DTN\"\n").unwrap_err();
        assert!(e.to_string().contains("service"), "{e}");
        let e = parse("state_dir = \"x\"\nannounce = \"1s\"\n").unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
        let e = parse(
            "state_dir = \"x\"\n[[peers]]\neid = \"dtn://a/\"\nnode = 3\n[[peers]]\neid = \"dtn://a/\"\nnode = 4\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
        assert!(
            parse("announce_interval = \"1s\"\n").is_err(),
            "state_dir is required"
        );
    }

    #[test]
    fn peer_flags() {
        assert_eq!(
            parse_peer("dtn://n3/=3").unwrap(),
            Peer {
                eid: "dtn://n3/".into(),
                node: 3
            }
        );
        assert!(parse_peer("dtn://n3/").is_err());
        assert!(parse_peer("dtn://n3/=x").is_err());
    }
}
