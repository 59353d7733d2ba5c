"""Every transport hopd hosts, through the lab: a short emulated 3-node chain (two 802.11
hops) carries one small file with `options.transport` = hop, hxh and atp. Needs root
(namespaces and taps) and the release hopd (`cargo build --release -p hopd`); CI runs as root
and never skips it."""

import json
import os
import re
from pathlib import Path

import pytest

from hoplab import lab, spec
from hoplab.drivers import HopDriver
from hoplab.errors import LabError
from hoplab.run import run_spec

needs_root = pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                                reason="needs root (CI runs as root)")

SIZE = 150_000  # bytes: ~150 packets of HxH/ATP, one Hop block
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def hosted_transport(log: Path) -> str | None:
    """The transport a hopd log says it hosted."""
    m = re.search(r"hosting transport (\S+)", ANSI.sub("", log.read_text(errors="replace")))
    return m.group(1) if m else None


def test_driver_accepts_every_hopd_transport_and_rejects_others():
    assert set(HopDriver.TRANSPORTS) == {"hop", "hxh", "atp", "atp-aggressive", "atp-adaptive"}

    class Flow:
        def __init__(self, transport):
            self.options = {"transport": transport}
            self.size = 1000

    class NoLab:
        pass

    d = HopDriver()
    d.binary = lambda name: name  # no daemons are started: the check comes first
    with pytest.raises(LabError, match="one transport per run"):
        d.prepare(NoLab(), [Flow("tcp")])
    with pytest.raises(LabError, match="one transport per run"):
        d.prepare(NoLab(), [Flow("hop"), Flow("atp")])


@needs_root
@pytest.mark.parametrize("transport,link_mode", [("hop", "unicast"), ("hxh", "unicast"), ("atp", "unicast"),
                                                 ("hop", "broadcast")])
@pytest.mark.usefixtures("medium_server")
def test_emulated_transport_three_node_chain(tmp_path, transport, link_mode):
    sp = spec.from_dict({
        "name": f"pytest-transport-{transport}-{link_mode}", "duration": 35,
        "topology": {"kind": "chain", "nodes": 3},
        "medium": {"broadcast_rate_mbps": 11.0},
        "flow": [{"driver": "hop", "src": 0, "dst": 2, "size": SIZE, "label": "f",
                  "options": {"transport": transport, "link_mode": link_mode}}],
    })
    out = tmp_path / "out"
    res = run_spec(sp, out, progress=lambda *_: None)
    f = res["flows"][0]
    raw = out / "raw"
    assert f["hops"] == 2
    assert f["complete"], f
    assert f["bytes"] == SIZE
    assert f["sender_rc"] == 0 and f["receiver_rc"] == 0
    assert f["goodput_mbps"] > 0
    # the destination's file is the source's, byte for byte
    sent = (raw / "hop-send-0.bin").read_bytes()
    got = (raw / "hop-recv-0" / "hop-send-0.bin").read_bytes()
    assert len(sent) == len(got) == SIZE and got == sent
    # every daemon, the relay included, hosted the requested transport
    for node in range(3):
        assert hosted_transport(raw / f"hopd-{node}.log") == transport
        assert (f'link_mode = "{link_mode}"' in (raw / f"hopd-{node}" / "hopd.toml").read_text()) == (
            link_mode == "broadcast")
        # its final counters were kept: source and relay sent datagrams of that transport
        status = json.loads((raw / f"hopd-{node}" / "status.json").read_text())
        sent_by = dict(status["node"]["transports"])[transport]["sent_by_type"]
        assert node == 2 or sum(sent_by.values()) > 0, (node, sent_by)
    assert lab.lab_namespaces() == [] and lab.lab_links() == []


@needs_root
@pytest.mark.usefixtures("medium_server")
def test_emulated_hxh_overhears_the_relay_forward_instead_of_acknowledging_each_packet(tmp_path):
    # HxH §3.2 passive feedback: the medium passes frames for other nodes to the taps and
    # hopd reads them from a packet socket; the source learns from the relay's forwards.
    sp = spec.from_dict({
        "name": "pytest-hxh-overhear", "duration": 35,
        "topology": {"kind": "chain", "nodes": 3},
        "medium": {"overhear": True},
        "flow": [{"driver": "hop", "src": 0, "dst": 2, "size": SIZE, "label": "f",
                  "options": {"transport": "hxh", "overhear": True}}],
    })
    out = tmp_path / "out"
    res = run_spec(sp, out, progress=lambda *_: None)
    f = res["flows"][0]
    raw = out / "raw"
    assert f["complete"] and f["bytes"] == SIZE, f
    got = (raw / "hop-recv-0" / "hop-send-0.bin").read_bytes()
    assert got == (raw / "hop-send-0.bin").read_bytes()
    status = [json.loads((raw / f"hopd-{n}" / "status.json").read_text()) for n in range(3)]
    hxh = [dict(s["node"]["transports"])["hxh"] for s in status]
    assert "overhear = true" in (raw / "hopd-0" / "hopd.toml").read_text()
    assert status[0]["counters"]["rx_overheard"] > 0, status[0]["counters"]
    assert hxh[0]["extra"].get("passive_acks", 0) > 0, hxh[0]
    relay = hxh[1]["sent_by_type"]
    # The relay acknowledges only duplicates and packets it had no room for.
    assert relay.get("hopack", 0) * 4 < relay["data"], (relay, hxh[1]["extra"])
    assert lab.lab_namespaces() == [] and lab.lab_links() == []


