//! hop-dtn: the Bundle Protocol (BPv7, RFC 9171) over Hop. A convergence layer for dtn7-rs's
//! `dtnd`, through its external convergence layer interface: each bundle dtnd routes to a
//! peer served by Hop becomes a detached hopd transfer to that peer's node, and each bundle
//! hopd receives for the bridge's service is handed to the local dtnd once. See docs/dtn.md.

pub mod bridge;
pub mod bundle;
pub mod config;
pub mod ecla;
pub mod journal;
