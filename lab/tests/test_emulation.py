"""A short real emulation (needs root: namespaces and taps). CI runs as root."""

import os
import signal
import threading
import time

import pytest

from hoplab import lab, mediumserver, spec
from hoplab.errors import LabError
from hoplab.run import run_spec

needs_root = pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                                reason="needs root (CI runs as root)")


@needs_root
@pytest.mark.parametrize("medium", ["spawned", "forked"])
def test_two_hop_udp_and_node_down(tmp_path, medium, request, monkeypatch):
    if medium == "forked":
        assert request.getfixturevalue("medium_server"), "the medium server did not start"
    else:  # a server another test started stays up for the session: do without it here
        monkeypatch.delenv(mediumserver.ENV, raising=False)
    sp = spec.from_dict({
        "name": "pytest-emulation", "duration": 40,
        "topology": {"kind": "chain", "nodes": 3},
        "flow": [{"driver": "voip", "src": 0, "dst": 2, "duration": 6, "label": "v"},
                 {"driver": "udp", "src": 0, "dst": 1, "duration": 3, "rate": "3Mbit", "label": "u",
                  "start": 0.5}],
        "schedule": [{"at": 3.5, "action": "down", "node": 1}],
    })
    res = run_spec(sp, tmp_path / "out", progress=lambda *_: None)
    fl = {f["label"]: f for f in res["flows"]}
    assert fl["v"]["hops"] == 2
    assert fl["u"]["goodput_mbps"] > 1.0
    # packets sent while node 1 was down never arrive; earlier ones do
    interval = 20 * 8 / 8000
    got = set(fl["v"]["seqs"])
    early = [i for i in range(int(0.5 / interval), int(3.0 / interval))]
    late = [i for i in range(int(4.0 / interval), fl["v"]["sent_packets"])]
    assert sum(i in got for i in early) >= 0.9 * len(early)
    assert late and not any(i in got for i in late)
    assert res["lag"]["samples"] > 100
    # the event loop's CPU share over the measured time: a light load leaves it mostly idle
    busy = res["lag"]["loop"]["busy"]
    assert 0.0 < busy < 0.9, busy
    # every flow's received bytes, sampled through the run
    prog = res["progress"]
    assert prog["columns"] == ["t", "v", "u"]
    ts = [r[0] for r in prog["rows"]]
    assert len(ts) >= 2 and ts == sorted(ts)
    u = [r[2] for r in prog["rows"]]
    assert u == sorted(u) and u[-1] > 0
    assert res["medium"]["totals"]["phy_tx"] > 0
    # Air time: each node's PHY states add up to the medium's run, and what a node sent adds
    # up to its time sending. Node 0 sent 3 s of 3 Mbit/s UDP in large frames and the VoIP
    # stream in small ones; node 1 acknowledged the UDP frames and forwarded the VoIP ones.
    sim_us = res["medium"]["sim_seconds"] * 1e6
    for c in res["medium"]["per_node"]:
        states = sum(c[k] for k in ("state_idle_us", "state_cca_us", "state_tx_us", "state_rx_us"))
        assert abs(states - sim_us) < 0.01 * sim_us, (states, sim_us)
        sent = c["air_large_us"] + c["air_small_us"] + c["air_mac_us"]
        assert abs(c["state_tx_us"] - sent) <= 0.01 * c["state_tx_us"] + 1000, c
    n0, n1 = res["medium"]["per_node"][:2]
    assert n0["air_large_us"] > 500_000 and n0["air_small_us"] > 0, n0
    assert n1["air_mac_us"] > 0 and n1["air_small_us"] > 0, n1
    assert n1["state_rx_us"] > n0["air_large_us"] // 2, n1
    # Frames cross the taps both ways and none is lost between tap and device. Node 0 hears
    # node 1 forward the VoIP frames to node 2, but like a real NIC's address filter the
    # medium keeps unicast frames for other nodes off a node's tap.
    taps = res["medium"]["taps"]
    assert taps["from_tap"] > 0 and taps["to_tap"] > 0, taps
    assert taps["other_host"] > 0, taps
    assert taps["write_errors"] == 0 and taps["queue_drops"] == 0 and taps["bad_frames"] == 0, taps
    assert res["medium_forked"] == (medium == "forked")
    # nothing left behind
    assert lab.lab_namespaces() == [] and lab.lab_links() == []


@needs_root
def test_a_medium_that_dies_mid_run_ends_the_run_with_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv(mediumserver.ENV, raising=False)
    sp = spec.from_dict({
        "name": "pytest-medium-dies", "duration": 120,
        "topology": {"kind": "chain", "nodes": 2},
        "flow": [{"driver": "udp", "src": 0, "dst": 1, "duration": 100, "rate": "1Mbit", "label": "u"}],
    })
    killed = []

    def kill_medium_once_flows_run():
        deadline = time.time() + 90
        while time.time() < deadline:
            log = tmp_path / "out" / "raw" / "f0-send.log"
            if log.exists() and lab.MEDIUM_PID.exists():
                time.sleep(3)
                os.kill(int(lab.MEDIUM_PID.read_text()), signal.SIGKILL)
                killed.append(time.time())
                return
            time.sleep(0.2)

    t = threading.Thread(target=kill_medium_once_flows_run, daemon=True)
    t.start()
    with pytest.raises(LabError, match="medium exited during the run"):
        run_spec(sp, tmp_path / "out", progress=lambda *_: None)
    t.join(timeout=5)
    assert killed and time.time() - killed[0] < 30  # not the 120 s of the spec
    assert lab.lab_namespaces() == [] and lab.lab_links() == []


