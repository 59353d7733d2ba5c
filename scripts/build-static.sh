#!/usr/bin/env bash
# Build fully static, stripped release binaries of hopd and hop (package hopd, --locked) for
# routers, one folder per target:
#   target/static/x86_64-unknown-linux-musl/{hopd,hop}
#   target/static/aarch64-unknown-linux-musl/{hopd,hop}
# (under $CARGO_TARGET_DIR/static when that is set). musl makes the binaries depend on no C
# library of the router's; Zig is their linker and the C compiler of the crates with C parts
# (ring), for both targets from one x86_64 machine.
# Installs what is missing: the two rustup targets, and cargo-zigbuild with Zig (PyPI,
# pinned) in a venv at .tools/zigbuild. With --verify it also checks that `file` calls every
# binary statically linked and runs the aarch64 ones under qemu user emulation (Debian's
# qemu-user-static, installed by apt-get if missing; needs root).
set -euo pipefail
cd "$(dirname "$0")/.."

ZIGBUILD_VERSION=0.24.1
ZIG_VERSION=0.17.1
TARGETS=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl)
VENV=.tools/zigbuild
STAMP="$VENV/.versions"

verify=false
case "${1:-}" in
    "") ;;
    --verify) verify=true ;;
    *) echo "usage: $0 [--verify]" >&2; exit 2 ;;
esac

command -v cargo >/dev/null 2>&1 || { echo "build-static: cargo not found" >&2; exit 1; }

installed=$(rustup target list --installed)
for t in "${TARGETS[@]}"; do
    grep -qx "$t" <<<"$installed" || rustup target add "$t"
done

# The venv is rebuilt when the pinned versions change, so an old Zig is never used.
want="cargo-zigbuild $ZIGBUILD_VERSION, ziglang $ZIG_VERSION"
if [ ! -x "$VENV/bin/cargo-zigbuild" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
    rm -rf "$VENV"
    # Debian's own python3 keeps venv in a package of its own.
    if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    fi
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet "cargo-zigbuild==$ZIGBUILD_VERSION" "ziglang==$ZIG_VERSION"
    echo "$want" >"$STAMP"
fi
# cargo-zigbuild finds Zig through the venv's python (the ziglang package).
export PATH="$PWD/$VENV/bin:$PATH"

# Release as Cargo.toml has it, for a router's small flash: no line tables (line tables only
# there), symbols stripped at link time, and whole-program optimisation in one codegen unit,
# which makes the binaries a fifth to a quarter smaller.
export CARGO_PROFILE_RELEASE_DEBUG=0
export CARGO_PROFILE_RELEASE_STRIP=symbols
export CARGO_PROFILE_RELEASE_LTO=fat
export CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1

target_dir=${CARGO_TARGET_DIR:-target}
for t in "${TARGETS[@]}"; do
    cargo zigbuild --release --locked -p hopd --bin hopd --bin hop --target "$t"
    out="$target_dir/static/$t"
    mkdir -p "$out"
    cp "$target_dir/$t/release/hopd" "$target_dir/$t/release/hop" "$out/"
done

for t in "${TARGETS[@]}"; do
    ls -l "$target_dir/static/$t/hopd" "$target_dir/static/$t/hop"
done

"$verify" || exit 0

fail=0
for t in "${TARGETS[@]}"; do
    for b in hopd hop; do
        f="$target_dir/static/$t/$b"
        desc=$(file -b "$f")
        echo "$f: $desc"
        case "$desc" in
            *"statically linked"* | *"static-pie linked"*) ;;
            *) echo "build-static: $f is not static" >&2; fail=1 ;;
        esac
    done
done

if ! command -v qemu-aarch64-static >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static >/dev/null
fi
# The packaged template configuration, checked by the aarch64 hopd with a throwaway key and
# a group that exists everywhere.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
arm="$target_dir/static/aarch64-unknown-linux-musl"
qemu-aarch64-static "$arm/hopd" --version
qemu-aarch64-static "$arm/hop" --help >/dev/null
# The key and members file the package's postinst makes, by the aarch64 hop.
qemu-aarch64-static "$arm/hop" keygen --out "$tmp/node.key" --members "$tmp/members" >/dev/null
sed -e "s|/etc/hopd/|$tmp/|g" -e 's|api_group = "hop"|api_group = "0"|' \
    packaging/hopd.toml >"$tmp/hopd.toml"
qemu-aarch64-static "$arm/hopd" --check-config "$tmp/hopd.toml"
exit "$fail"
