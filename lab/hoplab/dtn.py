"""DTN baseline (Hop §5: DTN2.5 there; here dtn7 0.21.0, crates.io): a bundle daemon
`dtnd` in every node namespace on the flows' paths, TCP convergence layer (TCPCLv4) between
radio neighbours and static routing derived from the lab's route table.

Per node i: node id `dtn://n<i>/`, web/API port `WEB_PORT` on the namespace's loopback,
TCP CLA on `CLA_PORT`, one static peer `tcp://<ip>:CLA_PORT/n<j>` per next hop j it uses,
and a routes file with one line per destination d: `<k> ** dtn://n<d>/** dtn://n<next hop>/`.
Neighbour discovery is off (the lab's routes decide; beacons would only add traffic).

A flow of N bytes is cut into bundles of at most `BUNDLE_BYTES` and posted to the source
daemon's `/send` API; the destination client registers endpoint `f<flow index>`, polls
`/endpoint?f<flow index>` and decodes the
bundles. Each payload starts with a header (magic, offset) and carries a known byte pattern,
so the receiver counts unique bytes and checks content.

    python -m hoplab.dtn send --dst EID --size N [--bundle B] [--port P] --out F
    python -m hoplab.dtn recv --endpoint incoming --size N [--port P] --out F
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import struct
import sys
import time
from pathlib import Path

from .errors import LabError

WEB_PORT = 3000
"""dtnd's HTTP API port (its default), on each namespace's loopback."""
CLA_PORT = 4556
"""TCP convergence layer port (TCPCLv4's registered port, RFC 9174)."""
BUNDLE_BYTES = 1 << 20
"""Largest bundle payload. dtnd's HTTP API rejects request bodies over 2 MB (its web
framework's default limit: why posting a 10 MB file in one bundle fails), so larger files
are sent as several bundles of 1 MiB, the order of Hop's block size (Hop §3)."""
LIFETIME = "1h"
POLL_S = 0.02
"""Receiver poll interval of the destination's endpoint (adds at most this to the last-byte time)."""
HDR = struct.Struct("!IQ")
MAGIC = 0x484C4454
PATTERN = bytes(range(251)) * (((BUNDLE_BYTES + 2 * 251) // 251) + 1)


def chunk_bytes(offset: int, n: int) -> bytes:
    """The payload bytes of [offset, offset + n) of a flow: a 251-periodic pattern."""
    k = offset % 251
    return PATTERN[k:k + n]


# ---- minimal CBOR (RFC 8949) decoding, enough for BPv7 bundles (RFC 9171) -----------------

class CborError(ValueError):
    pass


def _cbor(b: bytes, i: int):
    if i >= len(b):
        raise CborError("truncated")
    ib = b[i]
    major, info = ib >> 5, ib & 0x1F
    i += 1
    if major == 7 and info == 31:
        return _BREAK, i
    if info < 24:
        arg = info
    elif info in (24, 25, 26, 27):
        n = 1 << (info - 24)
        if i + n > len(b):
            raise CborError("truncated")
        arg = int.from_bytes(b[i:i + n], "big")
        i += n
    elif info == 31:
        arg = None
    else:
        raise CborError(f"reserved additional info {info}")
    if major == 0:
        return arg, i
    if major == 1:
        return -1 - arg, i
    if major in (2, 3):
        if arg is None:
            parts = []
            while True:
                v, i = _cbor(b, i)
                if v is _BREAK:
                    break
                parts.append(v)
            return (b"" if major == 2 else "").join(parts), i
        if i + arg > len(b):
            raise CborError("truncated")
        raw = b[i:i + arg]
        return (bytes(raw) if major == 2 else raw.decode("utf-8", "replace")), i + arg
    if major == 4:
        out = []
        while arg is None or len(out) < arg:
            v, i = _cbor(b, i)
            if v is _BREAK:
                if arg is not None:
                    raise CborError("unexpected break")
                break
            out.append(v)
        return out, i
    if major == 5:
        d = {}
        while arg is None or len(d) < arg:
            k, i = _cbor(b, i)
            if k is _BREAK:
                break
            v, i = _cbor(b, i)
            d[k if not isinstance(k, list) else tuple(k)] = v
        return d, i
    if major == 6:
        return _cbor(b, i)
    return arg, i  # simple values and floats: not needed for the payload


_BREAK = object()


def bundle_payload(raw: bytes) -> bytes:
    """The payload block's data (canonical block type 1) of a CBOR-encoded BPv7 bundle."""
    blocks, _ = _cbor(raw, 0)
    if not isinstance(blocks, list):
        raise CborError("bundle is not an array")
    for blk in blocks[1:]:
        if isinstance(blk, list) and len(blk) >= 5 and blk[0] == 1 and isinstance(blk[4], bytes):
            return blk[4]
    raise CborError("no payload block")


# ---- clients run in the node namespaces -----------------------------------------------------

def _write(path: str, obj: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


class _Stop(Exception):
    pass


def _on_term(_sig, _frm):
    raise _Stop()


def _request(port: int, method: str, path: str, body: bytes | None = None,
             timeout: float = 60.0) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body,
                  headers={"Content-Type": "application/octet-stream"} if body is not None else {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def wait_api(port: int, deadline: float) -> None:
    while True:
        try:
            st, _ = _request(port, "GET", "/status/nodeid", timeout=2)
            if st == 200:
                return
        except OSError:
            pass
        if time.time() > deadline:
            raise LabError(f"dtnd API on 127.0.0.1:{port} not answering")
        time.sleep(0.1)


def send_main(a) -> int:
    res = {"kind": "dtn-send", "start": None, "end": None, "bundles": 0, "sent": 0, "error": None}
    try:
        wait_api(a.port, time.time() + 30)
        res["start"] = time.time()
        off = 0
        while off < a.size:
            n = min(a.bundle - HDR.size, a.size - off)
            body = HDR.pack(MAGIC, off) + chunk_bytes(off, n)
            st, text = _request(a.port, "POST", f"/send?dst={a.dst}&lifetime={LIFETIME}", body)
            if st != 200:
                raise LabError(f"dtnd refused bundle at offset {off}: {st} {text[:200]!r}")
            off += n
            res["bundles"] += 1
            res["sent"] = off
    except _Stop:
        res["error"] = "stopped"
    except (OSError, LabError) as e:
        res["error"] = str(e)
    finally:
        res["end"] = time.time()
        _write(a.out, res)
    return 0


def recv_main(a) -> int:
    res = {"kind": "dtn-recv", "bytes": 0, "bundles": 0, "dups": 0, "bad": 0, "first": None,
           "last": None, "complete": False, "error": None}
    seen: set[int] = set()
    last_write = 0.0
    try:
        wait_api(a.port, time.time() + 60)
        st, text = _request(a.port, "GET", f"/register?{a.endpoint}")
        if st != 200:
            raise LabError(f"cannot register endpoint {a.endpoint}: {st} {text[:200]!r}")
        print("ready", flush=True)
        while res["bytes"] < a.size:
            st, raw = _request(a.port, "GET", f"/endpoint?{a.endpoint}")
            if st != 200 or raw == b"Nothing to receive" or len(raw) < 16:
                if st == 404:  # endpoint not registered yet
                    _request(a.port, "GET", f"/register?{a.endpoint}")
                time.sleep(POLL_S)
                continue
            now = time.time()
            try:
                data = bundle_payload(raw)
                magic, off = HDR.unpack_from(data)
                if magic != MAGIC:
                    raise CborError("bad magic")
            except (CborError, struct.error):
                res["bad"] += 1
                continue
            body = data[HDR.size:]
            if body != chunk_bytes(off, len(body)):
                res["bad"] += 1
                continue
            if off in seen:
                res["dups"] += 1
                continue
            seen.add(off)
            res["bundles"] += 1
            res["bytes"] += len(body)
            res["first"] = res["first"] or now
            res["last"] = now
            if now - last_write >= 1.0:
                last_write = now
                _write(a.out, res)
        res["complete"] = True
    except _Stop:
        pass
    except (OSError, LabError) as e:
        res["error"] = str(e)
    finally:
        _write(a.out, res)
    return 0


# ---- dtnd configuration and the lab driver --------------------------------------------------

def dtnd_binary() -> str:
    root = Path(__file__).resolve().parents[2]
    for cand in (root / ".tools" / "dtn7" / "bin" / "dtnd", shutil.which("dtnd")):
        if cand and Path(cand).exists():
            return str(cand)
    raise LabError("dtnd not found: run scripts/setup-dtn7.sh (installs dtn7 0.21.0 into .tools/dtn7)")


def routes_text(node: int, next_hops: dict[int, int]) -> str:
    """dtn7 static routes: `idx source-glob destination-glob via-node-eid`. The globs
    need `**`: a single `*` does not match across `/`, so `*` as source never matches an
    EID like `dtn://n0/` (the route is then silently unused: "No route found")."""
    lines = [f"{k} ** dtn://n{d}/** dtn://n{nh}/" for k, (d, nh) in enumerate(sorted(next_hops.items()), 1)]
    return "\n".join(lines) + "\n"


JANITOR = "0"
"""dtnd's janitor re-dispatches every bundle still pending forwarding, including one whose
transfer is in progress: with a 1 s period each 1 MiB bundle (1.4-5 s per emulated hop) was
sent two or three times. Off by default ("0"); then a bundle whose transfer fails is not
retried. options.janitor (e.g. "30s") turns it on for disruption experiments."""


def dtnd_args(node: int, workdir: Path, routes_file: Path, peers: dict[int, str],
              web_port: int = WEB_PORT, cla_port: int = CLA_PORT, endpoint: str = "incoming",
              janitor: str = JANITOR, debug: bool = False) -> list[str]:
    """Command line of one dtnd. `peers` maps neighbour node -> "ip:cla_port"."""
    args = ["-4", "-n", f"n{node}", "-W", str(workdir), "-w", str(web_port), "-D", "mem",
            "-C", f"tcp:port={cla_port}", "-r", "static", "-R", f"static.routes={routes_file}",
            "--disable_nd", "-i", "0", "-j", janitor, "-e", endpoint]
    for j, addr in sorted(peers.items()):
        args += ["-s", f"tcp://{addr}/n{j}"]
    if debug:
        args.append("-d")
    return args


class _DriverDefaults:
    """Falls back to hoplab.drivers.Driver for every attribute this driver does not define
    (e.g. `done_when`), so it follows the lab's Driver interface without importing
    hoplab.drivers at module load (drivers.py imports this module to register it)."""

    def __getattr__(self, name):
        from . import drivers

        attr = getattr(drivers.Driver, name)
        return attr.__get__(self) if callable(attr) else attr


class DtnDriver(_DriverDefaults):
    """dtn7 bundles over the lab's routes (Hop §5's DTN baseline). Sized transfers only.
    options.bundle sets the bundle size (bytes, <= BUNDLE_BYTES), options.janitor dtnd's
    janitor period (see JANITOR)."""

    name = "dtn"
    done_when = "receiver"  # the sender returns once its daemon took the bundles

    def prepare(self, lab, flows) -> None:
        binary = dtnd_binary()
        janitor = str(next((f.options["janitor"] for f in flows if "janitor" in f.options), JANITOR))
        for f in flows:
            if f.size is None:
                raise LabError("the dtn driver transfers files: give every dtn flow a size")
        for node in range(lab.spec.topology.n):
            d = lab.work / f"dtnd-{node}"
            d.mkdir(parents=True, exist_ok=True)
            routes = d / "routes.txt"
            routes.write_text(routes_text(node, dict(lab.table[node])))
            peers = {nh: f"{lab.ip(nh)}:{CLA_PORT}" for nh in set(lab.table[node].values())}
            lab.spawn_cmd(node, [binary, *dtnd_args(node, d, routes, peers, janitor=janitor)],
                          f"dtnd-{node}")
        time.sleep(1.0)

    @staticmethod
    def endpoint(idx: int) -> str:
        """Each flow has its own endpoint at its destination, so flows to one node do not
        take each other's bundles."""
        return f"f{idx}"

    def start_receiver(self, lab, flow, idx):
        lab.spawn(flow.dst, ["recv", "--endpoint", self.endpoint(idx), "--size", str(flow.size),
                             "--out", str(lab.flow_file(idx, "recv"))], f"f{idx}-recv",
                  module="hoplab.dtn")

    def start_sender(self, lab, flow, idx):
        b = int(flow.options.get("bundle", BUNDLE_BYTES))
        if not HDR.size < b <= BUNDLE_BYTES:
            raise LabError(f"dtn bundle size must be in ({HDR.size}, {BUNDLE_BYTES}]")
        lab.spawn(flow.src, ["send", "--dst", f"dtn://n{flow.dst}/{self.endpoint(idx)}",
                             "--size", str(flow.size),
                             "--bundle", str(b), "--out", str(lab.flow_file(idx, "send"))],
                  f"f{idx}-send", module="hoplab.dtn")

    def progress(self, lab, flow, idx) -> int:
        return int(_load(lab.flow_file(idx, "recv")).get("bytes", 0))

    def result(self, lab, flow, idx):
        r, s = _load(lab.flow_file(idx, "recv")), _load(lab.flow_file(idx, "send"))
        return {"bytes": r.get("bytes", 0), "start": s.get("start"), "first": r.get("first"),
                "last": r.get("last"), "complete": bool(r.get("complete")),
                "bundles": r.get("bundles", 0), "bad_bundles": r.get("bad", 0),
                "dup_bundles": r.get("dups", 0), "sender_error": s.get("error"),
                "receiver_error": r.get("error")}


def _load(path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hoplab.dtn")
    p.add_argument("mode", choices=["send", "recv"])
    p.add_argument("--port", type=int, default=WEB_PORT)
    p.add_argument("--dst", default="")
    p.add_argument("--endpoint", default="incoming")
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--bundle", type=int, default=BUNDLE_BYTES)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    return send_main(a) if a.mode == "send" else recv_main(a)


if __name__ == "__main__":
    sys.exit(main())
