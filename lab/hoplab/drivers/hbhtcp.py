"""Hop-by-hop TCP (Hop §5), the lab side: one relay process (hoplab.hbhrelay, see there
for how the relays keep backpressure hop by hop) on every intermediate node of a flow's
route, the lab's TCP receiver at the destination and the lab's TCP sender at the source,
connected to the first relay.
"""

from __future__ import annotations

import json

from ..errors import LabError
from ..hbhrelay import RELAY_SOCKBUF
from .base import BASE_PORT, Driver, read_json


def flow_path(table: list[dict], src: int, dst: int) -> list[int]:
    """Nodes from src to dst following the lab's next-hop table."""
    p = [src]
    while p[-1] != dst:
        nh = table[p[-1]].get(dst)
        if nh is None or nh in p:
            raise LabError(f"no route from {src} to {dst} (stuck at {p[-1]})")
        p.append(nh)
    return p


class HbhTcpDriver(Driver):
    """Hop-by-hop TCP (Hop §5): one-hop kernel TCP connections chained by relays on every
    intermediate node of the lab's route; the lab's TCP sender and receiver at the ends.
    Flow idx uses port BASE_PORT + idx on every node of its path. options.sockbuf
    overrides RELAY_SOCKBUF (bytes). Goodput counts from the sender's connect to the
    first relay (connection setup excluded, Hop §5)."""

    name = "hbhtcp"

    def relay_file(self, lab, node: int):
        return lab.work / f"hbh-relay-{node}.json"

    def prepare(self, lab, flows) -> None:
        per_node: dict[int, list[dict]] = {}
        sockbuf = RELAY_SOCKBUF
        for f in flows:
            sockbuf = int(f.options.get("sockbuf", sockbuf))
        for f in flows:
            idx = next(i for i, g in enumerate(lab.spec.flows) if g is f)
            port = BASE_PORT + idx
            p = flow_path(lab.table, f.src, f.dst)
            for a, b in zip(p[1:-1], p[2:]):
                per_node.setdefault(a, []).append(
                    {"flow": idx, "listen_port": port, "next_ip": lab.ip(b), "next_port": port,
                     "cc": f.cc})
        self.nodes = sorted(per_node)
        for node in self.nodes:
            cfg = lab.work / f"hbh-relay-{node}.conf.json"
            cfg.write_text(json.dumps({"sockbuf": sockbuf, "relays": per_node[node]}))
            lab.spawn(node, ["relay", "--config", str(cfg), "--out", str(self.relay_file(lab, node))],
                      f"hbh-relay-{node}", module="hoplab.hbhrelay")

    def start_receiver(self, lab, flow, idx):
        lab.spawn(flow.dst, ["tcp-recv", "--port", str(BASE_PORT + idx),
                             "--out", str(lab.flow_file(idx, "recv"))], f"f{idx}-recv")

    def start_sender(self, lab, flow, idx):
        p = flow_path(lab.table, flow.src, flow.dst)
        args = ["tcp-send", "--dst", lab.ip(p[1]), "--port", str(BASE_PORT + idx),
                "--out", str(lab.flow_file(idx, "send")), "--cc", flow.cc,
                "--tos", flow.options.get("tos", "be")]
        args += ["--size", str(flow.size)] if flow.size is not None else []
        dur = flow.duration if flow.duration is not None else (None if flow.size else lab.spec.duration)
        args += ["--duration", str(dur)] if dur is not None else []
        lab.spawn(flow.src, args, f"f{idx}-send")

    def result(self, lab, flow, idx):
        r, s = read_json(lab.flow_file(idx, "recv")), read_json(lab.flow_file(idx, "send"))
        complete = bool(r.get("complete")) and (flow.size is None or r.get("bytes", 0) >= flow.size)
        relays = []
        p = flow_path(lab.table, flow.src, flow.dst)
        for node in p[1:-1]:
            for st in read_json(self.relay_file(lab, node)).get("relays", []):
                if st.get("flow") == idx:
                    relays.append({"node": node, **st})
        return {"bytes": r.get("bytes", 0), "start": s.get("connected") or s.get("start"),
                "start_before_connect": s.get("start"), "first": r.get("first"),
                "last": r.get("last"), "complete": complete, "relays": relays,
                "sender_error": s.get("error") if s else f"no sender result (raw/f{idx}-send.log)"}
