"""DTN baseline (Hop §5: DTN2.5 there; here dtn7 0.21.0, crates.io): a bundle daemon
`dtnd` in every node namespace on the flows' paths, TCP convergence layer (TCPCLv4) between
radio neighbours and static routing derived from the lab's route table. The clients that
send and receive a flow's bundles are hoplab.dtnclient (see there for the bundles' format).

Per node i: node id `dtn://n<i>/`, web/API port `WEB_PORT` on the namespace's loopback,
TCP CLA on `CLA_PORT`, one static peer `tcp://<ip>:CLA_PORT/n<j>` per next hop j it uses,
and a routes file with one line per destination d: `<k> ** dtn://n<d>/** dtn://n<next hop>/`.
Neighbour discovery is off (the lab's routes decide; beacons would only add traffic).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from ..dtnclient import BUNDLE_BYTES, HDR, WEB_PORT
from ..errors import LabError
from .base import Driver, read_json

CLA_PORT = 4556
"""TCP convergence layer port (TCPCLv4's registered port, RFC 9174)."""


def dtnd_binary() -> str:
    root = Path(__file__).resolve().parents[3]  # <repository>/lab/hoplab/drivers/dtn.py
    for cand in (root / ".tools" / "dtn7" / "bin" / "dtnd", shutil.which("dtnd")):
        if cand and Path(cand).exists():
            return str(cand)
    raise LabError("dtnd not found: run scripts/setup-dtn7.sh (installs dtn7 0.21.0 into .tools/dtn7)")


def routes_text(node: int, next_hops: dict[int, int]) -> str:
    """dtn7 static routes: `idx source-glob destination-glob via-node-eid`. The globs
    need `**`: a single `*` does not match across `/`, so `*` as source never matches an
    EID like `dtn://n0/` (the route is then silently unused: "No route found")."""
    lines = [f"{k} ** dtn://n{d}/** dtn://n{nh}/" for k, (d, nh) in enumerate(sorted(next_hops.items()), 1)]
    return "\n".join(lines) + "\n"


JANITOR = "0"
"""dtnd's janitor re-dispatches every bundle still pending forwarding, including one whose
transfer is in progress: with a 1 s period each 1 MiB bundle (1.4-5 s per emulated hop) was
sent two or three times. Off by default ("0"); then a bundle whose transfer fails is not
retried. options.janitor (e.g. "30s") turns it on for disruption experiments."""


def dtnd_args(node: int, workdir: Path, routes_file: Path, peers: dict[int, str],
              web_port: int = WEB_PORT, cla_port: int = CLA_PORT, endpoint: str = "incoming",
              janitor: str = JANITOR, debug: bool = False) -> list[str]:
    """Command line of one dtnd. `peers` maps neighbour node -> "ip:cla_port"."""
    args = ["-4", "-n", f"n{node}", "-W", str(workdir), "-w", str(web_port), "-D", "mem",
            "-C", f"tcp:port={cla_port}", "-r", "static", "-R", f"static.routes={routes_file}",
            "--disable_nd", "-i", "0", "-j", janitor, "-e", endpoint]
    for j, addr in sorted(peers.items()):
        args += ["-s", f"tcp://{addr}/n{j}"]
    if debug:
        args.append("-d")
    return args


class DtnDriver(Driver):
    """dtn7 bundles over the lab's routes (Hop §5's DTN baseline). Sized transfers only.
    options.bundle sets the bundle size (bytes, <= BUNDLE_BYTES), options.janitor dtnd's
    janitor period (see JANITOR)."""

    name = "dtn"
    done_when = "receiver"  # the sender returns once its daemon took the bundles

    def prepare(self, lab, flows) -> None:
        binary = dtnd_binary()
        janitor = str(next((f.options["janitor"] for f in flows if "janitor" in f.options), JANITOR))
        for f in flows:
            if f.size is None:
                raise LabError("the dtn driver transfers files: give every dtn flow a size")
        for node in range(lab.spec.topology.n):
            d = lab.work / f"dtnd-{node}"
            d.mkdir(parents=True, exist_ok=True)
            routes = d / "routes.txt"
            routes.write_text(routes_text(node, dict(lab.table[node])))
            peers = {nh: f"{lab.ip(nh)}:{CLA_PORT}" for nh in set(lab.table[node].values())}
            lab.spawn_cmd(node, [binary, *dtnd_args(node, d, routes, peers, janitor=janitor)],
                          f"dtnd-{node}")
        time.sleep(1.0)

    @staticmethod
    def endpoint(idx: int) -> str:
        """Each flow has its own endpoint at its destination, so flows to one node do not
        take each other's bundles."""
        return f"f{idx}"

    def start_receiver(self, lab, flow, idx):
        lab.spawn(flow.dst, ["recv", "--endpoint", self.endpoint(idx), "--size", str(flow.size),
                             "--out", str(lab.flow_file(idx, "recv"))], f"f{idx}-recv",
                  module="hoplab.dtnclient")

    def start_sender(self, lab, flow, idx):
        b = int(flow.options.get("bundle", BUNDLE_BYTES))
        if not HDR.size < b <= BUNDLE_BYTES:
            raise LabError(f"dtn bundle size must be in ({HDR.size}, {BUNDLE_BYTES}]")
        lab.spawn(flow.src, ["send", "--dst", f"dtn://n{flow.dst}/{self.endpoint(idx)}",
                             "--size", str(flow.size),
                             "--bundle", str(b), "--out", str(lab.flow_file(idx, "send"))],
                  f"f{idx}-send", module="hoplab.dtnclient")

    def result(self, lab, flow, idx):
        r, s = read_json(lab.flow_file(idx, "recv")), read_json(lab.flow_file(idx, "send"))
        return {"bytes": r.get("bytes", 0), "start": s.get("start"), "first": r.get("first"),
                "last": r.get("last"), "complete": bool(r.get("complete")),
                "bundles": r.get("bundles", 0), "bad_bundles": r.get("bad", 0),
                "dup_bundles": r.get("dups", 0), "sender_error": s.get("error"),
                "receiver_error": r.get("error")}
