"""UDP: a paced blast (the achievable-rate bound) and VoIP-like constant bit rate (Hop §5.8)."""

from __future__ import annotations

from .base import BASE_PORT, Driver, read_json

# Hop §5.8: VoIP emulated as 20-byte packets at 8 kbit/s.
VOIP_PAYLOAD_BYTES = 20
VOIP_RATE_BPS = 8000


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
        r, s = read_json(lab.flow_file(idx, "recv")), read_json(lab.flow_file(idx, "send"))
        sent = s.get("packets") or s.get("sent_packets") or 0
        out = {"bytes": r.get("bytes", 0), "start": s.get("start"), "first": r.get("first"),
               "last": r.get("last"), "sent_packets": sent, "recv_packets": r.get("packets", 0),
               "loss": (1.0 - r.get("packets", 0) / sent) if sent else None,
               "complete": flow.size is not None and r.get("bytes", 0) >= flow.size}
        if not s:
            out["sender_error"] = f"no sender result (raw/f{idx}-send.log)"
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
