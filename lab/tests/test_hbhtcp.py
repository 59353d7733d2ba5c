"""Hop-by-hop TCP relay: bytes arrive intact through a chain of relays on loopback, and a
stalled receiver stops the relays (bounded buffering) and, through them, the sender."""

import hashlib
import os
import socket
import threading
import time

import pytest

from hoplab import hbhrelay, lab, spec
from hoplab.drivers import hbhtcp
from hoplab.errors import LabError


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


def chain(n_relays, sockbuf=hbhrelay.RELAY_SOCKBUF):
    """Receiver listener + n relays on loopback; returns (listener, relays, first port)."""
    ports = free_ports(n_relays + 1)
    rx = socket.socket()
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
    rx.bind(("127.0.0.1", ports[-1]))
    rx.listen(1)
    relays = []
    for i in range(n_relays):
        spec_ = hbhrelay.RelaySpec(flow=0, listen_port=ports[i], next_ip="127.0.0.1",
                                 next_port=ports[i + 1], listen_ip="127.0.0.1")
        relays.append(hbhrelay.Relay(spec_, sockbuf))
    for r in reversed(relays):
        threading.Thread(target=r.run, kwargs={"connect_timeout": 10}, daemon=True).start()
    return rx, relays, ports[0]


def test_bytes_arrive_identical_through_two_relays():
    data = os.urandom(3 * 1024 * 1024 + 12345)
    rx, relays, first = chain(2)
    got = bytearray()

    def receive():
        conn, _ = rx.accept()
        conn.settimeout(30)
        while chunk := conn.recv(65536):
            got.extend(chunk)
        conn.close()

    t = threading.Thread(target=receive, daemon=True)
    t.start()
    s = socket.create_connection(("127.0.0.1", first), timeout=30)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    assert s.recv(1) == b""  # the close propagates back once the receiver has everything
    s.close()
    t.join(30)
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    for r in relays:
        deadline = time.time() + 5
        while not r.done and time.time() < deadline:
            time.sleep(0.01)
        assert r.error is None
        assert r.bytes_in == r.bytes_out == len(data)
        assert r.max_user_buffered <= hbhrelay.CHUNK


def test_stalled_receiver_backpressures_through_relays():
    total = 32 * 1024 * 1024
    data = os.urandom(1 << 20)
    rx, relays, first = chain(2)
    conn_box = []
    accepted = threading.Event()

    def accept():
        conn, _ = rx.accept()
        conn_box.append(conn)
        accepted.set()

    threading.Thread(target=accept, daemon=True).start()
    s = socket.create_connection(("127.0.0.1", first), timeout=30)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    sent = [0]
    done = threading.Event()

    def send():
        try:
            while sent[0] < total:
                off = sent[0] % len(data)
                k = s.send(data[off: min(len(data), off + total - sent[0])])
                sent[0] += k
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        done.set()

    threading.Thread(target=send, daemon=True).start()
    assert accepted.wait(10)
    # the receiver reads nothing: wait until the sender is blocked
    last, still = -1, 0
    while still < 10:
        time.sleep(0.1)
        still = still + 1 if sent[0] == last else 0
        last = sent[0]
    assert not done.is_set()
    conn = conn_box[0]
    rx_buf = conn.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    a, b = relays
    # What a relay has read is bounded by what the stalled downstream can hold. The
    # kernel checks a socket's limit before queueing a segment, so each socket may
    # exceed its limit by one segment (up to 64 KiB on loopback): SLACK per socket.
    slack = 64 * 1024
    assert b.bytes_in <= rx_buf + b.effective_sndbuf + 2 * slack + hbhrelay.CHUNK
    assert a.bytes_in <= (b.bytes_in + b.effective_rcvbuf + a.effective_sndbuf + 2 * slack
                          + hbhrelay.CHUNK)
    sender_buf = s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    assert sent[0] <= a.bytes_in + a.effective_rcvbuf + sender_buf + 2 * slack
    assert sent[0] < total // 8
    for r in relays:
        assert r.max_user_buffered <= hbhrelay.CHUNK
        assert r.max_kernel_queued <= r.effective_rcvbuf + r.effective_sndbuf + 2 * slack
    # resume: everything arrives, in order
    h = hashlib.sha256()
    n = 0
    conn.settimeout(60)
    while chunk := conn.recv(1 << 16):
        h.update(chunk)
        n += len(chunk)
    conn.close()
    assert done.wait(10)
    s.close()
    ref = hashlib.sha256()
    for i in range(0, total, len(data)):
        ref.update(data[: min(len(data), total - i)])
    assert n == total and h.digest() == ref.digest()


def test_relay_reports_unreachable_next_hop():
    (port, dead) = free_ports(2)
    r = hbhrelay.Relay(hbhrelay.RelaySpec(flow=3, listen_port=port, next_ip="127.0.0.1", next_port=dead,
                                      listen_ip="127.0.0.1"))
    r.run(connect_timeout=0.3)
    assert r.done and r.error and "next hop" in r.error


def test_driver_interface():
    from hoplab.drivers import DRIVERS, Driver

    d = DRIVERS["hbhtcp"]()
    assert d.done_when == Driver.done_when == "sender"  # the sender ends when the receiver closed


def test_flow_path_follows_table():
    table = [{1: 1, 2: 1, 3: 1}, {0: 0, 2: 2, 3: 2}, {0: 1, 1: 1, 3: 3}, {0: 2, 1: 2, 2: 2}]
    assert hbhtcp.flow_path(table, 0, 3) == [0, 1, 2, 3]
    assert hbhtcp.flow_path(table, 3, 1) == [3, 2, 1]
    with pytest.raises(LabError):
        hbhtcp.flow_path([{1: 1}, {0: 0}, {}], 0, 2)


needs_root = pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                                reason="needs root (CI runs as root)")



@needs_root
@pytest.mark.usefixtures("medium_server")
def test_emulated_hbhtcp_three_node_chain(tmp_path, run_waiting):
    size = 200_000
    sp = spec.from_dict({
        "name": "pytest-hbhtcp", "duration": 60,
        "topology": {"kind": "chain", "nodes": 3},
        "flow": [{"driver": "hbhtcp", "src": 0, "dst": 2, "size": size, "label": "h"}],
    })
    res = run_waiting(sp, tmp_path / "out")
    f = res["flows"][0]
    assert f["hops"] == 2
    assert f["complete"] and f["bytes"] == size
    assert f["goodput_mbps"] > 0
    assert [r["node"] for r in f["relays"]] == [1]
    assert f["relays"][0]["bytes_out"] == size and f["relays"][0]["error"] is None
    assert lab.lab_namespaces() == [] and lab.lab_links() == []
