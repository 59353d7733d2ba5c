//! Simulator (being built).
