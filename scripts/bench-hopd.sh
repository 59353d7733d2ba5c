#!/usr/bin/env bash
# Benchmark hopd against iperf3 over veth chains in network namespaces (no loss).
#
#   sudo scripts/bench-hopd.sh [SIZE_MB]
#
# For a 1-hop and a 3-hop chain it reports, side by side: hopd goodput for one file of
# SIZE_MB (default 200) MiB and the CPU time of all hopd processes per MB moved (and of the
# source, the mean relay and the destination); iperf3 UDP
# (1400-byte datagrams, unlimited rate) receiver goodput; the receiver goodput of two senders
# that batch system calls (crates/hopd/examples/udp_blast.rs: sendmmsg of 64 datagrams of
# 1,400 bytes, and 64 KiB buffers cut into 1,400-byte datagrams by UDP GSO), 5 s each; iperf3
# TCP goodput; and hopd over the sendmmsg sender. Then the memory
# of a hopd holding 200 idle flows. Needs root, iproute2, iperf3, python3; builds hopd in
# release mode. Every namespace is deleted on exit.
#
# Environment: HOPD_BIN_DIR=dir uses prebuilt hopd and hop from dir (no build; to compare
# builds back to back); BENCH_HOPS="3" runs only the listed chain lengths (default "1 3");
# PERF_DATA=file records a system-wide perf profile of each hopd transfer to file.<hops>
# (needs perf); HOP_PARAMS='key = value' adds lines to every node's [hop] section (e.g.
# HOP_PARAMS='link_window_packets = 0' for the paper's unbounded sender); HOP_SECURITY='key =
# value' adds lines to [security] (e.g. HOP_SECURITY='encrypt = false'), HOP_STORAGE to
# [storage] (e.g. HOP_STORAGE='custody_write_delay = "0s"').
set -euo pipefail

SIZE_MB=${1:-200}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib/chain.sh
. "$ROOT/scripts/lib/chain.sh"

[ "$(id -u)" = 0 ] || { echo "run as root (network namespaces)" >&2; exit 1; }
command -v iperf3 >/dev/null || { echo "iperf3 is missing: apt-get install iperf3" >&2; exit 1; }
chain_bins

cpu_ticks() { # total utime+stime of the given pids, in clock ticks
    local t=0
    for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
    echo "$t"
}

FILE="$WORK/payload.bin"
head -c $((SIZE_MB * 1024 * 1024)) /dev/urandom >"$FILE"
HZ=$(getconf CLK_TCK)
ROWS=()

