#!/usr/bin/env bash
# Benchmark hopd's loss recovery against TCP BBR and CUBIC on lossy veth chains.
#
#   sudo scripts/bench-loss.sh [SIZE_MB]
#
# For every chain length in BENCH_HOPS (default "1") and every loss rate in LOSS_PCTS
# (default "0 10 30", percent of packets dropped at random on every link, both directions),
# one run each, back to back on the same chain: hopd moving one file of SIZE_MB (default 100)
# MiB, iperf3 TCP with BBR and with CUBIC (10 s each). RATE_MBIT (default unset) shapes every
# link with tbf at that rate (both directions), e.g. RATE_MBIT=100.
#
# Loss acts on single packets: every veth has gso_max_segs 1, so the kernel cuts UDP GSO
# batches and TCP segments into single packets before they leave, and nftables drops at the
# receiving end (prerouting, `numgen random`). A hopd transfer that has not finished within
# TIMEOUT_S (default 120) seconds is reported as "> TIMEOUT_S s"; an iperf3 run that has not
# ended 40 s after it started (its control connection crosses the lossy links too) as nan.
#
# Environment: HOPD_BIN_DIR=dir uses prebuilt hopd and hop from dir (no build);
# HOP_PARAMS='key = value' adds lines to every node's [hop] section; REPEATS=n runs each
# cell n times (default 1); SKIP_TCP=1 runs hopd alone (to compare hopd settings);
# COUNTERS="name ..." prints those Hop counters of every node after each hopd run (the names
# of `hop --json status`, e.g. "bsyn_behind rounds_overtaken bsyn_repeat time_round_ms");
# WARMUP=1 first moves a 1 MiB file over the same daemons, untimed, so that the measured
# transfer meets neighbours whose loss and order are already learnt, as on nodes that have
# run a while (each hopd run starts fresh daemons otherwise).
# Needs root, iproute2, nftables, iperf3, python3, bc. Every namespace is deleted on exit.
set -euo pipefail

SIZE_MB=${1:-100}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/chain.sh
. "$ROOT/scripts/lib/chain.sh"
TIMEOUT_S=${TIMEOUT_S:-120}
REPEATS=${REPEATS:-1}

[ "$(id -u)" = 0 ] || { echo "run as root (network namespaces)" >&2; exit 1; }
for c in iperf3 nft bc; do
    command -v "$c" >/dev/null || { echo "$c is missing (apt-get install iperf3 nftables bc)" >&2; exit 1; }
done
grep -qw bbr /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null ||
    echo "warning: tcp_bbr is not available; the BBR column will fail" >&2

chain_bins
FILE="$WORK/payload.bin"
head -c $((SIZE_MB * 1024 * 1024)) /dev/urandom >"$FILE"
ROWS=()

# set_loss N PCT: every namespace of chain N drops PCT % of the packets arriving on its veths.
set_loss() {
    local n=$1 pct=$2 c="${PREFIX}c$1"
    for ((i = 0; i < n; i++)); do
        ip netns exec "${c}n$i" nft delete table inet hoploss 2>/dev/null || true
        ((pct == 0)) && continue
        ip netns exec "${c}n$i" nft add table inet hoploss
        ip netns exec "${c}n$i" nft add chain inet hoploss pre '{ type filter hook prerouting priority -300; policy accept; }'
        ip netns exec "${c}n$i" nft add rule inet hoploss pre iifname "h${TAG}x*" numgen random mod 1000 '<' $((pct * 10)) drop
    done
}

# shape N: gso_max_segs 1 on every veth (per-packet loss), tbf at RATE_MBIT when set.
shape() {
    local n=$1 c="${PREFIX}c$1"
    for ((k = 0; k < n - 1; k++)); do
        for end in "$k a" "$((k + 1)) b"; do
            set -- $end
            local ns="${c}n$1" dev="h${TAG}x${n}v${k}$2"
            ip -n "$ns" link set dev "$dev" gso_max_segs 1
            if [ -n "${RATE_MBIT:-}" ]; then
                ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "${RATE_MBIT}mbit" burst 64kb latency 20ms
            fi
        done
    done
}

