"""Dynamic routing in the lab (routing = "babel"): the pieces without an emulation, and one
emulated diamond whose preferred relay goes down mid-transfer (needs root and babeld; CI
runs as root and installs babeld through scripts/setup-lab.sh)."""

import json
import os
import time
import tomllib
from types import SimpleNamespace

import pytest

from hoplab import addresses, dynroute, lab, spec
from hoplab.drivers import HopDriver
from hoplab.errors import LabError, SpecError
from hoplab.experiments import registry
from hoplab.run import run_spec

needs_root = pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                                reason="needs root (CI runs as root)")


def test_node_of_inverts_ip_of():
    for i in (0, 1, 254, 255, 300):
        assert addresses.node_of(addresses.ip_of(i)) == i
    assert addresses.node_of("10.1.0.1") is None
    assert addresses.node_of("fe80::1") is None
    assert addresses.node_of(f"{addresses.SUBNET}.0.0") is None


def test_parse_table_reads_babel_host_routes():
    text = json.dumps([
        {"dst": lab.ip_of(3), "gateway": lab.ip_of(1), "dev": "wl0", "protocol": "babel", "flags": ["onlink"]},
        {"dst": lab.ip_of(1), "gateway": lab.ip_of(1), "dev": "wl0", "protocol": "babel", "flags": ["onlink"]},
        {"dst": "192.168.1.0/24", "gateway": lab.ip_of(1)},  # not a lab node: ignored
        # a destination babeld lost: no next hop (not a direct route)
        {"type": "unreachable", "dst": lab.ip_of(5), "protocol": "babel", "metric": 4294967295, "flags": []},
    ])
    assert dynroute.parse_table(text, addresses.node_of) == {3: 1, 1: 1}
    assert dynroute.parse_table("", addresses.node_of) == {}
    assert dynroute.parse_table("not json", addresses.node_of) == {}


def test_unrouted_follows_next_hops_and_stops_on_loops():
    table = {0: {3: 1}, 1: {3: 3}, 2: {3: 0}, 3: {}}
    assert dynroute.unrouted(table, [(0, 3), (1, 3)]) == []
    assert dynroute.unrouted(table, [(2, 3)]) == []  # 2 -> 0 -> 1 -> 3
    loop = {0: {3: 1}, 1: {3: 0}}
    assert dynroute.unrouted(loop, [(0, 3)]) == [(0, 3)]
    assert dynroute.unrouted({0: {}}, [(0, 3)]) == [(0, 3)]


def test_changes_counts_moved_new_and_lost_entries():
    old = {0: {3: 1, 2: 2}, 1: {3: 3}}
    new = {0: {3: 2, 1: 1}, 1: {3: 3}}
    assert dynroute.changes(old, new) == 3  # 3 moved, 2 lost, 1 new
    assert dynroute.changes(new, new) == 0


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_wait_converged_needs_flows_routed_for_a_while():
    clock = FakeClock()
    via1, via3 = {0: {2: 1}, 1: {2: 2}}, {0: {2: 3}, 3: {2: 2}}
    # routed at 2 s, lost at 4 s, routed again from 6 s: next hops change but stay usable
    tables = iter([{0: {}}, via1, {0: {}}, via1, via3, via1, via3] + [via3] * 20)
    table, waited, missing = dynroute.wait_converged(lambda: next(tables), [(0, 2)], print, timeout=60,
                                                     stable=6, poll=2, clock=clock, sleep=clock.sleep)
    assert missing == [] and table in (via1, via3)
    assert waited == 12.0  # routed without a gap from 6 s, for 6 s


def test_wait_converged_gives_up_after_the_timeout():
    clock = FakeClock()
    said = []
    table, waited, missing = dynroute.wait_converged(lambda: {0: {}}, [(0, 2)], said.append, timeout=10,
                                                     stable=4, poll=2, clock=clock, sleep=clock.sleep)
    assert missing == [(0, 2)] and waited == 10.0
    assert said and "without a route" in said[0]


def test_spec_accepts_babel_and_names_the_choices():
    base = {"name": "x", "topology": {"kind": "chain", "nodes": 3},
            "flow": [{"driver": "udp", "src": 0, "dst": 2, "duration": 1}]}
    assert spec.from_dict({**base, "routing": "babel"}).routing == "babel"
    with pytest.raises(SpecError, match="babel"):
        spec.from_dict({**base, "routing": "olsr"})


def test_hopd_follows_the_kernel_under_dynamic_routing(tmp_path):
    sp = spec.from_dict({"name": "x", "routing": "babel", "topology": {"kind": "chain", "nodes": 4},
                         "flow": [{"driver": "hop", "src": 0, "dst": 3, "size": 1000}]})
    status = lambda n: tmp_path / f"link-{n}.sock"  # noqa: E731
    fake = SimpleNamespace(spec=sp, dynamic=True, table={}, work=tmp_path, sockets=tmp_path, ip=lab.ip_of,
                           link_status_socket=status)
    cfg = tomllib.loads(HopDriver().config(fake, 1, "hop", {}, "broadcast"))
    assert cfg["kernel_routes"] is True
    assert cfg["link_status_socket"] == str(tmp_path / "link-1.sock")  # top level, with kernel_routes
    assert "routes" not in cfg
    assert sorted(n["id"] for n in cfg["neighbours"]) == [1, 3]  # hop ids of nodes 0 and 2
    assert [h["id"] for h in cfg["hosts"]] == [4]  # node 3, not in range of node 1
    static = SimpleNamespace(spec=sp, dynamic=False, table={1: {3: 2, 0: 0, 2: 2}}, work=tmp_path, sockets=tmp_path,
                             ip=lab.ip_of, link_status_socket=status)
    cfg = tomllib.loads(HopDriver().config(static, 1, "hop", {}))
    assert "kernel_routes" not in cfg and {r["destination"]: r["next_hop"] for r in cfg["routes"]}[4] == 3


