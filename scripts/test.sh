#!/usr/bin/env bash
# The project's test command: installs what it needs, then runs every test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

bash scripts/setup.sh

echo "== cargo fmt / clippy"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== Rust tests"
cargo build --release --workspace --locked
cargo test --workspace --locked

if [ -d lab ]; then
  echo "== lab tests"
  .venv/bin/python -m pytest -q lab/tests
fi

echo "== all tests passed in $(( $(date +%s) - start )) s"