@needs_root
@pytest.mark.usefixtures("medium_server")
def test_emulated_link_status_holds_hopd_to_a_short_mac_queue(tmp_path):
    # medium.link_status: the medium reports each node's MAC backlog to its hopd, which sends
    # only while the MAC holds fewer than link_queue_frames frames. Without it ATP's source
    # fills ns-3's 500-frame queue on this chain (802.11g 24 Mbit/s, 3 MB) and frames expire
    # there; with it the backlog waits in ATP's own queue, where ATP measures it.
    sp = spec.from_dict({
        "name": "pytest-link-status", "duration": 40,
        "topology": {"kind": "chain", "nodes": 3},
        "medium": {"standard": "g", "rate_mbps": 24.0, "link_status": True},
        "flow": [{"driver": "hop", "src": 0, "dst": 2, "size": 2_000_000, "label": "f",
                  "options": {"transport": "atp"}}],
    })
    out = tmp_path / "out"
    res = run_spec(sp, out, progress=lambda *_: None)
    f = res["flows"][0]
    raw = out / "raw"
    assert f["complete"] and f["bytes"] == 2_000_000, f
    assert (raw / "hop-recv-0" / "hop-send-0.bin").read_bytes() == (raw / "hop-send-0.bin").read_bytes()
    status = [json.loads((raw / f"hopd-{n}" / "status.json").read_text()) for n in range(3)]
    assert "link_status_socket" in (raw / "hopd-0" / "hopd.toml").read_text()
    link = [s["link_status"] for s in status]
    med = res["medium"]
    assert med["link_status"]["reports"] > 0, med["link_status"]
    # Source and relay heard their MAC and waited for it; the receiver only sends feedback.
    assert link[0]["reports"] > 0 and link[0]["full"] > 0 and link[0]["stale"] == 0, link
    assert link[1]["reports"] > 0, link
    assert med["totals"]["queue_expired"] == 0 and med["totals"]["queue_full"] == 0, med["totals"]
    assert lab.lab_namespaces() == [] and lab.lab_links() == []


def test_overhearing_hopd_needs_an_overhearing_medium(tmp_path):
    sp = spec.from_dict({
        "name": "pytest-hxh-deaf", "duration": 10, "topology": {"kind": "chain", "nodes": 3},
        "flow": [{"driver": "hop", "src": 0, "dst": 2, "size": SIZE,
                  "options": {"transport": "hxh", "overhear": True}}],
    })

    class Lab:
        spec = sp

    d = HopDriver()
    d.binary = lambda name: name
    with pytest.raises(LabError, match="medium.overhear"):
        d.prepare(Lab(), sp.flows)


@needs_root
@pytest.mark.usefixtures("medium_server")
def test_emulated_chain_with_node_keys_and_sessions_instead_of_the_mesh_key(tmp_path):
    # options.security = "sessions": every hopd has its own key (`hop keygen --members`), one
    # members file admits them all, and neighbours exchange their sealing keys in Noise
    # handshakes over the emulated 802.11 hops before the file crosses.
    sp = spec.from_dict({
        "name": "pytest-hop-sessions", "duration": 35,
        "topology": {"kind": "chain", "nodes": 3},
        "flow": [{"driver": "hop", "src": 0, "dst": 2, "size": SIZE, "label": "f",
                  "options": {"security": "sessions"}}],
    })
    out = tmp_path / "out"
    res = run_spec(sp, out, progress=lambda *_: None)
    f = res["flows"][0]
    raw = out / "raw"
    assert f["complete"] and f["bytes"] == SIZE, f
    got = (raw / "hop-recv-0" / "hop-send-0.bin").read_bytes()
    assert got == (raw / "hop-send-0.bin").read_bytes()
    for node in range(3):
        cfg = (raw / f"hopd-{node}" / "hopd.toml").read_text()
        assert "sessions = true" in cfg and "mesh_key" not in cfg
        status = json.loads((raw / f"hopd-{node}" / "status.json").read_text())
        assert status["sessions"] is True
        assert status["counters"]["sessions_completed"] >= 1, status["counters"]
        assert all(n["session_key"] for n in status["neighbours"]), status["neighbours"]
    assert lab.lab_namespaces() == [] and lab.lab_links() == []