for HOPS in ${BENCH_HOPS:-1 3}; do
    N=$((HOPS + 1)); C="${PREFIX}c$N"
    make_chain "$N"
    first=${#PIDS[@]}
    for ((i = 1; i <= N; i++)); do start_hopd "$N" "$i"; done
    HP=("${PIDS[@]:$first}")
    t0=$(cpu_ticks "${HP[@]}"); s0=$(date +%s.%N)
    T0=(); for p in "${HP[@]}"; do T0+=("$(cpu_ticks "$p")"); done
    if [ -n "${PERF_DATA:-}" ]; then
        perf record -q -g -a -o "$PERF_DATA.$HOPS" -- "$HOP" --socket "$WORK/c$N/n1/hopd.sock" send --quiet "$FILE" --to "$N" 2>/dev/null
    else
        "$HOP" --socket "$WORK/c$N/n1/hopd.sock" send --quiet "$FILE" --to "$N"
    fi
    s1=$(date +%s.%N); t1=$(cpu_ticks "${HP[@]}")
    # Per role: the source, the relays (their mean) and the destination, ms per MB.
    ROLE=(); for ((i = 0; i < N; i++)); do ROLE+=("$(( $(cpu_ticks "${HP[$i]}") - ${T0[$i]} ))"); done
    per_mb() { echo "$1 * 1000 / $HZ / $SIZE_MB" | bc -l; }
    RELAYS=0; for ((i = 1; i < N - 1; i++)); do RELAYS=$((RELAYS + ROLE[i])); done
    RELAY=-; [ "$N" -gt 2 ] && RELAY=$(printf '%.1f' "$(per_mb "$(echo "$RELAYS / ($N - 2)" | bc -l)")")
    ROLES=$(printf '%.1f / %s / %.1f' "$(per_mb "${ROLE[0]}")" "$RELAY" "$(per_mb "${ROLE[$((N - 1))]}")")
    "$HOP" --socket "$WORK/c$N/n$N/hopd.sock" recv --dir "$WORK/c$N/out" --count 1 >/dev/null
    cmp -s "$FILE" "$WORK/c$N/out/payload.bin" || { echo "hopd delivered a different file" >&2; exit 1; }
    HOPD_MBPS=$(echo "$SIZE_MB * 8 * 1.048576 / ($s1 - $s0)" | bc -l)
    CPU_MS_PER_MB=$(echo "($t1 - $t0) * 1000 / $HZ / $SIZE_MB" | bc -l)
    for p in "${HP[@]}"; do kill "$p" 2>/dev/null || true; done
    DST="10.$TAG.$((N * 10 + N - 2)).2"
    ip netns exec "${C}n$((N - 1))" iperf3 -s -D -1 -p 5201 >/dev/null 2>&1
    sleep 0.3
    UDP=$(ip netns exec "${C}n0" iperf3 -c "$DST" -p 5201 -u -b 0 -l 1400 -t 5 -J |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum"]["bits_per_second"]/1e6)' 2>/dev/null || echo nan)
    ip netns exec "${C}n$((N - 1))" iperf3 -s -D -1 -p 5202 >/dev/null 2>&1
    sleep 0.3
    TCP=$(ip netns exec "${C}n0" iperf3 -c "$DST" -p 5202 -t 5 -J |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e6)' 2>/dev/null || echo nan)
    # The same chain from senders that batch their system calls (udp_blast: 64 datagrams of
    # 1,400 bytes per sendmmsg call, or 64 KiB per sendmsg cut by UDP GSO, as hopd's data
    # socket sends), 5 s each; the receiver's goodput.
    blast() {
        ip netns exec "${C}n$((N - 1))" "$BLAST" recv "$DST:5301" 8 >"$WORK/blast.json" &
        local rx=$!
        sleep 0.3
        ip netns exec "${C}n0" "$BLAST" send "$DST:5301" 5 "$1" 1400 2>/dev/null || true
        wait "$rx" || true
        python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["mbps"])' "$WORK/blast.json" 2>/dev/null || echo nan
    }
    MMSG=$(blast sendmmsg)
    GSO=$(blast gso)
    ROWS+=("$(printf '| %d | %.0f | %.1f | %s | %.0f | %.0f | %.0f | %.0f | %.2f |' "$HOPS" "$HOPD_MBPS" "$CPU_MS_PER_MB" "$ROLES" "$UDP" "$MMSG" "$GSO" "$TCP" "$(echo "$HOPD_MBPS / $MMSG" | bc -l 2>/dev/null || echo nan)")")
done

# Memory per idle flow: 200 local flows announced but sent nothing.
N=2; first=${#PIDS[@]}
make_chain 2 2>/dev/null || true
start_hopd 2 1 && start_hopd 2 2
SRC_PID=${PIDS[$first]}
rss() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
R0=$(rss "$SRC_PID")
python3 - "$WORK/c2/n1/hopd.sock" <<'EOF' &
import json, socket, struct, sys, time
conns = []
for i in range(200):
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
    m = json.dumps({"op": "send", "v": 1, "to": 2, "name": f"idle{i}", "size": 1 << 30}).encode()
    s.sendall(struct.pack(">I", len(m)) + m); conns.append(s)
time.sleep(4)
EOF
IDLE=$!
sleep 2
R1=$(rss "$SRC_PID")
wait $IDLE || true

echo
echo "hopd vs iperf3 over veth chains (no loss), ${SIZE_MB} MiB file, $(nproc) cores"
echo
echo "| hops | hopd goodput (Mb/s) | hopd CPU (ms per MB, all nodes) | of which source / relay (mean) / destination | iperf3 UDP 1400 B (Mb/s) | sendmmsg 64 x 1400 B (Mb/s) | UDP GSO 64 KiB / 1400 B (Mb/s) | iperf3 TCP (Mb/s) | hopd / sendmmsg |"
echo "|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
echo
echo "memory per idle flow (source hopd, 200 flows): $(( (R1 - R0) * 1024 / 200 )) bytes (RSS $R0 -> $R1 KiB)"
