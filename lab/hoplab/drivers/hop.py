"""Hop and the other transports of hopd (crates/hopd): one daemon per node, files sent with `hop send`."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

from ..addresses import BROADCAST
from ..errors import LabError
from .base import Driver, read_json


class HopDriver(Driver):
    """Hop through hopd (crates/hopd): `prepare` starts one hopd per node namespace with
    the lab's neighbours and static routes; each flow is `hop recv --count 1` at the
    destination and `hop send FILE --to DST` at the source. The daemons' transport
    comes from the flows' options.transport (one of TRANSPORTS, the values of hopd's
    `transport` key; one per run) and options.hop is copied into hopd's [hop] section
    (hopd ignores it for the other transports); options.control_dscp sets hopd's
    `control_dscp` (the access category of BSYN/BACK; default EF, the voice queue);
    options.overhear = true sets hopd's `overhear` (with medium.overhear);
    options.security = "sessions" gives every hopd a node key (`hop keygen`), one members
    file admitting them all and per-neighbour sessions instead of the mesh key (node ids
    are then the keys', in `lab.hop_ids`). Sized transfers only."""

    name = "hop"
    runs_hopd = True  # the medium reports MAC backlogs to its hopds (spec.reports_link_status)
    PORT = 7470
    TRANSPORTS = ("hop", "hxh", "atp", "atp-aggressive", "atp-adaptive")
    done_when = "receiver"  # `hop send` returns on the end-to-end ack, before the file is written

    @staticmethod
    def binary(name: str) -> str:
        root = Path(__file__).resolve().parents[3] / "target"  # <repository>/lab/hoplab/drivers/hop.py
        for cand in (shutil.which(name), root / "release" / name, root / "debug" / name):
            if cand and Path(cand).exists():
                return str(cand)
        raise LabError(f"{name} not found: build it with `cargo build --release -p hopd`")

    @staticmethod
    def node_id(node: int) -> int:
        """hopd node ids start at 1 (0 is reserved): lab node i is hop node i + 1."""
        return node + 1

    def nid(self, lab, node: int) -> int:
        """Lab node `node`'s hopd node id in this run: its key's with sessions, else node + 1."""
        ids = getattr(lab, "hop_ids", None)
        return ids[node] if ids else self.node_id(node)

    def socket(self, lab, node: int) -> Path:
        # Not under the run directory: its path can exceed a Unix socket's 108 bytes.
        return lab.sockets / f"hopd-{node}.sock"

    def config(self, lab, node: int, transport: str, params: dict, link_mode: str = "unicast",
               control_dscp: int | None = None, overhear: bool = False,
               control_when_full: bool | None = None) -> str:
        t = lab.spec.topology
        lines = [f"node_id = {self.nid(lab, node)}", f'listen = "{lab.ip(node)}:{self.PORT}"',
                 f'transport = "{transport}"', f'api_socket = "{self.socket(lab, node)}"', ""]
        if overhear:
            # The neighbours' unicast from a packet socket (HxH's passive feedback, §3.2).
            lines[-1:-1] = ["overhear = true"]
        if control_dscp is not None:
            lines[-1:-1] = [f"control_dscp = {int(control_dscp)}"]
        if link_mode == "broadcast":
            # Hop §4: data frames without link-layer ARQ. 802.11 never retries broadcast frames,
            # and every neighbour overhears them (the medium sends them at the spec's
            # broadcast_rate_mbps). Control datagrams stay unicast (with ARQ).
            lines[-1:-1] = ['link_mode = "broadcast"', f'broadcast_address = "{BROADCAST}:{self.PORT}"']
        for b in t.neighbours(node):
            lines += ["[[neighbours]]", f"id = {self.nid(lab, b)}", f'address = "{lab.ip(b)}:{self.PORT}"', ""]
        if getattr(lab, "dynamic", False):
            # A routing daemon owns the kernel table: hopd follows it (netlink) and needs the
            # address of every node that is not a neighbour.
            lines.insert(4, "kernel_routes = true")  # top level, before the first table
            near = set(t.neighbours(node))
            for d in range(t.n):
                if d != node and d not in near:
                    lines += ["[[hosts]]", f"id = {self.nid(lab, d)}", f'address = "{lab.ip(d)}:{self.PORT}"', ""]
        else:
            for d, nh in sorted(lab.table[node].items()):
                lines += ["[[routes]]", f"destination = {self.nid(lab, d)}",
                          f"next_hop = {self.nid(lab, nh)}", ""]
        # The tap is an 802.11 interface to hopd only through the medium behind it: say whether
        # that MAC retries BSYNs and BACKs (hopd's control copies follow it, docs/hopd.md).
        retries = lab.spec.medium.retry_limit > 0
        lines.insert(4, f"link_retries = {'true' if retries else 'false'}")
        if lab.spec.reports_link_status():
            # Send only while the MAC holds few frames, as a real interface's socket would.
            lines.insert(4, f'link_status_socket = "{lab.link_status_socket(node)}"')
            if control_when_full is not None:
                lines.insert(5, f"link_control_when_full = {'true' if control_when_full else 'false'}")
        lines += ["[storage]", f'dir = "{lab.work / f"hopd-{node}" / "store"}"', "", "[security]"]
        if getattr(lab, "hop_ids", None):
            lines += [f'node_key_file = "{lab.work / f"hopd-{node}" / "node.key"}"',
                      f'members_file = "{lab.work / "hop-members"}"', "sessions = true", ""]
        else:
            lines += [f'mesh_key = "{"4c" * 32}"', ""]
        if params:
            lines.append("[hop]")
            for k, v in params.items():
                lines.append(f"{k} = {json.dumps(v)}")
        return "\n".join(lines) + "\n"

    def prepare(self, lab, flows) -> None:
        hopd = self.binary("hopd")
        self.binary("hop")
        kinds = {f.options.get("transport", "hop") for f in flows}
        if len(kinds) != 1 or not kinds <= set(self.TRANSPORTS):
            raise LabError(f"hop flows need one transport per run (one of {', '.join(self.TRANSPORTS)}),"
                           f" got {sorted(map(str, kinds))}")
        transport = next(iter(kinds))
        params = next((f.options["hop"] for f in flows if "hop" in f.options), {})
        modes = {f.options.get("link_mode", "unicast") for f in flows}
        if len(modes) != 1 or not modes <= {"unicast", "broadcast"}:
            raise LabError(f"hop flows need one link_mode per run (unicast or broadcast), got {sorted(map(str, modes))}")
        link_mode = next(iter(modes))
        dscps = {f.options.get("control_dscp") for f in flows}
        if len(dscps) != 1 or not all(d is None or (isinstance(d, int) and 0 <= d <= 63) for d in dscps):
            raise LabError(f"hop flows need one control_dscp (0..63) per run, got {sorted(map(str, dscps))}")
        control_dscp = next(iter(dscps))
        hears = {bool(f.options.get("overhear", False)) for f in flows}
        if len(hears) != 1:
            raise LabError("hop flows need one overhear setting per run")
        overhear = next(iter(hears))
        fulls = {f.options.get("link_control_when_full") for f in flows}
        if len(fulls) != 1 or not fulls <= {None, True, False}:
            raise LabError("hop flows need one link_control_when_full setting (true or false) per run")
        control_when_full = next(iter(fulls))
        if control_when_full is not None and not lab.spec.reports_link_status():
            raise LabError("options.link_control_when_full needs the medium's link status "
                           "(medium.link_status = true): hopd only knows its link is full from it")
        if overhear and not lab.spec.medium.overhear:
            raise LabError("options.overhear needs medium.overhear = true: the medium drops the frames "
                           "for other nodes unless told to pass them to the taps")
        for f in flows:
            if f.size is None:
                raise LabError("the hop driver transfers files: give every hop flow a size")
        securities = {f.options.get("security", "mesh-key") for f in flows}
        if len(securities) != 1 or not securities <= {"mesh-key", "sessions"}:
            raise LabError(f"hop flows need one options.security per run (mesh-key or sessions), "
                           f"got {sorted(map(str, securities))}")
        lab.hop_ids = None
        if securities == {"sessions"}:
            # A key per node, all admitted in one members file (as `hop keygen --members`
            # does on a new node); node ids are the keys'.
            ids = {}
            for node in range(lab.spec.topology.n):
                d = lab.work / f"hopd-{node}"
                d.mkdir(parents=True, exist_ok=True)
                out = subprocess.run([self.binary("hop"), "--json", "keygen", "--out", str(d / "node.key"),
                                      "--members", str(lab.work / "hop-members"), "--name", f"lab-{node}"],
                                     capture_output=True, text=True, check=False)
                if out.returncode != 0:
                    raise LabError(f"hop keygen failed: {out.stderr.strip()}")
                ids[node] = int(json.loads(out.stdout)["node_id"])
            lab.hop_ids = ids
        for node in range(lab.spec.topology.n):
            d = lab.work / f"hopd-{node}"
            (d / "store").mkdir(parents=True, exist_ok=True)
            cfg = d / "hopd.toml"
            cfg.write_text(self.config(lab, node, transport, params, link_mode, control_dscp, overhear,
                                       control_when_full))
            lab.spawn_cmd(node, [hopd, "--config", str(cfg)], f"hopd-{node}")
        deadline = time.time() + 30
        while not all(self.socket(lab, n).exists() for n in range(lab.spec.topology.n)):
            if time.time() > deadline:
                first = (lab.work / "hopd-0.log").read_text(errors="replace")[:500]
                raise LabError(f"hopd did not open its API sockets; see {lab.work}/hopd-*.log:\n{first}")
            time.sleep(0.1)

    def collect(self, lab) -> None:
        """Evidence for the run's figures: every hopd's `hop status --json` (its transport's
        counters: datagrams by type, retransmissions, overheard packets, ...) at the end of
        the run, in hopd-<node>/status.json. Best effort: a node that does not answer in 2 s
        gets no file."""
        for node in range(lab.spec.topology.n):
            try:
                out = subprocess.run([self.binary("hop"), "--socket", str(self.socket(lab, node)),
                                      "--json", "status"], capture_output=True, text=True, timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if out.returncode == 0 and out.stdout.strip():
                (lab.work / f"hopd-{node}" / "status.json").write_text(out.stdout)

    def start_receiver(self, lab, flow, idx):
        d = lab.work / f"hop-recv-{idx}"
        d.mkdir(parents=True, exist_ok=True)
        lab.spawn(flow.dst, ["exec", "--out", str(lab.flow_file(idx, "recv")), "--",
                             self.binary("hop"), "--socket", str(self.socket(lab, flow.dst)), "--json",
                             "recv", "--dir", str(d), "--count", "1"], f"f{idx}-recv")

    def start_sender(self, lab, flow, idx):
        src = lab.work / f"hop-send-{idx}.bin"
        with open(src, "wb") as fh:
            left = flow.size
            block = bytes(range(256)) * 256
            while left > 0:
                fh.write(block[: min(left, len(block))])
                left -= len(block)
        lab.spawn(flow.src, ["exec", "--out", str(lab.flow_file(idx, "send")), "--",
                             self.binary("hop"), "--socket", str(self.socket(lab, flow.src)), "--json",
                             "send", str(src), "--to", str(self.nid(lab, flow.dst)), "--quiet"], f"f{idx}-send")

    def progress(self, lab, flow, idx) -> int:
        """Unique bytes the destination's hopd has received for flows from this flow's source (its
        `hop status`, through the API socket, which needs no namespace), split evenly
        between the lab flows of the same source and destination; the flow's size once
        the receiver has written the file. Never less than an earlier sample: a hopd that
        does not answer in time (a busy node), or a status taken while a block moves from
        reception to delivery, repeats the largest count seen so far."""
        if self.result(lab, flow, idx)["complete"]:
            return int(flow.size)
        try:
            out = subprocess.run([self.binary("hop"), "--socket", str(self.socket(lab, flow.dst)),
                                  "--json", "status"], capture_output=True, text=True, timeout=2)
            status = json.loads(out.stdout)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return self.held[0]
        prefix = f"{self.nid(lab, flow.src)}:"
        # `received_bytes` counts the packets of blocks not complete yet too: the papers'
        # "unique packets received". Older hopd reports only `bytes` (delivered blocks).
        held = sum(max(int(f.get("bytes", 0)), int(f.get("received_bytes", 0)))
                   for f in status.get("incoming", [])
                   if str(f.get("flow", "")).startswith(prefix))
        same = sum(1 for f in lab.spec.flows if f.driver == flow.driver
                   and f.src == flow.src and f.dst == flow.dst)
        got = min(int(flow.size), held // max(same, 1))
        if got > self.held[0]:
            self.held = (got, time.time())
        if self.first is None and any(int(f.get("bytes", 0)) > 0 for f in status.get("incoming", [])
                                      if str(f.get("flow", "")).startswith(prefix)):
            # Delivered bytes (whole blocks), not packets of a block still arriving: the
            # first byte an application at the destination could read, to this 2 s sample.
            self.first = time.time()
        return self.held[0]

    def __init__(self):
        # Largest byte count the destination's hopd reported for this flow while the run
        # went on (`progress`, every 2 s), and when it was first seen.
        self.held: tuple[int, float | None] = (0, None)
        # When a `progress` sample first saw delivered bytes of this flow's source at its
        # destination (None until then).
        self.first: float | None = None
        # `finished`: whether this flow's file has arrived, and how many of the receiving
        # clients at its destination had exited when that was last looked up.
        self._arrived = False
        self._exited_seen = 0
        self._peers: list[int] | None = None  # flows whose clients run at the same destination

    def finished(self, lab, flow, idx, receivers: dict) -> bool:
        """Whether this flow's file has arrived at its destination. The `hop recv` clients
        at one destination each take whichever file completes next, so the client started
        for this flow may exit with another flow's file: the flow is done when some client
        there has written its file (`received`). Looked up again only when another client
        at the destination has exited."""
        if self._arrived:
            return True
        if self._peers is None:
            self._peers = [j for j, g in enumerate(lab.spec.flows)
                           if g.driver == flow.driver and g.dst == flow.dst]
        exited = sum(1 for j in self._peers
                     if receivers.get(j) is not None and receivers[j].poll() is not None)
        if exited > self._exited_seen:
            self._exited_seen = exited
            self._arrived = bool(self.received(lab, flow, idx)[0])
        return self._arrived

    @staticmethod
    def received(lab, flow, idx) -> tuple[dict, float | None]:
        """This flow's file as one of the `hop recv` clients at its destination reported it,
        and when that client finished. Flows to one destination share its clients (each
        takes whichever file completes next), so the file is found by its name, which
        carries the sending flow's index (`start_sender`)."""
        want = f"hop-send-{idx}.bin"
        for j, g in enumerate(lab.spec.flows):
            if g.driver != flow.driver or g.dst != flow.dst:
                continue
            r = read_json(lab.flow_file(j, "recv"))
            for line in (r.get("stdout") or "").splitlines():
                try:
                    v = json.loads(line)
                except ValueError:
                    continue
                if isinstance(v, dict) and v.get("ok") and "bytes" in v and Path(str(v.get("file"))).name == want:
                    return v, r.get("end")
        return {}, None

    def result(self, lab, flow, idx):
        r, s = read_json(lab.flow_file(idx, "recv")), read_json(lab.flow_file(idx, "send"))
        got, end = self.received(lab, flow, idx)
        nbytes = int(got.get("bytes", 0))
        # A file written before any sample saw its bytes: its first byte came by its end.
        first = self.first if self.first is not None else (end if got else None)
        out = {"bytes": nbytes, "start": s.get("start"), "first": first,
               "last": end if got else None,
               "complete": bool(got) and flow.size is not None and nbytes >= flow.size,
               "sender_rc": s.get("rc"), "receiver_rc": r.get("rc")}
        if not got and self.held[1] is not None:
            # Unfinished transfer (cut off at the run's end): the bytes the destination held
            # at the last progress sample that saw them grow, timed at that sample (2 s
            # resolution), so long transfers still get a goodput like the other drivers.
            out.update({"bytes": self.held[0], "last": self.held[1], "bytes_from_status": True})
        return out
