"""dtn7 peer: CBOR payload decoding, route files, and real delivery through three dtnd on
loopback (static routing over the TCP convergence layer), then a 3-node lab chain.

The daemons come from scripts/setup-dtn7.sh. Without them the daemon tests are skipped,
except in CI (CI=true), where they must run."""

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from hoplab import dtnclient, lab, spec
from hoplab.drivers import dtn
from hoplab.errors import LabError

REPO = Path(__file__).resolve().parents[2]


def have_dtnd():
    try:
        dtn.dtnd_binary()
        return True
    except LabError:
        return False


needs_dtnd = pytest.mark.skipif(not have_dtnd() and os.environ.get("CI") != "true",
                                reason="dtn7 not installed (run scripts/setup-dtn7.sh); required in CI")


def enc(v):
    """Definite-length CBOR encoding of ints, byte/text strings and arrays."""
    def head(major, n):
        if n < 24:
            return bytes([major << 5 | n])
        for info, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
            if n < 1 << (8 * width):
                return bytes([major << 5 | info]) + n.to_bytes(width, "big")
        raise ValueError(n)

    if isinstance(v, int):
        return head(0, v)
    if isinstance(v, bytes):
        return head(2, len(v)) + v
    if isinstance(v, str):
        return head(3, len(v.encode())) + v.encode()
    return head(4, len(v)) + b"".join(enc(x) for x in v)


def test_cbor_payload_of_a_bpv7_bundle():
    # indefinite array [primary, hop-count block, payload block], as dtnd encodes bundles
    payload = bytes(range(256)) * 300
    primary = [7, 0, 0, [1, "//n2/incoming"], [1, "//n0/"], [1, "//n0/"], [700_000_000_000, 0],
               3_600_000]
    hop = [10, 2, 0, 0, enc([32, 0])]
    pl = [1, 1, 0, 0, payload]
    raw = b"\x9f" + enc(primary) + enc(hop) + enc(pl) + b"\xff"
    assert dtnclient.bundle_payload(raw) == payload
    with pytest.raises(dtnclient.CborError):
        dtnclient.bundle_payload(b"\x9f" + enc(primary) + enc(hop) + b"\xff")
    with pytest.raises(dtnclient.CborError):
        dtnclient.bundle_payload(raw[:-100])


def test_routes_and_args():
    assert dtn.routes_text(1, {0: 0, 2: 2, 3: 2}) == (
        "1 ** dtn://n0/** dtn://n0/\n2 ** dtn://n2/** dtn://n2/\n3 ** dtn://n3/** dtn://n2/\n")
    args = dtn.dtnd_args(1, Path("/w"), Path("/w/r"), {2: "10.77.0.3:4556"})
    assert "static.routes=/w/r" in args and "tcp://10.77.0.3:4556/n2" in args
    assert args[args.index("-C") + 1] == "tcp:port=4556"


def test_driver_interface():
    from hoplab.drivers import DRIVERS, Driver

    d = DRIVERS["dtn"]()
    assert d.done_when == "receiver"
    assert d.progress.__func__ is dtn.DtnDriver.progress
    with pytest.raises(AttributeError):
        d.no_such_attribute
    assert Driver.done_when == "sender"


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


@needs_dtnd
def test_three_dtnd_on_loopback_deliver_bundles(tmp_path):
    """n0 -> n1 -> n2 over TCPCL with static routes; 2.5 MB as three bundles."""
    binary = dtn.dtnd_binary()
    ports = free_ports(6)
    web, cla = ports[:3], ports[3:]
    nh = {0: {1: 1, 2: 1}, 1: {0: 0, 2: 2}, 2: {0: 1, 1: 1}}
    procs = []
    try:
        for i in range(3):
            d = tmp_path / f"n{i}"
            d.mkdir()
            routes = d / "routes.txt"
            routes.write_text(dtn.routes_text(i, nh[i]))
            peers = {j: f"127.0.0.1:{cla[j]}" for j in set(nh[i].values())}
            log = open(tmp_path / f"dtnd-{i}.log", "w")
            procs.append(subprocess.Popen(
                [binary, *dtn.dtnd_args(i, d, routes, peers, web_port=web[i], cla_port=cla[i])],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        for i in range(3):
            dtnclient.wait_api(web[i], time.time() + 20)
        size = 2_500_000
        out_r, out_s = tmp_path / "recv.json", tmp_path / "send.json"
        env = {**os.environ, "PYTHONPATH": str(REPO / "lab")}
        recv = subprocess.Popen(["python3", "-m", "hoplab.dtnclient", "recv", "--port", str(web[2]),
                                 "--endpoint", "f7", "--size", str(size), "--out", str(out_r)],
                                env=env, stdout=subprocess.PIPE, text=True)
        assert recv.stdout.readline().strip() == "ready"  # endpoint registered
        send = subprocess.run(["python3", "-m", "hoplab.dtnclient", "send", "--port", str(web[0]),
                               "--dst", "dtn://n2/f7", "--size", str(size),
                               "--out", str(out_s)], env=env, timeout=60)
        assert send.returncode == 0
        s = json.loads(out_s.read_text())
        assert s["error"] is None and s["bundles"] == 3
        try:
            recv.wait(timeout=60)
        finally:
            if recv.poll() is None:
                recv.terminate()
                recv.wait()
        r = json.loads(out_r.read_text())
        logs = "\n".join((tmp_path / f"dtnd-{i}.log").read_text(errors="replace")[-1500:]
                         for i in range(3))
        assert r["complete"], logs
        assert r["bytes"] == size and r["bundles"] == 3 and r["bad"] == 0 and r["dups"] == 0
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


needs_root = pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                                reason="needs root (CI runs as root)")



@needs_root
@needs_dtnd
@pytest.mark.usefixtures("medium_server")
def test_emulated_dtn_three_node_chain(tmp_path, run_waiting):
    size = 200_000
    sp = spec.from_dict({
        "name": "pytest-dtn", "duration": 60,
        "topology": {"kind": "chain", "nodes": 3},
        # two flows to one destination: each must get exactly its own bundles
        "flow": [{"driver": "dtn", "src": 0, "dst": 2, "size": size, "label": "d"},
                 {"driver": "dtn", "src": 1, "dst": 2, "size": size // 2, "label": "e"}],
    })
    res = run_waiting(sp, tmp_path / "out")
    f, e = res["flows"]
    assert f["hops"] == 2 and e["hops"] == 1
    assert f["complete"] and f["bytes"] == size and f["bad_bundles"] == 0
    assert e["complete"] and e["bytes"] == size // 2 and e["bad_bundles"] == 0
    assert f["dup_bundles"] == 0  # the janitor is off: no bundle is forwarded twice
    assert f["goodput_mbps"] > 0
    assert lab.lab_namespaces() == [] and lab.lab_links() == []
