"""Kernel TCP: the lab's own sender and receiver (hoplab.flowtool) in the flow's end nodes."""

from __future__ import annotations

from .base import BASE_PORT, Driver, read_json


class TcpDriver(Driver):
    """Kernel TCP (CUBIC, BBR or Reno per flow) with the lab's sender/receiver."""

    name = "tcp"

    def start_receiver(self, lab, flow, idx):
        mss = ["--mss", str(flow.options["mss"])] if "mss" in flow.options else []
        lab.spawn(flow.dst, ["tcp-recv", "--port", str(BASE_PORT + idx),
                             "--out", str(lab.flow_file(idx, "recv"))] + mss, f"f{idx}-recv")

    def start_sender(self, lab, flow, idx):
        args = ["tcp-send", "--dst", lab.ip(flow.dst), "--port", str(BASE_PORT + idx),
                "--out", str(lab.flow_file(idx, "send")), "--cc", flow.cc,
                "--tos", flow.options.get("tos", "be")]
        args += ["--mss", str(flow.options["mss"])] if "mss" in flow.options else []
        args += ["--size", str(flow.size)] if flow.size is not None else []
        dur = flow.duration if flow.duration is not None else (None if flow.size else lab.spec.duration)
        args += ["--duration", str(dur)] if dur is not None else []
        lab.spawn(flow.src, args, f"f{idx}-send")

    def result(self, lab, flow, idx):
        r, s = read_json(lab.flow_file(idx, "recv")), read_json(lab.flow_file(idx, "send"))
        complete = bool(r.get("complete")) and (flow.size is None or r.get("bytes", 0) >= flow.size)
        return {"bytes": r.get("bytes", 0), "start": s.get("start"), "first": r.get("first"),
                "last": r.get("last"), "complete": complete,
                "sender_error": s.get("error") if s else f"no sender result (raw/f{idx}-send.log)"}