def test_hopd_config_carries_control_when_full_next_to_the_link_status_socket(tmp_path):
    sp = spec.from_dict({"name": "x", "topology": {"kind": "chain", "nodes": 3},
                         "flow": [{"driver": "hop", "src": 0, "dst": 2, "size": 1000}]})
    status = lambda n: tmp_path / f"link-{n}.sock"  # noqa: E731
    fake = SimpleNamespace(spec=sp, dynamic=False, table={1: {0: 0, 2: 2}}, work=tmp_path, sockets=tmp_path,
                           ip=lab.ip_of, link_status_socket=status)
    for setting in (True, False):
        cfg = tomllib.loads(HopDriver().config(fake, 1, "hop", {}, control_when_full=setting))
        assert cfg["link_status_socket"] == str(tmp_path / "link-1.sock")
        assert cfg["link_control_when_full"] is setting  # top level, not in a table
    assert "link_control_when_full" not in tomllib.loads(HopDriver().config(fake, 1, "hop", {}))
    e = registry()["hop-5.2"]
    v = e.variant("hop-ctlfull")
    assert v.flow["options"]["link_control_when_full"] is True
    assert "link_control_when_full" not in e.variant("hop").flow["options"]


def test_hop_59_runs_dynamic_routing_variants():
    e = registry()["hop-5.9"]
    names = [v.name for v in e.variants]
    assert {"hop-babel", "tcp-babel", "tcp-babel-auto"} <= set(names)
    assert e.spec(e.variant("tcp-babel"), 30, 0, False)["routing"] == "babel"
    assert e.spec(e.variant("tcp"), 30, 0, False)["routing"] == "etx"
    # same flows for static and dynamic routing (side by side)
    assert e.spec(e.variant("hop-babel"), 30, 0, False)["flow"] == e.spec(e.variant("hop"), 30, 0, False)["flow"]


@needs_root
@pytest.mark.usefixtures("medium_server")
def test_babel_reroutes_around_a_relay_that_goes_down(tmp_path):
    # A diamond: 0-1-3 clean, 0-2-3 lossy, so Babel starts on relay 1. Relay 1 goes down while a
    # Hop file is under way: it must finish over relay 2 once Babel moved the routes (hopd follows
    # the kernel table). A TCP transfer started later must find the new routes too. (TCP is not
    # started before the change: its retransmission backoff over the ~20 s Babel takes to
    # reroute would make the test's length depend on luck.)
    diamond = tmp_path / "diamond.json"
    diamond.write_text(json.dumps({"nodes": 4, "links": [
        {"a": 0, "b": 1, "loss": 0.0}, {"a": 1, "b": 3, "loss": 0.0},
        {"a": 0, "b": 2, "loss": 0.25}, {"a": 2, "b": 3, "loss": 0.25}]}))
    sp = spec.from_dict({
        "name": "pytest-babel-diamond", "duration": 120, "routing": "babel",
        "topology": {"kind": "file", "file": str(diamond)},
        "medium": {"broadcast_rate_mbps": 11.0},
        "flow": [{"driver": "hop", "src": 0, "dst": 3, "size": "3MB", "label": "hop",
                  "options": {"link_mode": "broadcast"}},
                 {"driver": "tcp", "src": 3, "dst": 0, "size": "1MB", "label": "tcp", "start": 50.0}],
        "schedule": [{"at": 5.0, "action": "down", "node": 1}],
    })
    res = run_spec(sp, tmp_path / "out", progress=lambda *_: None)
    dyn = res["routing_dynamics"]
    assert dyn["protocol"] == "babel" and dyn["unrouted_at_start"] == []
    fl = {f["label"]: f for f in res["flows"]}
    assert fl["hop"]["hops"] == 2 and fl["tcp"]["hops"] == 2
    # routes moved off relay 1 ...
    assert dyn["next_hop_changes"] > 0
    # ... and both transfers completed without relay 1
    assert fl["hop"]["complete"], fl["hop"]
    assert fl["tcp"]["complete"], fl["tcp"]
    assert lab.lab_namespaces() == [] and lab.lab_links() == []


def test_wait_converged_ends_when_the_check_raises():
    def dead():
        raise LabError("the medium exited during the run")

    with pytest.raises(LabError, match="medium exited"):
        dynroute.wait_converged(lambda: {0: {}}, [(0, 2)], print, timeout=60, check=dead,
                                sleep=lambda _s: None)


def test_poller_counts_changes_in_its_own_thread():
    tables = [{0: {2: 1}, 1: {2: 2}}, {0: {2: 3}, 3: {2: 2}, 1: {2: 2}}]
    reads = []

    def read():
        reads.append(1)
        return tables[min(len(reads), len(tables)) - 1]

    now = [100.0]
    p = dynroute.Poller(read, {0: {2: 1}, 1: {2: 2}}, t0=100.0, interval=0.01, clock=lambda: now[0]).start()
    deadline = time.time() + 10
    while len(p.polls) < 3 and time.time() < deadline:
        time.sleep(0.01)
    p.stop()
    assert len(p.polls) >= 3
    # first poll: no change; second: 0's next hop moved (1 -> 3) and node 3 got a route; then steady
    assert [x[1] for x in p.polls[:3]] == [0, 2, 0] and p.polls[1][2] == 3
    assert p.next_hop_changes == 2
    n = len(p.polls)
    time.sleep(0.05)
    assert len(p.polls) == n  # stopped
