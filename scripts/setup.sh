#!/usr/bin/env bash
# Install everything the project needs on a fresh Debian machine: apt packages, the Rust
# toolchain's components, and the lab's Python venv with ns-3. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust (https://rustup.rs) first" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

# The emulation lab: apt packages, the venv with ns-3 and hoplab.
bash scripts/setup-lab.sh

# The DTN baseline peer (dtn7, built from crates.io; ~3 min the first time).
bash scripts/setup-dtn7.sh
