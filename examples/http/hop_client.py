#!/usr/bin/env python3
"""A small client of hopd's HTTP API (docs/hopd.md, HTTP API), standard library only.

    hop_client.py --api http://127.0.0.1:7480 send FILE --to NODE [--service S] [--lifetime-s T]
    hop_client.py --api http://127.0.0.1:7480 receive --dir DIR [--service S] [--count N]
    hop_client.py --api http://127.0.0.1:7480 list

`send` hands the file to the node (a detached transfer: the node keeps it and sends it
whatever the partitions) and prints its flow; `receive` waits for files, writes each one
after checking its size, then tells the node it may delete its copy.
"""
import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def call(api, method, path, body=None, headers=None):
    req = urllib.request.Request(api.rstrip("/") + path, data=body, method=method,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            data = r.read()
            kind = r.headers.get("Content-Type", "")
            return r.status, (json.loads(data) if kind.startswith("application/json") else data), r.headers
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")
        sys.exit(f"hop_client: {method} {path}: HTTP {e.code}: {detail}")


def send(api, path, to, service=None, lifetime_s=None):
    q = {"to": to, "name": os.path.basename(path)}
    if service:
        q["service"] = service
    if lifetime_s:
        q["lifetime_s"] = lifetime_s
    with open(path, "rb") as f:
        body = f.read()
    _, reply, _ = call(api, "POST", "/v1/transfers?" + urllib.parse.urlencode(q), body,
                       {"Content-Type": "application/octet-stream"})
    return reply


def receive(api, out_dir, service=None, count=None, poll_s=0.5):
    os.makedirs(out_dir, exist_ok=True)
    got = 0
    q = "?" + urllib.parse.urlencode({"service": service}) if service else ""
    while count is None or got < count:
        _, listing, _ = call(api, "GET", "/v1/inbox" + q)
        if not listing["files"]:
            time.sleep(poll_s)
            continue
        for f in listing["files"]:
            _, data, headers = call(api, "GET", "/v1/inbox/" + urllib.parse.quote(f["flow"]))
            if len(data) != f["size"]:
                sys.exit(f"hop_client: {f['name']}: {len(data)} bytes, expected {f['size']}")
            dest = os.path.join(out_dir, os.path.basename(f["name"]))
            with open(dest + ".part", "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(dest + ".part", dest)
            call(api, "DELETE", "/v1/inbox/" + urllib.parse.quote(f["flow"]))
            print(json.dumps({"file": dest, "from": f["from"], "bytes": f["size"],
                              "blake3": f["blake3"]}), flush=True)
            got += 1
            if count is not None and got >= count:
                break


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--api", default="http://127.0.0.1:7480")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("send")
    s.add_argument("file")
    s.add_argument("--to", type=int, required=True)
    s.add_argument("--service")
    s.add_argument("--lifetime-s", type=int)
    r = sub.add_parser("receive")
    r.add_argument("--dir", required=True)
    r.add_argument("--service")
    r.add_argument("--count", type=int)
    sub.add_parser("list")
    a = p.parse_args()
    if a.cmd == "send":
        print(json.dumps(send(a.api, a.file, a.to, a.service, a.lifetime_s)))
    elif a.cmd == "receive":
        receive(a.api, a.dir, a.service, a.count)
    else:
        print(json.dumps(call(a.api, "GET", "/v1/transfers")[1], indent=2))


if __name__ == "__main__":
    main()
