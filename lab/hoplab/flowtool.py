"""Small traffic sender/receiver run inside the node namespaces.

    python -m hoplab.flowtool tcp-recv --port P --out F
    python -m hoplab.flowtool tcp-send --dst IP --port P (--size N | --duration S) [--cc cubic] [--mss N]
    python -m hoplab.flowtool udp-recv --port P --out F
    python -m hoplab.flowtool udp-send --dst IP --port P (--size N | --duration S) --rate BPS --payload B

Receivers write JSON on end of stream or SIGTERM: unique bytes, first/last byte
times (wall clock; all namespaces share one clock), and for UDP per-packet
sequence/delay statistics. Senders write their start/end times.
"""

from __future__ import annotations

import argparse
import errno
import json
import signal
import socket
import struct
import sys
import time

UDP_HDR = struct.Struct("!IId")  # magic, seq, send time
UDP_MAGIC = 0x484C4142
CHUNK = 64 * 1024
TOS = {"be": 0x00, "ef": 0xB8, "cs1": 0x20}


class Stop(Exception):
    pass


def _on_term(_sig, _frm):
    raise Stop()


def _write(path: str, obj: dict) -> None:
    """The tool's result, written once at its end. The lab stops a run with SIGTERM to the
    senders and, half a second later, to every process: a second signal arriving while the
    result is written must not leave it half-written (the run would lose the flow's start)."""
    import os

    before = [signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGINT)]
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(obj, f)
        os.replace(path + ".tmp", path)
    finally:
        for s, h in zip((signal.SIGTERM, signal.SIGINT), before):
            signal.signal(s, h)


def tcp_recv(a) -> int:
    res = {"kind": "tcp-recv", "bytes": 0, "first": None, "last": None, "complete": False}
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if a.mss:
        # inherited by the accepted connection: the MSS this end announces
        srv.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, a.mss)
    srv.bind((a.listen, a.port))
    srv.listen(1)
    print("ready", flush=True)
    try:
        conn, _ = srv.accept()
        res["accepted"] = time.time()
        last_write = 0.0
        buf = bytearray(CHUNK)
        while True:
            n = conn.recv_into(buf)
            if n == 0:
                res["complete"] = True
                break
            now = time.time()
            if res["first"] is None:
                res["first"] = now
            res["last"] = now
            res["bytes"] += n
            if now - last_write >= 1.0:
                last_write = now
                _write(a.out, res)
    except Stop:
        pass
    finally:
        _write(a.out, res)
    return 0


def _tcp_socket(a) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, a.cc.encode())
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, TOS[a.tos])
    if a.mss:
        # before connect: Linux then neither announces nor sends segments above it
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, a.mss)
    return s


def tcp_send(a) -> int:
    res = {"kind": "tcp-send", "start": time.time(), "sent": 0, "end": None, "error": None}
    s = None
    try:
        s = _tcp_socket(a)
        for attempt in range(100):
            try:
                s.connect((a.dst, a.port))
                break
            except OSError as e:
                # Refused: the receiver is not listening yet. Unreachable: a routing daemon
                # is rewriting the kernel table (Babel drops a dead relay's routes about 45 s
                # after it went down). Either passes within the 5 s of retries; the time is
                # charged to the flow, whose goodput counts from `start`.
                transient = isinstance(e, ConnectionRefusedError) or e.errno in (
                    errno.ENETUNREACH, errno.EHOSTUNREACH)
                if not transient or attempt == 99:
                    raise
                time.sleep(0.05)
                s.close()
                s = _tcp_socket(a)
        res["connected"] = time.time()
        if a.mss:
            res["mss"] = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
        data = b"\x5a" * CHUNK
        deadline = res["start"] + a.duration if a.duration else None
        remaining = a.size
        while True:
            if remaining is not None and remaining <= 0:
                break
            if deadline is not None and time.time() >= deadline:
                break
            n = CHUNK if remaining is None else min(CHUNK, remaining)
            sent = s.send(data[:n])
            res["sent"] += sent
            if remaining is not None:
                remaining -= sent
        s.shutdown(socket.SHUT_WR)
        # wait for the receiver to close so "end" means delivered
        s.settimeout(600)
        while s.recv(4096):
            pass
    except Stop:
        res["error"] = "stopped"
    except OSError as e:
        res["error"] = str(e)
    finally:
        res["end"] = time.time()
        if s is not None:
            s.close()
        _write(a.out, res)
    return 0