tcp_run() { # tcp_run N CC -> Mbit/s received
    local n=$1 cc=$2 c="${PREFIX}c$1" port=$((5300 + RANDOM % 500))
    local dst="10.$TAG.$((n * 10 + n - 2)).2"
    ip netns exec "${c}n$((n - 1))" iperf3 -s -D -1 -p "$port" >/dev/null 2>&1
    sleep 0.3
    # iperf3's control connection crosses the same lossy links and can stall for good.
    # A run timed out (status 124 under pipefail) may still have printed its figure: one
    # value per run, nan only when there is none.
    local mbit
    mbit=$(timeout 40 ip netns exec "${c}n0" iperf3 -c "$dst" -p "$port" -C "$cc" -t 10 -J 2>/dev/null |
        python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e6))' 2>/dev/null) || true
    echo "${mbit:-nan}"
}

hopd_run() { # hopd_run N -> "Mbit/s" or "> T s (x MiB)"
    local n=$1 first=${#PIDS[@]}
    for ((i = 1; i <= n; i++)); do start_hopd "$n" "$i"; done
    local hp=("${PIDS[@]:$first}") s0 s1 out
    rm -rf "$WORK/c$n/out"
    if [ "${WARMUP:-0}" = 1 ]; then
        [ -f "$WORK/warmup.bin" ] || head -c $((1024 * 1024)) /dev/urandom >"$WORK/warmup.bin"
        timeout "$TIMEOUT_S" "$HOP" --socket "$WORK/c$n/n1/hopd.sock" send --quiet "$WORK/warmup.bin" --to "$n" ||
            echo "warm-up transfer did not finish" >&2
        "$HOP" --socket "$WORK/c$n/n$n/hopd.sock" recv --dir "$WORK/c$n/warm" --count 1 >/dev/null || true
        rm -rf "$WORK/c$n/warm"
    fi
    s0=$(date +%s.%N)
    if timeout "$TIMEOUT_S" "$HOP" --socket "$WORK/c$n/n1/hopd.sock" send --quiet "$FILE" --to "$n"; then
        s1=$(date +%s.%N)
        "$HOP" --socket "$WORK/c$n/n$n/hopd.sock" recv --dir "$WORK/c$n/out" --count 1 >/dev/null
        cmp -s "$FILE" "$WORK/c$n/out/payload.bin" || { echo "hopd delivered a different file" >&2; exit 1; }
        out=$(echo "$SIZE_MB * 8 * 1.048576 / ($s1 - $s0)" | bc -l | xargs printf '%.1f')
    else
        out="> ${TIMEOUT_S} s"
    fi
    if [ -n "${COUNTERS:-}" ]; then
        for ((i = 1; i <= n; i++)); do
            "$HOP" --socket "$WORK/c$n/n$i/hopd.sock" --json status 2>/dev/null |
                python3 -c 'import json, sys
v = json.load(sys.stdin)
for name, st in v["node"]["transports"]:
    e = st.get("extra", {})
    print("  node %s %s: %s" % (sys.argv[1], name, " ".join("%s=%s" % (k, e.get(k, 0)) for k in sys.argv[2].split())))' "$i" "$COUNTERS" >&2 || true
        done
    fi
    for p in "${hp[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 0.3
    for ((i = 1; i <= n; i++)); do rm -rf "$WORK/c$n/n$i"; done
    echo "$out"
}

for HOPS in ${BENCH_HOPS:-1}; do
    N=$((HOPS + 1))
    make_chain "$N"
    shape "$N"
    for PCT in ${LOSS_PCTS:-0 10 30}; do
        set_loss "$N" "$PCT"
        for ((r = 1; r <= REPEATS; r++)); do
            H=$(hopd_run "$N")
            B=nan C=nan
            [ "${SKIP_TCP:-0}" = 1 ] || { B=$(tcp_run "$N" bbr); C=$(tcp_run "$N" cubic); }
            ROWS+=("| $HOPS | $PCT | $H | $B | $C |")
            echo "hops $HOPS loss $PCT %: hopd $H, BBR $B, CUBIC $C Mbit/s" >&2
        done
    done
done

echo
echo "hopd and TCP over lossy veth chains: ${SIZE_MB} MiB file for hopd, 10 s iperf3 runs," \
    "per-packet random loss on every link both ways, rate ${RATE_MBIT:-unlimited} Mbit/s, $(nproc) cores"
echo
echo "| hops | loss % | hopd (Mb/s) | TCP BBR (Mb/s) | TCP CUBIC (Mb/s) |"
echo "|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
