#!/usr/bin/env bash
# The project's test command: installs what it needs, then runs every test suite.
# Needs root for the namespace tests and the emulation lab (CI runs as root).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
stage() { echo; echo "== $* ($(( $(date +%s) - start )) s)"; }

stage "setup"
bash scripts/setup.sh

stage "cargo fmt / clippy"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

# One optimised build serves the binaries the lab runs and the test binaries: tests run
# release-mode (the simulator and daemon tests move megabytes; debug builds are ~10x slower).
stage "build (release)"
cargo build --release --workspace --locked

stage "Rust tests"
cargo test --release --workspace --locked -- --test-threads 2

stage "fuzz target type-checks"
cargo check --manifest-path fuzz/Cargo.toml --locked

if [ -d lab ]; then
  stage "lab tests (ns-3 emulation)"
  .venv/bin/python -m pytest -q lab/tests
  stage "lab self-test (short form)"
  .venv/bin/hoplab selftest --quick
  .venv/bin/hoplab reproduce --quick
fi

if [ "$(id -u)" = 0 ]; then
  # The Debian package in a clean bookworm chroot: install, two nodes move files, purge.
  stage "Debian package install test"
  bash scripts/test-deb-install.sh
fi

stage "all tests passed"
