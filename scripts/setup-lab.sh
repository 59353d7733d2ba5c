#!/usr/bin/env bash
# Set up the emulation lab (lab/, package hoplab): Debian packages, the venv at
# $REPO/.venv with exactly pinned Python dependencies. Idempotent: safe to run again
# on a machine that already has it.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"

# Debian packages: ip/nsenter/chrt for namespaces and SCHED_FIFO, iperf3 and ping for
# manual checks, nftables for random drops outside ns-3, python3-venv for the venv, a C
# compiler (ring, used by hopd, builds assembly; rustc links with cc), babeld for the
# experiments with dynamic routing (spec routing = "babel").
PKGS=(iproute2 util-linux procps iperf3 iputils-ping nftables python3-venv gcc libc6-dev babeld)
if [ "$(id -u)" = 0 ]; then
    missing=()
    for p in "${PKGS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
else
    echo "setup-lab: not root; skipping apt-get (the lab itself needs root to run)" >&2
fi

# The ns3 wheel (ns3==3.44.post0) is built for CPython 3.11 only.
PY=""
for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 &&
        "$cand" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
        PY="$(command -v "$cand")"
        break
    fi
done
if [ -z "$PY" ]; then
    echo "setup-lab: need Python 3.11 (the ns3 wheel is cp311)" >&2
    exit 1
fi
if [ ! -x "$VENV/bin/python" ] ||
    ! "$VENV/bin/python" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
fi

"$VENV/bin/pip" install -q --disable-pip-version-check -r "$REPO/lab/requirements.txt"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -e "$REPO/lab"

echo "setup-lab: ready ($VENV/bin/hoplab)"
