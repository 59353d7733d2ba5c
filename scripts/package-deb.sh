#!/usr/bin/env bash
# Build the Debian package of hopd and hop: target/debian/hopd_VERSION_ARCH.deb.
# Needs cargo-deb (installed here, pinned, if missing). Lists the package's files at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO_DEB_VERSION=3.8.0
if ! cargo deb --version >/dev/null 2>&1; then
    cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked
fi
cargo build --release -p hopd --locked
rm -rf packaging/build
./target/release/hop generate packaging/build >/dev/null
cargo deb -p hopd --no-build --locked --strip
deb=$(ls -t target/debian/hopd_*.deb | head -1)
dpkg-deb --info "$deb" | sed -n '1,20p'
dpkg-deb --contents "$deb"
echo "$deb"