def udp_recv(a) -> int:
    res = {"kind": "udp-recv", "bytes": 0, "packets": 0, "dups": 0, "first": None, "last": None,
           "max_seq": -1, "delays_ms": [], "seqs": [], "send_ts": []}
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind((a.listen, a.port))
    print("ready", flush=True)
    seen: set[int] = set()
    keep = a.keep_seqs
    last_write = 0.0
    try:
        while True:
            data = s.recv(65536)
            now = time.time()
            if len(data) < UDP_HDR.size:
                continue
            magic, seq, ts = UDP_HDR.unpack_from(data)
            if magic != UDP_MAGIC:
                continue
            if seq == 0xFFFFFFFF:  # end marker
                continue
            if seq in seen:
                res["dups"] += 1
                continue
            seen.add(seq)
            if res["first"] is None:
                res["first"] = now
            res["last"] = now
            res["bytes"] += len(data)
            res["packets"] += 1
            res["max_seq"] = max(res["max_seq"], seq)
            if now - last_write >= 1.0 and not keep:
                last_write = now
                _write(a.out, res)
            if keep:
                res["seqs"].append(seq)
                res["delays_ms"].append((now - ts) * 1e3)
                res["send_ts"].append(ts)
    except Stop:
        pass
    finally:
        _write(a.out, res)
    return 0


def udp_send(a) -> int:
    res = {"kind": "udp-send", "start": time.time(), "sent_packets": 0, "sent_bytes": 0, "end": None}
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, TOS[a.tos])
    payload = max(a.payload, UDP_HDR.size)
    pad = b"\x00" * (payload - UDP_HDR.size)
    interval = payload * 8.0 / a.rate
    deadline = res["start"] + a.duration if a.duration else None
    total = a.size
    seq = 0
    t_next = time.time()
    try:
        while True:
            if total is not None and res["sent_bytes"] >= total:
                break
            if deadline is not None and time.time() >= deadline:
                break
            now = time.time()
            if now < t_next:
                time.sleep(min(t_next - now, 0.05))
                continue
            try:
                s.sendto(UDP_HDR.pack(UDP_MAGIC, seq, time.time()) + pad, (a.dst, a.port))
                res["sent_packets"] += 1
                res["sent_bytes"] += payload
            except OSError:
                res["send_errors"] = res.get("send_errors", 0) + 1
            seq += 1
            t_next += interval
            if t_next < now - 0.2:  # do not burst to catch up after a stall
                t_next = now
        for _ in range(3):
            s.sendto(UDP_HDR.pack(UDP_MAGIC, 0xFFFFFFFF, time.time()), (a.dst, a.port))
    except Stop:
        pass
    finally:
        res["end"] = time.time()
        res["packets"] = seq
        _write(a.out, res)
    return 0


def exec_cmd(a) -> int:
    """Run a command, recording its start/end times, exit code and the last line of output
    (used for daemons' command-line clients, e.g. `hop send`)."""
    import subprocess

    res = {"kind": "exec", "start": time.time(), "end": None, "rc": None, "stdout": ""}
    child = None
    try:
        child = subprocess.Popen(a.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = child.communicate()
        res["rc"] = child.returncode
        res["stdout"] = out[-4000:]
    except Stop:
        # Stopping: a repeated signal must not cut short the child's exit or the result.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                out, _ = child.communicate(timeout=3)
                res["stdout"] = (out or "")[-4000:]
            except subprocess.TimeoutExpired:
                child.kill()
        res["error"] = "stopped"
    except OSError as e:
        res["error"] = str(e)
    finally:
        res["end"] = time.time()
        _write(a.out, res)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hoplab.flowtool")
    p.add_argument("mode", choices=["tcp-recv", "tcp-send", "udp-recv", "udp-send", "exec"])
    p.add_argument("--dst", default="")
    p.add_argument("--listen", default="0.0.0.0", help="receivers: address to listen on")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--size", type=int, default=None)
    p.add_argument("--duration", type=float, default=None)
    p.add_argument("--rate", type=float, default=8e6)
    p.add_argument("--payload", type=int, default=1470)
    p.add_argument("--cc", default="cubic")
    p.add_argument("--mss", type=int, default=None, help="TCP segment size (TCP_MAXSEG), both ends")
    p.add_argument("--tos", default="be", choices=sorted(TOS))
    p.add_argument("--keep-seqs", action="store_true")
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, cmd = argv[:cut], argv[cut + 1:]
    a = p.parse_args(argv)
    a.cmd = cmd
    if a.mode == "exec" and not cmd:
        p.error("exec needs a command after --")
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    modes = {"tcp-recv": tcp_recv, "tcp-send": tcp_send, "udp-recv": udp_recv, "udp-send": udp_send,
             "exec": exec_cmd}
    return modes[a.mode](a)


if __name__ == "__main__":
    sys.exit(main())
