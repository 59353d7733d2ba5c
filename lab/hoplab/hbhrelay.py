"""Hop-by-hop TCP (Hop §5): a multi-hop flow split into one-hop kernel TCP connections.

Every relay on a flow's path keeps one incoming and one outgoing TCP socket per flow
and copies bytes from the first to the second with blocking calls through one small
buffer. When the outgoing socket's send buffer is full, `sendall` blocks, the relay
stops reading, the incoming socket's receive buffer fills and TCP flow control closes
the previous hop's window: backpressure travels hop by hop back to the source.
There is no userspace queue: at most `CHUNK` bytes sit in the relay process per flow.

    python -m hoplab.hbhrelay relay --config FILE --out FILE

runs one relay process per node; the config lists the flows crossing the node
(listen port, next hop address and port, congestion control). The driver `HbhTcpDriver`
(hoplab.drivers.hbhtcp) starts the relays in `prepare`, the lab's TCP receiver at the
destination and the lab's TCP sender at the source, connected to the first relay.

Socket buffers (`RELAY_SOCKBUF`, per direction and flow): 64 KiB requested with
SO_RCVBUF on the incoming and SO_SNDBUF on the outgoing socket (Linux doubles the value
for its bookkeeping and turns off autotuning for that socket). One hop of the emulated
802.11b path carries about 5 Mbit/s with a round trip of a few ms to ~20 ms under load,
a bandwidth-delay product of about 12 KB, so 64 KiB keeps every hop busy while bounding
what a relay holds per flow to about 2 x 128 KiB of kernel memory. Autotuned buffers
(up to tcp_rmem/tcp_wmem max, several MB) would hide the backpressure the paper studies:
a relay would absorb seconds of traffic before the previous hop noticed a stall.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass

from .errors import LabError


CHUNK = 16 * 1024
"""Bytes one relay copies per read: the only userspace buffering per flow."""
RELAY_SOCKBUF = 64 * 1024
"""SO_RCVBUF / SO_SNDBUF requested on the relay's sockets (see the module docstring)."""
CONNECT_TIMEOUT_S = 30.0
SIOCINQ = 0x541B  # FIONREAD: bytes queued in a TCP socket's receive buffer
SIOCOUTQ = 0x5411  # TIOCOUTQ: bytes not yet acknowledged in a TCP socket's send buffer


@dataclass
class RelaySpec:
    """One flow through one relay: accept on `listen_port`, forward to `next_ip:next_port`."""

    flow: int
    listen_port: int
    next_ip: str
    next_port: int
    cc: str = "cubic"
    listen_ip: str = "0.0.0.0"


def _queued(sock: socket.socket, req: int) -> int:
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), req, b"\0\0\0\0"))[0]
    except OSError:
        return 0


class Relay:
    """Relays one flow. `bytes_in`/`bytes_out` count what was read and written; at
    any time `bytes_in - bytes_out <= CHUNK`. `max_kernel_queued` is the largest sum
    of unread incoming and unacknowledged outgoing bytes seen at a read."""

    def __init__(self, spec: RelaySpec, sockbuf: int = RELAY_SOCKBUF):
        self.spec = spec
        self.sockbuf = sockbuf
        self.bytes_in = 0
        self.bytes_out = 0
        self.max_user_buffered = 0
        self.max_kernel_queued = 0
        self.first: float | None = None
        self.last: float | None = None
        self.effective_rcvbuf: int | None = None
        self.effective_sndbuf: int | None = None
        self.error: str | None = None
        self.done = False
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # set before listen so accepted sockets inherit it and the window scale matches
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockbuf)
        self.listener.bind((spec.listen_ip, spec.listen_port))
        self.listener.listen(1)

    def _connect_next(self, deadline: float) -> socket.socket:
        while True:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.sockbuf)
            try:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, self.spec.cc.encode())
                s.connect((self.spec.next_ip, self.spec.next_port))
                return s
            except (ConnectionRefusedError, TimeoutError, OSError) as e:
                s.close()
                if time.time() >= deadline:
                    raise LabError(f"flow {self.spec.flow}: cannot connect to next hop "
                                   f"{self.spec.next_ip}:{self.spec.next_port}: {e}") from e
                time.sleep(0.05)

    def run(self, connect_timeout: float = CONNECT_TIMEOUT_S) -> None:
        """Connect to the next hop first (so the chain exists before the sender starts and
        connection setup is not part of the transfer), then accept and copy until EOF;
        then half-close downstream, wait for the next hop to close and close upstream, so
        the sender sees the end only when the receiver has everything."""
        down = up = None
        try:
            down = self._connect_next(time.time() + connect_timeout)
            self.effective_sndbuf = down.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            up, _ = self.listener.accept()
            self.effective_rcvbuf = up.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
            buf = bytearray(CHUNK)
            view = memoryview(buf)
            while True:
                n = up.recv_into(buf)
                if n == 0:
                    break
                now = time.time()
                if self.first is None:
                    self.first = now
                self.last = now
                self.bytes_in += n
                self.max_user_buffered = max(self.max_user_buffered, self.bytes_in - self.bytes_out)
                q = _queued(up, SIOCINQ) + _queued(down, SIOCOUTQ)
                self.max_kernel_queued = max(self.max_kernel_queued, q)
                down.sendall(view[:n])  # blocks while the next hop's window is closed
                self.bytes_out += n
            down.shutdown(socket.SHUT_WR)
            down.settimeout(600)
            while down.recv(4096):
                pass
        except OSError as e:
            self.error = str(e)
        except LabError as e:
            self.error = str(e)
        finally:
            for s in (up, down, self.listener):
                if s is not None:
                    s.close()
            self.done = True

    def stats(self) -> dict:
        return {"flow": self.spec.flow, "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
                "max_user_buffered": self.max_user_buffered,
                "max_kernel_queued": self.max_kernel_queued, "first": self.first,
                "last": self.last, "requested_sockbuf": self.sockbuf,
                "effective_rcvbuf": self.effective_rcvbuf,
                "effective_sndbuf": self.effective_sndbuf, "error": self.error,
                "done": self.done}


def _write(path: str, obj) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


class _Stop(Exception):
    pass


def _on_term(_sig, _frm):
    raise _Stop()


def relay_main(a) -> int:
    cfg = json.loads(open(a.config).read())
    sockbuf = int(cfg.get("sockbuf", RELAY_SOCKBUF))
    relays = [Relay(RelaySpec(**r), sockbuf) for r in cfg["relays"]]
    threads = [threading.Thread(target=r.run, daemon=True) for r in relays]
    for t in threads:
        t.start()
    print("ready", flush=True)
    try:
        while not all(r.done for r in relays):
            _write(a.out, {"relays": [r.stats() for r in relays]})
            time.sleep(1.0)
    except _Stop:
        pass
    finally:
        _write(a.out, {"relays": [r.stats() for r in relays]})
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hoplab.hbhrelay")
    p.add_argument("mode", choices=["relay"])
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    return relay_main(a)


if __name__ == "__main__":
    sys.exit(main())
