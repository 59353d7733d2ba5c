"""Validation of the emulator against known 802.11b numbers (docs/lab.md).

Expectations (802.11b, 11 Mbit/s, 1500-byte frames): one hop carries about
5 Mbit/s of TCP and about 6 Mbit/s of UDP (MAC/PHY overhead at 11 Mbit/s); a
3-hop chain carries about a third of the 1-hop TCP goodput (the hops share
the channel); hidden terminals at an AP cause collisions that in-range senders
avoid by carrier sense; a node that is down cuts a path through it.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import mediumserver, spec as specmod
from .drivers.udp import VOIP_PAYLOAD_BYTES, VOIP_RATE_BPS
from .run import run_spec

# Expectation bands: the nominal value +-25 %.
TCP_1HOP_MBPS = 5.0
UDP_1HOP_MBPS = 6.0
BAND = 0.25
CHAIN3_RATIO = (0.2, 0.45)  # ~1/3 of 1-hop
HIDDEN_FACTOR = 3.0  # hidden terminals: at least 3x the failed attempts per frame of in-range senders


def scenarios(quick: bool) -> dict[str, dict]:
    k = 1.0 if quick else 2.5
    pair_flows = [{"driver": "udp", "src": s, "dst": 1, "duration": 8 * k, "rate": "5Mbit",
                   "label": f"s{s}"} for s in (0, 2)]
    star_flows = [{"driver": "udp", "src": s, "dst": 0, "duration": 8 * k, "rate": "2Mbit",
                   "label": f"s{s}"} for s in range(1, 8)]
    return {
        "one-hop": {
            "name": "selftest-one-hop", "duration": 60 * k,
            "topology": {"kind": "chain", "nodes": 2},
            "flow": [{"driver": "tcp", "src": 0, "dst": 1, "duration": 10 * k, "label": "tcp"},
                     {"driver": "udp", "src": 0, "dst": 1, "duration": 8 * k, "label": "udp",
                      "after": "tcp", "start": 0.5}],
        },
        "three-hop": {
            "name": "selftest-three-hop", "duration": 40 * k,
            "topology": {"kind": "chain", "nodes": 4},
            "flow": [{"driver": "tcp", "src": 0, "dst": 3, "duration": 15 * k, "label": "tcp"}],
        },
        "hidden-pair": {
            "name": "selftest-hidden-pair", "duration": 30 * k,
            "topology": {"kind": "chain", "nodes": 3}, "flow": pair_flows,
        },
        "in-range-pair": {
            "name": "selftest-in-range-pair", "duration": 30 * k,
            "topology": {"kind": "chain", "nodes": 3, "link": [{"a": 0, "b": 2}]}, "flow": pair_flows,
        },
        "ap-hidden": {
            "name": "selftest-ap-hidden", "duration": 30 * k,
            "topology": {"kind": "star", "senders": 7, "hidden_pairs": 6}, "flow": star_flows,
        },
        "ap-in-range": {
            "name": "selftest-ap-in-range", "duration": 30 * k,
            "topology": {"kind": "star", "senders": 7, "hidden_pairs": 0}, "flow": star_flows,
        },
        "node-down": {
            "name": "selftest-node-down", "duration": 30 * k,
            "topology": {"kind": "chain", "nodes": 3},
            "flow": [{"driver": "voip", "src": 0, "dst": 2, "duration": 9 * k, "label": "voip"}],
            "schedule": [{"at": 3 * k, "action": "down", "node": 1},
                         {"at": 6 * k, "action": "up", "node": 1}],
        },
    }


def failed_attempt_ratio(res: dict) -> float:
    tot = res["medium"]["totals"]
    return tot["retries"] / max(1, tot["mac_tx"])


def window_delivery(flow: dict, t_start: float, a: float, b: float, interval: float) -> float | None:
    """Fraction of the packets sent in [a, b) (seconds after the flow start) that arrived."""
    sent = [i for i in range(flow.get("sent_packets", 0)) if a <= i * interval < b]
    if not sent:
        return None
    got = set(flow.get("seqs", []))
    return sum(1 for i in sent if i in got) / len(sent)


def evaluate(name: str, res: dict, ctx: dict) -> list[tuple[str, bool, str]]:
    checks = []
    fl = {f["label"]: f for f in res["flows"]}
    if name == "one-hop":
        tcp, udp = fl["tcp"]["goodput_mbps"], fl["udp"]["goodput_mbps"]
        ctx["tcp1"] = tcp
        checks.append(("TCP 1 hop ~5 Mbit/s", abs(tcp - TCP_1HOP_MBPS) <= BAND * TCP_1HOP_MBPS,
                       f"{tcp:.2f} Mbit/s"))
        checks.append(("UDP 1 hop ~6 Mbit/s", abs(udp - UDP_1HOP_MBPS) <= BAND * UDP_1HOP_MBPS,
                       f"{udp:.2f} Mbit/s"))
    elif name == "three-hop":
        tcp = fl["tcp"]["goodput_mbps"]
        ratio = tcp / ctx["tcp1"] if ctx.get("tcp1") else 0.0
        checks.append(("TCP 3 hops ~1/3 of 1 hop", CHAIN3_RATIO[0] <= ratio <= CHAIN3_RATIO[1],
                       f"{tcp:.2f} Mbit/s, ratio {ratio:.2f}"))
    elif name == "hidden-pair":
        ctx["hidden"] = failed_attempt_ratio(res)
        ctx["hidden_coll"] = res["medium"]["per_node"][1]["phy_rx_collision"]
        ctx["hidden_gp"] = sum(f["goodput_mbps"] for f in res["flows"])
    elif name == "in-range-pair":
        r_in = failed_attempt_ratio(res)
        coll_in = res["medium"]["per_node"][1]["phy_rx_collision"]
        gp_in = sum(f["goodput_mbps"] for f in res["flows"])
        checks.append((
            "hidden terminals collide, in-range senders avoid it",
            ctx.get("hidden", 0.0) >= HIDDEN_FACTOR * max(r_in, 1e-3),
            f"failed attempts/frame hidden {ctx.get('hidden', 0):.3f} vs in range {r_in:.3f}; "
            f"receiver PHY drops {ctx.get('hidden_coll')} vs {coll_in}; total goodput "
            f"{ctx.get('hidden_gp', 0):.2f} vs {gp_in:.2f} Mbit/s"))
    elif name == "ap-hidden":
        ctx["hidden"] = failed_attempt_ratio(res)
        ctx["hidden_coll"] = res["medium"]["per_node"][0]["phy_rx_collision"]
        ctx["hidden_gp"] = sum(f["goodput_mbps"] for f in res["flows"])
    elif name == "ap-in-range":
        r_in = failed_attempt_ratio(res)
        coll_in = res["medium"]["per_node"][0]["phy_rx_collision"]
        gp_in = sum(f["goodput_mbps"] for f in res["flows"])
        checks.append((
            "info: 7-to-1 AP, 6 hidden pairs vs none (Hop §5.5)", None,
            f"failed attempts/frame hidden {ctx.get('hidden', 0):.3f} vs in range {r_in:.3f}; "
            f"AP collisions {ctx.get('hidden_coll')} vs {coll_in}; total goodput "
            f"{ctx.get('hidden_gp', 0):.2f} vs {gp_in:.2f} Mbit/s"))
    elif name == "node-down":
        f = fl["voip"]
        sp = res["spec"]
        down, up = sp["schedule"][0]["at"], sp["schedule"][1]["at"]
        interval = VOIP_PAYLOAD_BYTES * 8 / VOIP_RATE_BPS
        before = window_delivery(f, 0, 0.5, down - 0.2, interval)
        during = window_delivery(f, 0, down + 0.3, up - 0.1, interval)
        after = window_delivery(f, 0, up + 1.0, f.get("sent_packets", 0) * interval, interval)
        ok = before is not None and during is not None and after is not None and \
            before >= 0.9 and during == 0.0 and after >= 0.9
        checks.append(("node down cuts the path, up restores it", ok,
                       f"delivered before {before}, during {during}, after {after}"))
    return checks


def selftest(quick: bool, out: Path) -> int:
    with mediumserver.serving():  # one ns-3 import for all scenarios
        return _selftest(quick, out)


def _selftest(quick: bool, out: Path) -> int:
    ctx: dict = {}
    all_checks = []
    invalid = []
    for name, d in scenarios(quick).items():
        if quick and name.startswith("ap-"):
            continue
        sp = specmod.from_dict(d)
        res = run_spec(sp, out / name)
        if not res["valid"]:
            print(f"  run {name} invalid ({res['invalid_reason']}); repeating it once", flush=True)
            res = run_spec(specmod.from_dict(d), out / f"{name}-repeat")
            if not res["valid"]:
                invalid.append(f"{name}: {res['invalid_reason']}")
        for c in evaluate(name, res, ctx):
            if c[1] is None:
                print(f"  [INFO] {c[0]}: {c[2]}", flush=True)
                continue
            all_checks.append((name,) + c)
            print(f"  [{'PASS' if c[1] else 'FAIL'}] {c[0]}: {c[2]}", flush=True)
    report = {"quick": quick, "checks": [{"scenario": s, "check": c, "ok": ok, "measured": m}
                                         for s, c, ok, m in all_checks], "invalid_runs": invalid}
    (out / "selftest.json").write_text(json.dumps(report, indent=1))
    passed = sum(1 for c in all_checks if c[2])
    failed = len(all_checks) - passed
    for msg in invalid:
        print(f"  [WARN] invalid run (lag bound exceeded): {msg}")
    print(f"selftest: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1
