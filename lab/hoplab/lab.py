"""The orchestrator: builds the emulated network, runs an experiment, tears down.

Everything the lab creates is named with PREFIX ("hl-"): namespaces hl-n<i>,
taps hl-t<i>. Teardown runs on success, errors, timeouts, Ctrl-C and SIGTERM;
`hoplab clean` removes anything left by a crashed orchestrator.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import dynroute, mediumserver, routes
from .addresses import BROADCAST, IFACE, ip_of, mac_of, node_of
from .drivers import DRIVERS
from .errors import LabError
from .spec import DYNAMIC_ROUTING, Spec

PREFIX = "hl-"
LOCK_PATH = Path("/run/hoplab.lock")
MEDIUM_PID = Path("/run/hoplab-medium.pid")
# Unix sockets of the run's daemons (hopd's API). A socket path must fit in sun_path (108
# bytes), which a run directory deep in an output tree need not; one emulation runs at a time.
SOCKET_DIR = Path("/run/hoplab-sockets")
LOCK_WAIT_S = float(os.environ.get("HOPLAB_LOCK_WAIT", "900"))  # wait for a running emulation
IN_RANGE_DB = 50.0  # path loss between nodes in range (rx at about -34 dBm: strong, carrier sensed)
# Path loss between a topology's sense pairs (topology.with_sense_range): received at about
# -80 dBm, above ns-3's preamble detection floor (-82 dBm), so the PHY locks on and the air is
# busy, and 46 dB below a neighbour's frame as interference. Every such frame is dropped after
# reception (frame loss 1), so a sense pair never becomes a link.
SENSE_DB = 96.0
OUT_OF_RANGE_DB = 1000.0
PROGRESS_INTERVAL_S = 2.0  # how often the run samples every flow's received bytes


def ns_name(i: int) -> str:
    return f"{PREFIX}n{i}"


def tap_name(i: int) -> str:
    return f"{PREFIX}t{i}"


def sh(*args: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise LabError(f"command failed: {' '.join(args)}: {r.stderr.strip()}")
    return r


def _ip_batch(lines: list[str], netns: str | None = None) -> None:
    cmd = ["ip"] + (["-n", netns] if netns else []) + ["-batch", "-"]
    r = subprocess.run(cmd, input="\n".join(lines) + "\n", capture_output=True, text=True)
    if r.returncode != 0:
        raise LabError(f"ip -batch failed: {r.stderr.strip()}")


def lab_namespaces() -> list[str]:
    r = sh("ip", "netns", "list", check=False)
    return [ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith(PREFIX)]


def lab_links() -> list[str]:
    r = sh("ip", "-o", "link", "show", check=False)
    out = []
    for ln in r.stdout.splitlines():
        parts = ln.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(PREFIX):
                out.append(name)
    return out


def _kill_pids(pids: list[int]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for p in pids:
            try:
                os.kill(p, sig)
                alive.append(p)
            except ProcessLookupError:
                pass
        if not alive:
            return
        t_end = time.time() + 2.0
        while time.time() < t_end and any(_alive(p) for p in alive):
            time.sleep(0.05)
        pids = [p for p in alive if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        st = Path(f"/proc/{pid}/stat").read_text().split()
        return st[2] != "Z"
    except OSError:
        return False


def clean(verbose: bool = True) -> dict:
    """Remove every namespace and link named with the lab prefix, the processes
    inside those namespaces, and a leftover medium process."""
    removed = {"processes": 0, "namespaces": 0, "links": 0}
    for nsn in lab_namespaces():
        r = sh("ip", "netns", "pids", nsn, check=False)
        pids = [int(x) for x in r.stdout.split() if x.isdigit()]
        _kill_pids(pids)
        removed["processes"] += len(pids)
    if MEDIUM_PID.exists():
        try:
            pid = int(MEDIUM_PID.read_text().strip())
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            if "hoplab.medium" in cmd:
                _kill_pids([pid])
                removed["processes"] += 1
        except (ValueError, OSError):
            pass
        MEDIUM_PID.unlink(missing_ok=True)
    shutil.rmtree(SOCKET_DIR, ignore_errors=True)
    for nsn in lab_namespaces():
        sh("ip", "netns", "del", nsn, check=False)
        removed["namespaces"] += 1
    for ln in lab_links():
        sh("ip", "link", "del", ln, check=False)
        removed["links"] += 1
    if verbose:
        print(f"hoplab clean: removed {removed}")
    return removed


class Lab:
    """One experiment run. Use as a context manager: teardown always runs."""

    def __init__(self, spec: Spec, out: Path, progress=print):
        self.spec = spec
        # Absolute: the paths are handed to programs in other working directories (hopd
        # resolves relative paths against its config file's directory).
        self.out = Path(out).resolve()
        self.work = self.out / "raw"
        self.sockets = SOCKET_DIR  # created afresh once the run holds the lock
        self.progress = progress
        self.procs: list[subprocess.Popen] = []
        self.medium: subprocess.Popen | mediumserver.ForkedMedium | None = None
        self.lock_fd: int | None = None
        # Next hop per node and destination: the lab's static routes, or with a routing daemon
        # (spec.routing in DYNAMIC_ROUTING) the kernel tables read once routing converged.
        self.dynamic = spec.routing in DYNAMIC_ROUTING
        self.table = {} if self.dynamic else routes.next_hops(spec.topology, spec.routing)
        self.routing_log: dict = {}
        self.poller: dynroute.Poller | None = None
        self.t0: float | None = None
        self.events_log: list[dict] = []

    # ---- helpers used by drivers -----------------------------------------
    def ip(self, node: int) -> str:
        return ip_of(node)

    def link_status_socket(self, node: int) -> Path:
        """Where node `node`'s daemon receives its MAC backlog from the medium (medium.link_status)."""
        return self.sockets / f"link-{node}.sock"

    def flow_file(self, idx: int, role: str) -> Path:
        return self.work / f"flow{idx}-{role}.json"

    def spawn(self, node: int, args: list[str], tag: str, module: str = "hoplab.flowtool") -> subprocess.Popen:
        cmd = _in_ns(node) + [sys.executable, "-m", module] + args
        log = open(self.work / f"{tag}.log", "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        log.close()
        self.procs.append(p)
        return p

    def spawn_cmd(self, node: int, argv: list[str], tag: str) -> subprocess.Popen:
        cmd = _in_ns(node) + argv
        log = open(self.work / f"{tag}.log", "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        log.close()
        self.procs.append(p)
        return p

    # ---- lifecycle -----------------------------------------------------------
    def __enter__(self):
        if os.geteuid() != 0:
            raise LabError("hoplab needs root (network namespaces, taps)")
        LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
        self.lock_fd = os.open(LOCK_PATH, os.O_CREAT | os.O_RDWR, 0o644)
        deadline = time.time() + LOCK_WAIT_S
        told = False
        while True:
            try:
                fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if time.time() >= deadline:
                    os.close(self.lock_fd)
                    self.lock_fd = None
                    raise LabError("another emulation is still running (lock /run/hoplab.lock)") from e
                if not told:
                    self.progress("waiting for another emulation to finish (one at a time)")
                    told = True
                time.sleep(1.0)
        if lab_namespaces() or lab_links():
            self.progress("removing leftovers of an earlier run")
            clean(verbose=False)
        self.work.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(SOCKET_DIR, ignore_errors=True)
        SOCKET_DIR.mkdir(mode=0o700, parents=True)
        self._old_term = signal.signal(signal.SIGTERM, _term_to_interrupt)
        return self

    def __exit__(self, *exc):
        try:
            self.teardown()
        finally:
            signal.signal(signal.SIGTERM, self._old_term)
            if self.lock_fd is not None:
                os.close(self.lock_fd)
        return False

    def teardown(self) -> None:
        if self.poller is not None:
            self.poller.stop()
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        t_end = time.time() + 3
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, t_end - time.time()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        if self.medium is not None and self.medium.poll() is None:
            self.medium_cmd("stop")
            try:
                self.medium.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.medium.kill()
                self.medium.wait()
        MEDIUM_PID.unlink(missing_ok=True)
        clean(verbose=False)

    def check_medium(self) -> None:
        """Raise if the medium has ended: it ends only when told to, so the run cannot go on."""
        if self.medium is not None and self.medium.poll() is not None:
            log = self.work / "medium.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise LabError(f"the medium exited during the run: see {log}" + (f":\n{tail}" if tail else ""))

    def medium_cmd(self, line: str) -> None:
        if self.medium is None or self.medium.stdin is None or self.medium.poll() is not None:
            return
        try:
            self.medium.stdin.write((line + "\n").encode())
            self.medium.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        if self.t0 is not None:
            self.events_log.append({"t": round(time.time() - self.t0, 3), "cmd": line})

    def start_medium(self) -> None:
        spec, t = self.spec, self.spec.topology
        data, control, bcast = spec.medium.modes()
        links = [[a, b, IN_RANGE_DB, loss] for (a, b), loss in sorted(t.links.items())]
        links += [[x, y, SENSE_DB, 1.0] for (a, b) in sorted(t.sense) for (x, y) in ((a, b), (b, a))]
        cfg = {
            "nodes": t.n,
            "macs": [mac_of(i) for i in range(t.n)],
            "taps": [tap_name(i) for i in range(t.n)],
            "standard": spec.medium.standard,
            "data_mode": data,
            "control_mode": control,
            "nonunicast_mode": bcast,
            "auto_rate": spec.medium.auto_rate,
            # ns-3's FrameRetryLimit counts transmission attempts, the spec counts retransmissions.
            "frame_retry_limit": spec.medium.retry_limit + 1,
            "rts_threshold": spec.medium.rts_threshold_bytes(),
            "txop_us": spec.medium.txop_us,
            "classify_dscp": spec.medium.classify_dscp,
            "overhear": spec.medium.overhear,
            "link_status": [str(self.link_status_socket(i)) for i in range(t.n)] if spec.reports_link_status() else [],
            "no_retry_tids": spec.medium.no_retry_tids(),
            "links": links,
            "seed": spec.seed,
            "out": str(self.work / "medium.json"),
            "max_seconds": spec.duration + 600,
        }
        (self.work / "medium-config.json").write_text(json.dumps(cfg, indent=1))
        self.medium = mediumserver.fork_medium(self.work / "medium-config.json", self.work / "medium.log")
        if self.medium is None:
            cmd = mediumserver.rt_prefix() + [sys.executable, "-m", "hoplab.medium",
                                              str(self.work / "medium-config.json")]
            log = open(self.work / "medium.log", "w")
            self.medium = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
            log.close()
        MEDIUM_PID.write_text(str(self.medium.pid))
        self.progress(f"medium: starting ns-3 ({t.n} nodes, 802.11{spec.medium.standard}"
                      f" {'auto-rate' if spec.medium.auto_rate else f'{spec.medium.rate_mbps:g} Mbit/s'})")
        deadline = time.time() + 180
        want = {tap_name(i) for i in range(t.n)}
        while True:
            if self.medium.poll() is not None:
                raise LabError(f"medium exited early: see {self.work / 'medium.log'}:\n"
                               + (self.work / "medium.log").read_text()[-2000:])
            if want <= set(lab_links()):
                break
            if time.time() > deadline:
                raise LabError("medium did not create its taps within 180 s")
            time.sleep(0.2)

    def build_network(self) -> None:
        t = self.spec.topology
        for i in range(t.n):
            nsn = ns_name(i)
            sh("ip", "netns", "add", nsn)
            sh("ip", "link", "set", tap_name(i), "netns", nsn)
            sysctls = ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1",
                       "net.ipv4.ip_forward=1", "net.ipv4.conf.all.send_redirects=0",
                       "net.ipv4.conf.default.send_redirects=0", "net.ipv4.conf.all.accept_redirects=0",
                       "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"]
            sh("ip", "netns", "exec", nsn, "sysctl", "-qw", *sysctls)
            lines = [f"link set {tap_name(i)} name {IFACE}",
                     f"link set {IFACE} address {mac_of(i)}",
                     # /16 without its prefix route: next hops stay the explicit routes below,
                     # and the subnet broadcast address exists for hopd's broadcast link mode.
                     f"addr add {ip_of(i)}/16 broadcast {BROADCAST} dev {IFACE} noprefixroute",
                     f"link set {IFACE} up", "link set lo up"]
            for b in t.neighbours(i):
                lines.append(f"neigh replace {ip_of(b)} lladdr {mac_of(b)} dev {IFACE} nud permanent")
            for d, nh in sorted(self.table.get(i, {}).items()):
                if nh == d:
                    lines.append(f"route replace {ip_of(d)}/32 dev {IFACE} scope link")
                else:
                    lines.append(f"route replace {ip_of(d)}/32 via {ip_of(nh)} dev {IFACE} onlink")
            _ip_batch(lines, nsn)
            sh("ip", "netns", "exec", nsn, "sysctl", "-qw", f"net.ipv4.conf.{IFACE}.rp_filter=0",
               f"net.ipv4.conf.{IFACE}.send_redirects=0")
        if self.dynamic:
            self.start_routing()

    def read_routes(self) -> dict[int, dict[int, int]]:
        return dynroute.read_tables(self.spec.topology.n, ns_name, node_of)

    def start_routing(self) -> None:
        """babeld in every node; wait until every flow has a route (or the timeout)."""
        n = self.spec.topology.n
        # IPv6 (Babel's transport) only now that every tap is up: a frame (an MLD report)
        # the medium delivers to a tap that is still down is lost (`medium.taps.write_errors`).
        for i in range(n):
            sh("ip", "netns", "exec", ns_name(i), "sysctl", "-qw", *dynroute.ipv6_sysctls(IFACE))
        for i in range(n):
            self.spawn_cmd(i, dynroute.babeld_argv(i, IFACE, self.work), f"babeld-{i}")
        pairs = sorted({(f.src, f.dst) for f in self.spec.flows})
        self.progress(f"routing: babeld in {n} nodes, waiting for the routes of {len(pairs)} flows")
        table, waited, missing = dynroute.wait_converged(self.read_routes, pairs, self.progress,
                                                         check=self.check_medium)
        self.table = table
        self.routing_log = {"protocol": dynroute.PROTO, "converged_s": round(waited, 1),
                            "unrouted_at_start": [list(p) for p in missing],
                            "routes_at_start": sum(len(r) for r in table.values()),
                            "poll_interval_s": dynroute.ROUTE_POLL_S, "polls": [], "next_hop_changes": 0}
        self.progress(f"routing: {self.routing_log['routes_at_start']} routes after {waited:.0f} s")

    def run(self) -> dict:
        spec = self.spec
        self.start_medium()
        self.build_network()
        time.sleep(spec.settle)
        flows = spec.flows
        drivers = [DRIVERS[f.driver]() for f in flows]
        for name in sorted({f.driver for f in flows}):
            prepare = getattr(DRIVERS[name](), "prepare", None)
            if prepare is not None:
                prepare(self, [f for f in flows if f.driver == name])
        receivers: dict[int, subprocess.Popen | None] = {}
        for idx, (f, d) in enumerate(zip(flows, drivers)):
            n_before = len(self.procs)
            d.start_receiver(self, f, idx)
            receivers[idx] = self.procs[n_before] if len(self.procs) > n_before else None
        time.sleep(1.0)
        self.t0 = time.time()
        steal0 = host_steal_seconds()
        self.medium_cmd("mark")
        self.events_log.append({"t": 0.0, "cmd": "start"})
        pending = sorted(
            [(f.start, "flow", idx) for idx, f in enumerate(flows) if f.after is None]
            + [(e.at, "event", k) for k, e in enumerate(spec.schedule)],
            key=lambda x: x[0],
        )
        senders: dict[int, subprocess.Popen] = {}
        waiting: set[int] = set()
        end_at = self.t0 + spec.duration
        last_report = 0.0
        # [t, bytes of flow 0, flow 1, ...] every PROGRESS_INTERVAL_S: what each flow had at any
        # moment of the run (e.g. a long run's snapshot at the time a shorter one stops)
        series: list[list[float]] = []
        timed_out = False
        routes_at_start = self.table
        if self.dynamic:
            self.poller = dynroute.Poller(self.read_routes, self.table, self.t0).start()
        while True:
            self.check_medium()
            now = time.time()
            rel = now - self.t0
            while pending and pending[0][0] <= rel:
                _, kind, k = pending.pop(0)
                if kind == "flow":
                    n_before = len(self.procs)
                    drivers[k].start_sender(self, flows[k], k)
                    senders[k] = self.procs[n_before] if len(self.procs) > n_before else None
                else:
                    self._apply(spec.schedule[k])
            done = []
            for k, p in senders.items():
                finished = getattr(drivers[k], "finished", None)
                if finished is not None:
                    if finished(self, flows[k], k, receivers):
                        done.append(k)
                    continue
                side = getattr(drivers[k], "done_when", "sender")
                watch = receivers.get(k) if side == "receiver" else p
                if watch is None or watch.poll() is not None:
                    done.append(k)
            for k in done:
                for j, f in enumerate(flows):
                    if f.after == flows[k].label and j not in senders and j not in waiting:
                        waiting.add(j)
                        pending.append((rel + f.start, "flow", j))
                        pending.sort(key=lambda x: x[0])
            # Background flows are load: once every other flow is done (and none is still to
            # start), the run ends and cuts them off.
            if (not any(kind == "event" or not flows[k].background for _, kind, k in pending)
                    and all(k in done for k, f in enumerate(flows) if not f.background)):
                break
            if now >= end_at:
                timed_out = True
                break
            if now - last_report >= PROGRESS_INTERVAL_S:
                last_report = now
                per_flow = [d.progress(self, f, i) for i, (f, d) in enumerate(zip(flows, drivers))]
                series.append([round(rel, 2), *per_flow])
                got = sum(per_flow)
                self.progress(f"  t={rel:5.1f}s  flows done {len(done)}/{len(flows)}  "
                              f"received {got / 1e6:7.2f} MB")
            time.sleep(0.05)
        wall = time.time() - self.t0
        if self.poller is not None:
            self.poller.stop()
            self.routing_log.update(polls=self.poller.polls, next_hop_changes=self.poller.next_hop_changes)
        steal1 = host_steal_seconds()
        steal = (steal1 - steal0) if steal0 is not None and steal1 is not None else None
        # stop senders first, then give receivers a moment to record the last bytes
        for k, p in senders.items():
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        time.sleep(0.5)
        # Daemons' final counters, once no sender adds work and before the daemons stop.
        for name in sorted({f.driver for f in flows}):
            collect = getattr(DRIVERS[name](), "collect", None)
            if collect is not None:
                collect(self)
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        self.medium_cmd("stop")
        medium_out = {}
        if self.medium is not None:
            try:
                self.medium.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            try:
                medium_out = json.loads((self.work / "medium.json").read_text())
            except (OSError, ValueError):
                medium_out = {}
        results = []
        for idx, (f, d) in enumerate(zip(flows, drivers)):
            r = d.result(self, f, idx)
            # Hops along the routes the flows started on (static routes never change).
            results.append(flow_summary(f, r, routes.hop_count(routes_at_start, f.src, f.dst), idx))
        return {"flows": results, "medium": medium_out, "routing_dynamics": self.routing_log or None,
                "wall_seconds": wall, "timed_out": timed_out,
                "host_steal_seconds": steal,
                "medium_forked": isinstance(self.medium, mediumserver.ForkedMedium),
                "t0": self.t0, "events": self.events_log,
                "progress": {"interval_s": PROGRESS_INTERVAL_S, "columns": ["t", *[f.label for f in flows]],
                             "rows": series}}

    def _apply(self, e) -> None:
        t = self.spec.topology
        if e.action in ("down", "up"):
            self.medium_cmd(f"{e.action} {e.node}")
            self.progress(f"  schedule: node {e.node} {e.action}")
        elif e.action == "loss":
            self.medium_cmd(f"link {e.a} {e.b} {IN_RANGE_DB} {e.loss}")
            t.links[(e.a, e.b)] = e.loss
            self.progress(f"  schedule: link {e.a}->{e.b} loss {e.loss}")


def host_steal_seconds() -> float | None:
    """CPU time the hypervisor took from this machine (all CPUs), from /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _in_ns(node: int) -> list[str]:
    """Prefix running a command in a node's network namespace. nsenter only joins the
    network namespace (no mount namespace and /sys remount like `ip netns exec`), which
    keeps process start-up light while the medium runs."""
    return ["nsenter", f"--net=/run/netns/{ns_name(node)}", "--"]


def _term_to_interrupt(_sig, _frm):
    raise KeyboardInterrupt()


def flow_summary(f, r: dict, hops: int | None, idx: int) -> dict:
    start, last = r.get("start"), r.get("last")
    nbytes = int(r.get("bytes") or 0)
    dur = (last - start) if (start is not None and last is not None and last > start) else None
    out = {
        "index": idx, "label": f.label or f"{f.driver}-{f.src}-{f.dst}", "driver": f.driver,
        "cc": f.cc if f.driver == "tcp" else None, "src": f.src, "dst": f.dst, "hops": hops,
        "start_offset": f.start, "size": f.size, "bytes": nbytes,
        "goodput_mbps": (nbytes * 8 / dur / 1e6) if dur else 0.0,
        "time_to_last_byte_s": dur,
        # From the flow's start to its first byte at the destination, as its driver saw it
        # (None where the driver records no first byte, or none arrived).
        "time_to_first_byte_s": (r["first"] - start) if (start is not None and r.get("first") is not None
                                                          and r["first"] >= start) else None,
        "completion_s": dur if (r.get("complete") and f.size is not None) else None,
        "complete": bool(r.get("complete")),
    }
    if f.background:
        out["background"] = True
    for k, v in r.items():
        if k not in ("bytes", "start", "first", "last", "complete"):
            out[k] = v
    return out
