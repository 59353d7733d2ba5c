"""dtn7 over Hop: the DTN baseline's bundle daemon `dtnd` at a flow's two ends, and Hop
between them through the bridge `hop-dtn` (crates/hopd/src/bin/hop-dtn.rs), a convergence
layer dtnd drives through its external convergence layer interface (`--ecla`).

Per run:
- hopd on every node, started exactly as the `hop` driver starts it (same options, e.g.
  options.hop = { backpressure_limit = 100 }, options.link_mode): Hop carries the bundles
  across the relays, which run no dtnd;
- dtnd at each node that sources or sinks a flow: node id `dtn://n<i>/`, web/API port
  `WEB_PORT` on the namespace's loopback, `--ecla`, no TCP convergence layer and no static
  peers, static routes whose next hop is the destination itself
  (`<k> ** dtn://n<d>/** dtn://n<d>/`): the bridge announces each destination as a peer it
  reaches over Hop;
- hop-dtn beside that dtnd, with one `--peer dtn://n<j>/=<hop node of j>` per other end j
  of the node's flows.

The flows' bundles are posted to the source's dtnd and collected at the destination's by
hoplab.dtnclient, as with the `dtn` driver, so goodput and duplicate bundles are measured
the same way for both. Each flow's result also has the bridges' counters of its two ends
(`bridge`: node -> hop-dtn's counters.json at the end of the run).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from ..dtnclient import WEB_PORT
from ..errors import LabError
from .base import read_json
from .dtn import JANITOR, DtnDriver, dtnd_binary, routes_text
from .hop import HopDriver

ANNOUNCE = "10s"
"""dtnd's announcement interval (`-i`). With --ecla it must not be 0: dtnd 0.21's announcer
also serves the ECLA modules and panics with 0. Neighbour discovery stays off
(--disable_nd), so nothing is sent on the air."""
BRIDGE_ANNOUNCE = "1s"
"""How often hop-dtn announces its peers to dtnd. dtnd forgets a peer it has not heard of
for its peer timeout (20 s); a bundle routed to a forgotten peer waits for the janitor,
which is off by default."""
COUNTERS_PERIOD_S = 1.0
"""hop-dtn rewrites counters.json at most this often."""
SOURCE_OUTCOME_WAIT_S = 20.0
"""How long the end of a run waits for each source's hop-dtn to learn the outcome of every
bundle it handed to Hop. The run ends when the receivers have the bundles; a source learns
that its flow arrived from the last end-to-end BACK, and when that one is lost the
destination's last hop asks for it again 1, 2, 4 and 8 s later (docs/design/hop.md, the last
end-to-end BACK)."""
START_WAIT_S = 30.0
"""How long dtnd's API, and then the bridge's registration with dtnd, may take to appear."""


def dtnd_args(node: int, workdir: Path, routes_file: Path, web_port: int = WEB_PORT,
              endpoint: str = "incoming", janitor: str = JANITOR, debug: bool = False) -> list[str]:
    """Command line of a flow end's dtnd: the `dtn` driver's without the TCP convergence
    layer and its static peers, with the external convergence layer the bridge registers with."""
    args = ["-4", "-n", f"n{node}", "-W", str(workdir), "-w", str(web_port), "-D", "mem",
            "-r", "static", "-R", f"static.routes={routes_file}", "--ecla",
            "--disable_nd", "-i", ANNOUNCE, "-j", janitor, "-e", endpoint]
    if debug:
        args.append("-d")
    return args


def bridge_args(state_dir: Path, hopd_socket: Path, peers: list[int], web_port: int = WEB_PORT) -> list[str]:
    """Command line of a flow end's hop-dtn: its dtnd on the namespace's loopback, its hopd's
    API socket, and each other flow end j as peer `dtn://n<j>/` on Hop node `node_id(j)`."""
    args = ["--state-dir", str(state_dir), "--hopd-socket", str(hopd_socket),
            "--dtnd", f"127.0.0.1:{web_port}", "--announce-interval", BRIDGE_ANNOUNCE, "--log-level", "info"]
    for j in sorted(peers):
        args += ["--peer", f"dtn://n{j}/={HopDriver.node_id(j)}"]
    return args


def flow_ends(flows) -> dict[int, set[int]]:
    """Node -> the other ends of the flows it sources or sinks: where dtnd and hop-dtn run,
    and the peers each bridge announces."""
    ends: dict[int, set[int]] = {}
    for f in flows:
        ends.setdefault(f.src, set()).add(f.dst)
        ends.setdefault(f.dst, set()).add(f.src)
    return ends


def state_dir(lab, node: int) -> Path:
    return lab.work / f"hopdtn-{node}"


class DtnHopDriver(DtnDriver):
    """dtn7 bundles carried by Hop between a flow's two ends (see the module). The options
    of the `hop` driver set hopd up; options.bundle and options.janitor are the `dtn`
    driver's. Sized transfers only."""

    name = "dtn-hop"
    runs_hopd = True  # the medium reports MAC backlogs to its hopds (spec.reports_link_status)

    def prepare(self, lab, flows) -> None:
        # `hop` starts hopd, `dtn` starts dtnd, on the same ports and sockets of a node as
        # this driver's: a run holds only one of them.
        clash = {f.driver for f in lab.spec.flows} & {"hop", "dtn"}
        if clash:
            raise LabError(f"dtn-hop flows cannot share a run with {', '.join(sorted(clash))} flows: "
                           "each driver starts its own hopd or dtnd on the same ports")
        dtnd, bridge = dtnd_binary(), HopDriver.binary("hop-dtn")
        HopDriver().prepare(lab, flows)
        janitor = str(next((f.options["janitor"] for f in flows if "janitor" in f.options), JANITOR))
        ends = flow_ends(flows)
        daemons = {}
        for node, peers in sorted(ends.items()):
            d = lab.work / f"dtnd-{node}"
            d.mkdir(parents=True, exist_ok=True)
            routes = d / "routes.txt"
            routes.write_text(routes_text(node, {j: j for j in peers}))
            daemons[node] = lab.spawn_cmd(node, [dtnd, *dtnd_args(node, d, routes, janitor=janitor)],
                                          f"dtnd-{node}")
        # The bridge connects to dtnd's API: it must answer first.
        checks = {node: lab.spawn(node, ["ready", "--port", str(WEB_PORT), "--timeout", str(START_WAIT_S)],
                                  f"dtnd-{node}-ready", module="hoplab.dtnclient") for node in ends}
        for node, p in checks.items():
            try:
                rc = p.wait(timeout=START_WAIT_S + 10)
            except subprocess.TimeoutExpired:
                rc = None
            if rc != 0:
                raise LabError(f"dtnd on node {node} did not answer on port {WEB_PORT}"
                               f"{'' if daemons[node].poll() is None else ' (it exited)'}: "
                               f"{tail(lab.work / f'dtnd-{node}.log')}")
        bridges = {}
        for node, peers in sorted(ends.items()):
            sd = state_dir(lab, node)
            sd.mkdir(parents=True, exist_ok=True)
            bridges[node] = lab.spawn_cmd(node, [bridge, *bridge_args(sd, HopDriver().socket(lab, node),
                                                                      sorted(peers))], f"hop-dtn-{node}")
        # A bundle dtnd dispatches before it knows the peer finds no route and, with the
        # janitor off, is never dispatched again: the flows start once every dtnd has heard
        # of every peer of its node.
        deadline = time.time() + START_WAIT_S
        waiting = dict(ends)
        while waiting:
            for node in list(waiting):
                if bridges[node].poll() is not None or daemons[node].poll() is not None:
                    raise LabError(f"{'hop-dtn' if bridges[node].poll() is not None else 'dtnd'} on node {node} "
                                   f"exited: {tail(lab.work / f'hop-dtn-{node}.log')}\n"
                                   f"{tail(lab.work / f'dtnd-{node}.log')}")
                if registered(lab, node, waiting[node]):
                    del waiting[node]
            if not waiting:
                break
            if time.time() > deadline:
                node = min(waiting)
                raise LabError(f"hop-dtn on node {node} did not register with dtnd, or dtnd heard no beacon "
                               f"of {sorted(waiting[node])}, in {START_WAIT_S:g} s: "
                               f"{tail(lab.work / f'hop-dtn-{node}.log')}\n{tail(lab.work / f'dtnd-{node}.log')}")
            time.sleep(0.2)

    def collect(self, lab) -> None:
        """hopd's statuses as the `hop` driver collects them, once every source's bridge knows
        the outcome of each bundle it handed to Hop (at most SOURCE_OUTCOME_WAIT_S) and the
        bridges have written their last counters (a change shows in counters.json within
        COUNTERS_PERIOD_S)."""
        sources = sorted({f.src for f in lab.spec.flows if f.driver == "dtn-hop"})
        deadline = time.time() + SOURCE_OUTCOME_WAIT_S
        while time.time() < deadline and not all(outcomes_known(state_dir(lab, n)) for n in sources):
            time.sleep(0.2)
        time.sleep(COUNTERS_PERIOD_S + 0.2)
        HopDriver().collect(lab)

    def result(self, lab, flow, idx):
        out = super().result(lab, flow, idx)
        out["bridge"] = {str(n): read_json(state_dir(lab, n) / "counters.json") for n in (flow.src, flow.dst)}
        return out


def outcomes_known(state: Path) -> bool:
    """Whether the bridge with state directory `state` has an outcome (arrived, or failed) for
    every bundle it handed to Hop, by its counters.json."""
    c = read_json(state / "counters.json")
    return c.get("to_hop", 0) <= c.get("hop_complete", 0) + c.get("hop_failed", 0)


def registered(lab, node: int, peers: set[int]) -> bool:
    """Whether node's hop-dtn has registered with its dtnd and dtnd has logged a beacon
    for each of `peers` (the bridge announces each peer as a beacon)."""
    log = read_text(lab.work / f"hop-dtn-{node}.log")
    if "registered with dtnd" not in log:
        return False
    beacons = [ln for ln in read_text(lab.work / f"dtnd-{node}.log").splitlines() if "Received beacon" in ln]
    return all(any(f"dtn://n{j}/" in ln for ln in beacons) for j in peers)


def read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def tail(path: Path, n: int = 1500) -> str:
    return f"--- {path.name}\n{read_text(path)[-n:]}"
