"""Protocol drivers: how to start a flow's receiver and sender in their node
namespaces and how to read the flow's result.

Adding a protocol means adding one class here and an entry in DRIVERS. A
driver gets the running lab (``lab.spawn``, ``lab.ip``, ``lab.flow_file``)
and returns a dict with at least ``bytes`` (unique payload bytes received),
``start`` (sender start, wall clock), ``last`` (time of the last byte) and
``complete`` (whether the whole requested size arrived).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .errors import LabError
from .spec import VOIP_PAYLOAD_BYTES, VOIP_RATE_BPS

BASE_PORT = 5200


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


class Driver:
    name = "base"

    def start_receiver(self, lab, flow, idx: int) -> None:
        raise NotImplementedError

    def start_sender(self, lab, flow, idx: int) -> None:
        raise NotImplementedError

    def progress(self, lab, flow, idx: int) -> int:
        """Unique bytes received so far (best effort)."""
        return int(_load(lab.flow_file(idx, "recv")).get("bytes", 0))

    def result(self, lab, flow, idx: int) -> dict:
        raise NotImplementedError


class TcpDriver(Driver):
    """Kernel TCP (CUBIC, BBR or Reno per flow) with the lab's sender/receiver."""

    name = "tcp"

    def start_receiver(self, lab, flow, idx):
        lab.spawn(flow.dst, ["tcp-recv", "--port", str(BASE_PORT + idx),
                             "--out", str(lab.flow_file(idx, "recv"))], f"f{idx}-recv")

    def start_sender(self, lab, flow, idx):
        args = ["tcp-send", "--dst", lab.ip(flow.dst), "--port", str(BASE_PORT + idx),
                "--out", str(lab.flow_file(idx, "send")), "--cc", flow.cc,
                "--tos", flow.options.get("tos", "be")]
        args += ["--size", str(flow.size)] if flow.size is not None else []
        dur = flow.duration if flow.duration is not None else (None if flow.size else lab.spec.duration)
        args += ["--duration", str(dur)] if dur is not None else []
        lab.spawn(flow.src, args, f"f{idx}-send")

    def result(self, lab, flow, idx):
        r, s = _load(lab.flow_file(idx, "recv")), _load(lab.flow_file(idx, "send"))
        complete = bool(r.get("complete")) and (flow.size is None or r.get("bytes", 0) >= flow.size)
        return {"bytes": r.get("bytes", 0), "start": s.get("start"), "first": r.get("first"),
                "last": r.get("last"), "complete": complete, "sender_error": s.get("error")}


class UdpDriver(Driver):
    """UDP blast: paced datagrams at `rate` (default: the PHY rate, i.e. over-offered);
    the achievable-rate bound."""

    name = "udp"
    payload = 1470
    tos = "be"

    def rate(self, lab, flow) -> float:
        return flow.rate_bps or lab.spec.medium.rate_mbps * 1e6

    def start_receiver(self, lab, flow, idx):
        args = ["udp-recv", "--port", str(BASE_PORT + idx), "--out", str(lab.flow_file(idx, "recv"))]
        if self.name == "voip":
            args.append("--keep-seqs")
        lab.spawn(flow.dst, args, f"f{idx}-recv")

    def start_sender(self, lab, flow, idx):
        args = ["udp-send", "--dst", lab.ip(flow.dst), "--port", str(BASE_PORT + idx),
                "--out", str(lab.flow_file(idx, "send")), "--rate", str(self.rate(lab, flow)),
                "--payload", str(self.payload), "--tos", flow.options.get("tos", self.tos)]
        args += ["--size", str(flow.size)] if flow.size is not None else []
        dur = flow.duration if flow.duration is not None else (None if flow.size else lab.spec.duration)
        args += ["--duration", str(dur)] if dur is not None else []
        lab.spawn(flow.src, args, f"f{idx}-send")

    def result(self, lab, flow, idx):
        r, s = _load(lab.flow_file(idx, "recv")), _load(lab.flow_file(idx, "send"))
        sent = s.get("packets") or s.get("sent_packets") or 0
        out = {"bytes": r.get("bytes", 0), "start": s.get("start"), "first": r.get("first"),
               "last": r.get("last"), "sent_packets": sent, "recv_packets": r.get("packets", 0),
               "loss": (1.0 - r.get("packets", 0) / sent) if sent else None,
               "complete": flow.size is not None and r.get("bytes", 0) >= flow.size}
        if self.name == "voip":
            out.update(voip_stats(r.get("seqs", []), r.get("delays_ms", []), sent))
            out["seqs"] = r.get("seqs", [])
            out["send_ts"] = r.get("send_ts", [])
        return out


class VoipDriver(UdpDriver):
    """VoIP-like CBR: 20-byte payloads at 8 kbit/s (Hop §5.8), DSCP EF (AC_VO)."""

    name = "voip"
    payload = VOIP_PAYLOAD_BYTES
    tos = "ef"

    def rate(self, lab, flow) -> float:
        return flow.rate_bps or VOIP_RATE_BPS


def voip_stats(seqs: list[int], delays: list[float], sent: int) -> dict:
    """Loss, conditional loss probability (P[lost | previous lost], Hop §5.8) and delay."""
    got = set(seqs)
    lost = [i not in got for i in range(sent)]
    pairs = sum(1 for i in range(1, sent) if lost[i - 1])
    both = sum(1 for i in range(1, sent) if lost[i - 1] and lost[i])
    d = sorted(delays)

    def q(p):
        return d[min(len(d) - 1, int(p * len(d)))] if d else None

    return {"voip_loss": (sum(lost) / sent) if sent else None,
            "voip_clp": (both / pairs) if pairs else 0.0,
            "delay_ms_p50": q(0.5), "delay_ms_p95": q(0.95), "delay_ms_max": d[-1] if d else None}


class HopDriver(Driver):
    """Hop via hopd (crates/hopd). Runs `hopd` in every node namespace and `hop send`
    / `hop recv` for the flow; transport chosen by flow.options["transport"]
    (hop, hxh, atp). The command lines follow hopd's CLI once it lands."""

    name = "hop"

    def _binary(self, name: str) -> str:
        for cand in (shutil.which(name), Path(__file__).resolve().parents[2] / "target" / "release" / name):
            if cand and Path(cand).exists():
                return str(cand)
        raise LabError(f"{name} not found: build it with `cargo build --release -p hopd`")

    def start_receiver(self, lab, flow, idx):
        self._binary("hopd")
        raise LabError("the hop driver is not wired to hopd's command line yet")

    def start_sender(self, lab, flow, idx):
        raise LabError("the hop driver is not wired to hopd's command line yet")

    def result(self, lab, flow, idx):
        return {}


DRIVERS: dict[str, type[Driver]] = {
    "tcp": TcpDriver,
    "udp": UdpDriver,
    "voip": VoipDriver,
    "hop": HopDriver,
}
