//! Deterministic, seeded, virtual-time simulator of multi-hop wireless networks.
//!
//! It runs the real sans-IO [`hop_proto::Node`] (no mock) over a modelled medium: either an
//! 802.11-like shared medium (carrier sense, random backoff, collisions, hidden terminals,
//! overhearing, link-layer ACK and retries for control datagrams, txop bursts for data) or
//! independent point-to-point links. Scenarios are TOML files (see `docs/scenarios.md`); a run
//! yields a [`SimResult`] that serialises to a stable JSON schema.
//!
//! ```no_run
//! use hop_sim::{Registry, Scenario, Simulation};
//! let sc = Scenario::from_file("examples/scenarios/one-hop.toml".as_ref()).unwrap();
//! let result = Simulation::new(sc, Registry::builtin()).unwrap().run();
//! println!("{}", result.to_json());
//! ```

pub mod compare;
pub mod error;
pub mod result;
pub mod routes;
pub mod scenario;
pub mod sim;
pub mod transports;

pub use error::ScenarioError;
pub use result::{FlowResult, NodeResult, SimResult, SCHEMA_VERSION};
pub use scenario::Scenario;
pub use sim::Simulation;
pub use transports::{Overrides, Registry};

/// Parse, build and run a scenario with the built-in transports.
pub fn run_toml(text: &str, seed: Option<u64>) -> Result<SimResult, ScenarioError> {
    let sc = Scenario::from_toml(text)?;
    Ok(Simulation::with_seed(sc, Registry::builtin(), seed)?.run())
}