@needs_root
def test_no_arq_acs_turns_link_retries_off_for_one_access_category_only(tmp_path):
    # One link losing half its frames, two paced UDP flows side by side: the background
    # category's (CS1) frames get one attempt, the voice category's (EF) keep the retries.
    sp = spec.from_dict({
        "name": "pytest-no-arq", "duration": 30,
        "topology": {"kind": "chain", "nodes": 2, "link": [{"a": 0, "b": 1, "loss": 0.5, "loss_back": 0.0}]},
        "medium": {"retry_limit": 7, "no_arq_acs": ["bk"]},
        "flow": [{"driver": "udp", "src": 0, "dst": 1, "duration": 4, "rate": "400kbit", "label": "bk",
                  "options": {"tos": "cs1"}},
                 {"driver": "udp", "src": 0, "dst": 1, "duration": 4, "rate": "400kbit", "label": "vo",
                  "options": {"tos": "ef"}},
                 # then best effort over-offered at the PHY rate: the MAC queue must drop
                 {"driver": "udp", "src": 0, "dst": 1, "duration": 3, "start": 5.0, "label": "be"}],
    })
    res = run_spec(sp, tmp_path / "out", progress=lambda *_: None)
    fl = {f["label"]: f for f in res["flows"]}
    # 0.5 with one attempt; 0.5 ** 8 = 0.4 % with seven retries. About 137 packets: the
    # window is 4.7 standard deviations of a fair coin wide on each side.
    assert 0.3 < fl["bk"]["loss"] < 0.7, fl["bk"]["loss"]
    assert fl["vo"]["loss"] < 0.05, fl["vo"]["loss"]
    sender = res["medium"]["per_node"][0]
    assert sender["tid1"] > 0 and sender["tid6"] > 0, sender
    # every lost background frame is a final failure after its single attempt
    assert sender["final_failures"] >= 0.8 * fl["bk"]["loss"] * fl["bk"]["sent_packets"], sender
    # frames the MAC dropped unsent are counted: with seven retries the over-offered flow
    # loses almost nothing on the link, so they are (within a few frames) what it lost
    dropped = sender["queue_full"] + sender["queue_expired"]
    lost = fl["be"]["sent_packets"] - fl["be"]["recv_packets"]
    assert lost > 0 and abs(dropped - lost) <= 0.05 * lost + 10, (sender, fl["be"])
    # the over-offered flow kept the sender's MAC holding data for its 3 s; the receiver
    # sends nothing of its own but MAC ACKs, which no queue holds
    receiver = res["medium"]["per_node"][1]
    assert sender["queued_us"] >= sender["queued_data_us"] >= 2_800_000, sender
    assert receiver["queued_data_us"] < 0.05 * sender["queued_data_us"], receiver
    assert lab.lab_namespaces() == [] and lab.lab_links() == []


@needs_root
def test_sense_pairs_defer_to_each_other_instead_of_colliding(tmp_path):
    # Two senders out of range of each other blast one receiver (Hop §3.5's hidden terminals).
    # As a sense pair they hear each other's carrier, defer, and collide far less.
    got = {}
    for name, sense in (("hidden", []), ("sensed", [[0, 2]])):
        sp = spec.from_dict({
            "name": f"pytest-{name}", "duration": 30, "medium": {"retry_limit": 7},
            "topology": {"kind": "chain", "nodes": 3, "sense": sense},
            "flow": [{"driver": "udp", "src": 0, "dst": 1, "duration": 4, "rate": "4Mbit", "label": "a"},
                     {"driver": "udp", "src": 2, "dst": 1, "duration": 4, "rate": "4Mbit", "label": "c"}],
        })
        res = run_spec(sp, tmp_path / name, progress=lambda *_: None)
        got[name] = (res["medium"]["per_node"][1]["phy_rx_collision"],
                     sum(f["goodput_mbps"] for f in res["flows"]))
        # a sensed frame is never delivered: the receivers' taps get only their neighbours' frames
        assert res["medium"]["taps"]["bad_frames"] == 0
    (coll_hidden, gp_hidden), (coll_sensed, gp_sensed) = got["hidden"], got["sensed"]
    # (measured: 608 -> 184 collisions at the receiver, 4.2 -> 6.4 Mbit/s; same-slot
    # backoffs still collide)
    assert coll_sensed < 0.5 * coll_hidden, got
    assert gp_sensed > 1.2 * gp_hidden, got
    assert lab.lab_namespaces() == [] and lab.lab_links() == []
