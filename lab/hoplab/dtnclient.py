"""The DTN baseline's clients, run in the node namespaces (the lab side, dtnd's
configuration and the driver, is hoplab.drivers.dtn): they post a flow's bundles to the
source's dtnd and collect them from the destination's, through dtnd's web API on the
namespace's loopback (port `WEB_PORT`).

A flow of N bytes is cut into bundles of at most `BUNDLE_BYTES` and posted to the source
daemon's `/send` API; the destination client registers endpoint `f<flow index>`, polls
`/endpoint?f<flow index>` and decodes the
bundles. Each payload starts with a header (magic, offset) and carries a known byte pattern,
so the receiver counts unique bytes and checks content.

    python -m hoplab.dtnclient send --dst EID --size N [--bundle B] [--port P] --out F
    python -m hoplab.dtnclient recv --endpoint incoming --size N [--port P] --out F
    python -m hoplab.dtnclient ready [--port P] [--timeout S]   # exit 0 once dtnd's API answers
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import struct
import sys
import time

from .errors import LabError


WEB_PORT = 3000
"""dtnd's HTTP API port (its default), on each namespace's loopback."""
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


def ready_main(a) -> int:
    """Exit 0 once dtnd's API answers, 1 when it has not within --timeout seconds: run in a
    node's namespace, whose loopback the orchestrator cannot reach."""
    try:
        wait_api(a.port, time.time() + a.timeout)
    except LabError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hoplab.dtnclient")
    p.add_argument("mode", choices=["send", "recv", "ready"])
    p.add_argument("--port", type=int, default=WEB_PORT)
    p.add_argument("--dst", default="")
    p.add_argument("--endpoint", default="incoming")
    p.add_argument("--size", type=int)
    p.add_argument("--bundle", type=int, default=BUNDLE_BYTES)
    p.add_argument("--out")
    p.add_argument("--timeout", type=float, default=30.0)
    a = p.parse_args(argv)
    if a.mode == "ready":
        return ready_main(a)
    if a.size is None or a.out is None:
        p.error(f"{a.mode} needs --size and --out")
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    return send_main(a) if a.mode == "send" else recv_main(a)


if __name__ == "__main__":
    sys.exit(main())
