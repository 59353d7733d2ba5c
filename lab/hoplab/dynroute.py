"""Dynamic routing in the lab: babeld in every node namespace (spec `routing = "babel"`).

The Hop paper's §5.9 ran OLSR on its testbed; Debian no longer packages an OLSR daemon, so
the lab runs Babel (RFC 8966, babeld from Debian), a proactive protocol for wireless meshes
whose link cost comes from lost hellos, as OLSR-ETX's does. Its hellos and updates travel
over the emulated medium as IPv6 link-local multicast (802.11 broadcast: no retries, basic
rate), so routing costs airtime and loses packets like the paper's OLSR did, and the routes it
installs in each node's kernel table change while the flows run. Every transport then follows
the kernel: TCP and UDP directly, hopd through `kernel_routes = true` (netlink).

The lab reads the tables back (`ip -j route show proto babel`) to wait for convergence before
the flows start, to count hops, and every ROUTE_POLL_S during the run to count next-hop changes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time

from .errors import LabError

PROTO = "babel"
# Longest wait for the routes of every flow before the flows start anyway (they then wait
# for a route inside their transport, as on a real mesh).
CONVERGE_TIMEOUT_S = 90.0
# Every flow must stay routed this long to count as converged (babeld's wireless hello
# interval is 4 s; an update follows a changed cost within about one interval). Next hops
# may keep changing: on a loaded or lossy mesh they never settle (the paper's OLSR
# "constantly changes the routing topology").
STABLE_S = 8.0
ROUTE_POLL_S = 10.0


def binary() -> str:
    path = shutil.which("babeld")
    if path is None:
        raise LabError("babeld not found (routing = \"babel\"): run scripts/setup-lab.sh as root, "
                       "which installs the Debian package babeld")
    return path


def router_id(node: int) -> str:
    """A fixed EUI-64 router id per node (babeld would otherwise draw a random one)."""
    v = node + 1
    return f"02:48:4c:ff:fe:00:{v >> 8:02x}:{v & 0xFF:02x}"


def babeld_argv(node: int, iface: str, workdir) -> list[str]:
    """babeld in the foreground, its files in the run's directory, the lab interface declared
    wireless (link cost from hello loss, no split horizon)."""
    return [binary(), "-I", str(workdir / f"babeld-{node}.pid"), "-S", str(workdir / f"babeld-{node}.state"),
            "-d", "0", "-C", f"router-id {router_id(node)}", "-C", "default type wireless", iface]


def ipv6_sysctls(iface: str) -> list[str]:
    """Babel speaks IPv6 link-local; the lab keeps IPv6 off elsewhere. No duplicate address
    detection or router solicitations: they would only add frames."""
    return [f"net.ipv6.conf.{iface}.accept_dad=0", f"net.ipv6.conf.{iface}.router_solicitations=0",
            f"net.ipv6.conf.{iface}.disable_ipv6=0"]


def parse_table(text: str, node_of) -> dict[int, int]:
    """`ip -j route` output -> {destination node: next-hop node} for host routes of lab nodes.
    `node_of(ip)` maps an address to a node index or None."""
    out: dict[int, int] = {}
    try:
        entries = json.loads(text or "[]")
    except ValueError:
        return out
    for r in entries:
        # babeld keeps a lost destination as an `unreachable` route for a while: no next hop.
        if r.get("type", "unicast") != "unicast":
            continue
        d = node_of(str(r.get("dst", "")).split("/")[0])
        gw = node_of(str(r.get("gateway", r.get("dst", ""))).split("/")[0])
        if d is not None and gw is not None:
            out[d] = gw
    return out


def read_tables(n: int, ns_name, node_of) -> dict[int, dict[int, int]]:
    table = {}
    for i in range(n):
        p = subprocess.run(["ip", "-j", "-n", ns_name(i), "-4", "route", "show", "proto", PROTO],
                           capture_output=True, text=True, check=False)
        table[i] = parse_table(p.stdout, node_of)
    return table


def unrouted(table: dict[int, dict[int, int]], pairs) -> list[tuple[int, int]]:
    """Pairs whose next hops, followed from the source, do not reach the destination."""
    bad = []
    for src, dst in pairs:
        a, steps = src, 0
        while a != dst and steps <= len(table):
            a = table.get(a, {}).get(dst, -1)
            steps += 1
            if a < 0:
                break
        if a != dst:
            bad.append((src, dst))
    return bad


def changes(old: dict[int, dict[int, int]], new: dict[int, dict[int, int]]) -> int:
    """Entries (node, destination) whose next hop differs, appeared or disappeared."""
    k = 0
    for i in set(old) | set(new):
        a, b = old.get(i, {}), new.get(i, {})
        k += sum(1 for d in set(a) | set(b) if a.get(d) != b.get(d))
    return k


def wait_converged(read, pairs, progress, timeout: float = CONVERGE_TIMEOUT_S,
                   stable: float = STABLE_S, poll: float = 2.0, clock=time.monotonic, sleep=time.sleep,
                   check=lambda: None):
    """Poll `read()` until every pair has been routed for `stable` seconds (next hops may
    change meanwhile), or `timeout` passes. Returns (table, seconds waited, unrouted pairs).
    `check()` runs before every poll and may raise to end the wait (a medium that died)."""
    t0 = clock()
    since = None  # since when every pair is routed
    while True:
        check()
        table = read()
        now = clock()
        missing = unrouted(table, pairs)
        if missing:
            since = None
        elif since is None:
            since = now
        if since is not None and now - since >= stable:
            return table, now - t0, []
        if now - t0 >= timeout:
            progress(f"routing: {len(missing)} of {len(pairs)} flows still without a route after "
                     f"{timeout:.0f} s; starting anyway")
            return table, now - t0, missing
        sleep(poll)


class Poller:
    """Reads the routing tables every `interval` seconds in a thread of its own, so that the
    lab's run loop (flow starts, scheduled events, progress samples) never waits for `ip`.
    `polls` holds [seconds since `t0`, next-hop changes since the previous poll, routes]."""

    def __init__(self, read, table: dict[int, dict[int, int]], t0: float,
                 interval: float = ROUTE_POLL_S, clock=time.time):
        self.read, self.table, self.t0, self.interval, self.clock = read, table, t0, interval, clock
        self.polls: list[list] = []
        self.next_hop_changes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="route-poller", daemon=True)

    def start(self) -> "Poller":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            new = self.read()
            if self._stop.is_set():  # the run ended while reading: namespaces may be going
                return
            k = changes(self.table, new)
            self.table = new
            self.polls.append([round(self.clock() - self.t0, 1), k, sum(len(r) for r in new.values())])
            self.next_hop_changes += k

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
