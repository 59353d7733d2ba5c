"""The protocol driver interface: how to start a flow's receiver and sender in their node
namespaces and how to read the flow's result.

Adding a protocol means adding a subclass of Driver in a module of this package and an
entry in DRIVERS (drivers/__init__.py). A driver gets the running lab (``lab.spawn``, ``lab.ip``, ``lab.flow_file``)
and returns a dict with at least ``bytes`` (unique payload bytes received),
``start`` (sender start, wall clock), ``last`` (time of the last byte) and
``complete`` (whether the whole requested size arrived).
"""

from __future__ import annotations

import json
from pathlib import Path

BASE_PORT = 5200
"""Flow idx uses port BASE_PORT + idx (the TCP, UDP and hop-by-hop TCP drivers)."""


def read_json(path: Path) -> dict:
    """A result file a flow's process wrote; {} while there is none (or a partial one)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


class Driver:
    name = "base"
    # A flow is finished when this side's process exited ("sender" or "receiver").
    done_when = "sender"
    # Whether the driver runs hopd on the nodes (then the medium reports MAC backlogs to it).
    runs_hopd = False

    def prepare(self, lab, flows: list) -> None:
        """Once per run, before any receiver starts: e.g. start a daemon on every node.
        `flows` are this driver's flows."""

    def start_receiver(self, lab, flow, idx: int) -> None:
        raise NotImplementedError

    def start_sender(self, lab, flow, idx: int) -> None:
        raise NotImplementedError

    def progress(self, lab, flow, idx: int) -> int:
        """Unique bytes received so far (best effort)."""
        return int(read_json(lab.flow_file(idx, "recv")).get("bytes", 0))

    def result(self, lab, flow, idx: int) -> dict:
        raise NotImplementedError
