//! Errors of the simulator library.

use thiserror::Error;

/// Why a scenario cannot be run. Every message is one line and says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ScenarioError {
    #[error("cannot read scenario: {0}")]
    Io(String),
    #[error("invalid scenario TOML: {0}")]
    Parse(String),
    #[error("invalid scenario: {0}")]
    Invalid(String),
    #[error("transport {name:?}: {reason}")]
    Transport { name: String, reason: String },
}
