//! `hopd`, the Hop node daemon, and `hop`, its command-line tool.
//!
//! The daemon drives the sans-IO node core ([`hop_proto::Node`] hosting the Hop transport)
//! over UDP. Applications talk to it through a Unix socket ([`api`]). See `docs/hopd.md`.

pub mod api;
pub mod auth;
pub mod batman;
pub mod cli;
pub mod config;
pub mod counter;
pub mod daemon;
pub mod dtn;
pub mod durable;
pub mod flowfmt;
pub mod http;
pub mod identity;
pub mod ifaddr;
pub mod io;
pub mod linkkind;
pub mod linkstatus;
pub mod metrics;
pub mod mtu;
pub mod netlink;
pub mod overhear;
pub mod resume;
pub mod server;
pub mod session;
mod socket;

pub mod custody;
pub mod transport;
