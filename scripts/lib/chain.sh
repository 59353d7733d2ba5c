# Shared by the hopd benchmarks: veth chains in network namespaces and hopd nodes on them.
# Source it; it sets WORK (a temporary directory), PREFIX, TAG, PORT and the arrays NSES and
# PIDS, and installs an EXIT trap that kills the started processes, deletes the namespaces
# and WORK.

TAG=$((RANDOM % 200 + 20))
PREFIX="hb$$"
WORK=$(mktemp -d /tmp/hopd-bench.XXXXXX)
PORT=7470
NSES=()
PIDS=()

cleanup() {
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
    sleep 0.2
    for n in "${NSES[@]:-}"; do [ -n "$n" ] && ip netns del "$n" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

# chain_bins: HOPD and HOP from HOPD_BIN_DIR, or a release build of this tree; a fresh KEY.
chain_bins() {
    if [ -n "${HOPD_BIN_DIR:-}" ]; then
        BIN="$HOPD_BIN_DIR"
    else
        (cd "$ROOT" && cargo build --release -p hopd >&2)
        BIN="$ROOT/target/release"
    fi
    HOPD="$BIN/hopd"
    HOP="$BIN/hop"
    # The reference UDP senders (sendmmsg, GSO) are always this tree's.
    (cd "$ROOT" && cargo build --release -p hopd --example udp_blast >&2)
    BLAST="$ROOT/target/release/examples/udp_blast"
    KEY=$(head -c32 /dev/urandom | od -An -tx1 | tr -d ' \n')
}

# make_chain NODES: namespaces ${PREFIX}c${NODES}n0.. joined by veths; IP forwarding and routes
# so plain IP traffic (iperf3) crosses the chain too. Link k joins node k+1 (10.TAG.(10N+k).1)
# and node k+2 (.2), nodes counted from 1; veth ends h${TAG}x${NODES}v${k}{a,b}.
make_chain() {
    local nodes=$1 c="${PREFIX}c$1"
    for ((i = 0; i < nodes; i++)); do
        ip netns add "${c}n$i"; NSES+=("${c}n$i")
        ip -n "${c}n$i" link set lo up
        ip netns exec "${c}n$i" sysctl -qw net.ipv4.ip_forward=1
    done
    for ((k = 0; k < nodes - 1; k++)); do
        ip link add "h${TAG}x${nodes}v${k}a" netns "${c}n$k" type veth peer name "h${TAG}x${nodes}v${k}b" netns "${c}n$((k + 1))"
        ip -n "${c}n$k" addr add "10.$TAG.$((nodes * 10 + k)).1/24" dev "h${TAG}x${nodes}v${k}a"
        ip -n "${c}n$((k + 1))" addr add "10.$TAG.$((nodes * 10 + k)).2/24" dev "h${TAG}x${nodes}v${k}b"
        ip -n "${c}n$k" link set "h${TAG}x${nodes}v${k}a" up
        ip -n "${c}n$((k + 1))" link set "h${TAG}x${nodes}v${k}b" up
    done
    # Routes to every link subnet via the neighbour towards it.
    for ((i = 0; i < nodes; i++)); do
        for ((k = 0; k < nodes - 1; k++)); do
            if ((k > i)); then
                ip -n "${c}n$i" route add "10.$TAG.$((nodes * 10 + k)).0/24" via "10.$TAG.$((nodes * 10 + i)).2" 2>/dev/null || true
            elif ((k < i - 1)); then
                ip -n "${c}n$i" route add "10.$TAG.$((nodes * 10 + k)).0/24" via "10.$TAG.$((nodes * 10 + i - 1)).1" 2>/dev/null || true
            fi
        done
    done
}

# Address of node i (1-based) as seen from its neighbour j in an n-node chain.
addr() {
    local n=$1 i=$2 j=$3
    if ((j == i + 1)); then echo "10.$TAG.$((n * 10 + i - 1)).1"; else echo "10.$TAG.$((n * 10 + j - 1)).2"; fi
}

# start_hopd N I: hopd as node I of the N-node chain, in WORK/cN/nI; waits for its socket.
start_hopd() {
    local n=$1 i=$2 c="${PREFIX}c$1" d="$WORK/c$1/n$2"
    mkdir -p "$d"
    {
        echo "node_id = $i"
        echo "listen = \"0.0.0.0:$PORT\""
        echo "api_socket = \"$d/hopd.sock\""
        echo "log_level = \"warn\""
        for j in $((i - 1)) $((i + 1)); do
            if ((j >= 1 && j <= n)); then printf '[[neighbours]]\nid = %s\naddress = "%s:%s"\n' "$j" "$(addr "$n" "$j" "$i")" "$PORT"; fi
        done
        for ((dst = 1; dst <= n; dst++)); do
            if ((dst > i + 1)); then printf '[[routes]]\ndestination = %s\nnext_hop = %s\n' "$dst" $((i + 1)); fi
            if ((dst < i - 1)); then printf '[[routes]]\ndestination = %s\nnext_hop = %s\n' "$dst" $((i - 1)); fi
        done
        printf '[storage]\ndir = "%s/store"\n' "$d"
        if [[ -n "${HOP_STORAGE:-}" ]]; then printf '%s\n' "$HOP_STORAGE"; fi
        printf '[security]\nmesh_key = "%s"\n' "$KEY"
        if [[ -n "${HOP_SECURITY:-}" ]]; then printf '%s\n' "$HOP_SECURITY"; fi
        if [[ -n "${HOP_PARAMS:-}" ]]; then printf '[hop]\n%s\n' "$HOP_PARAMS"; fi
    } >"$d/hopd.toml"
    ip netns exec "${c}n$((i - 1))" "$HOPD" --config "$d/hopd.toml" 2>"$d/log" &
    PIDS+=($!)
    for _ in $(seq 100); do [ -S "$d/hopd.sock" ] && break; sleep 0.05; done
}
