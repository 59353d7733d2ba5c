"""The medium process: ns-3 in real time as the shared 802.11 channel.

Run as ``python -m hoplab.medium CONFIG.json``. The configuration names the
taps (one per node), their MAC addresses, the PHY/MAC settings and the
directed links. Commands arrive as text lines on standard input (see
``medium_cpp.h``); end of input stops the simulation. On exit the process
writes counters and lag samples as JSON to the configured output file.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import sys
import time
from pathlib import Path

# 802.11 access category indices in ns-3 (AcIndex).
AC_INDEX = {"be": 0, "bk": 1, "vi": 2, "vo": 3}
COUNTER_NAMES = [
    "mac_tx",
    "mac_rx",
    "phy_tx",
    "phy_rx_ok",
    "phy_rx_drop",
    "phy_rx_collision",
    "imposed_loss",
    "retries",
    "final_failures",
    "rts_failed",
] + [f"tid{i}" for i in range(8)] + ["queue_full", "queue_expired"] + [
    # airtime of this node's PPDUs and its PHY's time per state, microseconds (medium_cpp.h)
    "air_large_us", "air_small_us", "air_mac_us", "air_retry_us",
    "state_idle_us", "state_cca_us", "state_tx_us", "state_rx_us",
    # time the node's MAC held a frame (any access category; best effort or background)
    "queued_us", "queued_data_us",
]
# Frames between the taps and the devices (medium_cpp.h, TapCountersAll).
TAP_COUNTER_NAMES = ["from_tap", "to_tap", "other_host", "bad_frames", "write_errors", "queue_drops"]

# <linux/if_tun.h>
TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000


def open_tap(name: str) -> int:
    """Create tap `name` (raw Ethernet frames, no packet-info header) and return its
    non-blocking descriptor. The tap lives as long as the descriptor; the orchestrator
    moves it into its node's namespace, which keeps it joined to this descriptor."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI))
    except OSError as e:
        os.close(fd)
        raise OSError(f"medium: cannot create tap {name}: {e.strerror}") from e
    return fd


def load():
    """Import ns-3 and compile the medium's C++ helpers: ~20 s of CPU, the same for every run."""
    from ns import ns  # noqa: PLC0415  (slow import, only in this process)
    import cppyy  # noqa: PLC0415

    cppyy.cppdef(Path(__file__).with_name("medium_cpp.h").read_text())
    return ns, cppyy.gbl.hoplab


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "--serve":
        return serve(argv[2])
    cfg = json.loads(Path(argv[1]).read_text())
    t_import = time.time()
    ns, hl = load()
    return run(cfg, ns, hl, t_import)


def run(cfg: dict, ns, hl, t_import: float) -> int:
    ns.GlobalValue.Bind("SimulatorImplementationType", ns.StringValue("ns3::RealtimeSimulatorImpl"))
    ns.GlobalValue.Bind("ChecksumEnabled", ns.BooleanValue(True))
    ns.RngSeedManager.SetSeed(int(cfg.get("seed", 1)) or 1)

    n = int(cfg["nodes"])
    nodes = ns.NodeContainer()
    nodes.Create(n)
    mob = ns.MobilityHelper()
    mob.SetMobilityModel("ns3::ConstantPositionMobilityModel")
    mob.Install(nodes)

    matrix = ns.CreateObject[ns.MatrixPropagationLossModel]()
    matrix.SetDefaultLoss(1000.0)
    channel = ns.CreateObject[ns.YansWifiChannel]()
    channel.SetPropagationLossModel(matrix)
    delay = ns.CreateObject[ns.ConstantSpeedPropagationDelayModel]()
    channel.SetPropagationDelayModel(delay)

    phy = ns.YansWifiPhyHelper()
    phy.SetChannel(channel)
    wifi = ns.WifiHelper()
    wifi.SetStandard(ns.WIFI_STANDARD_80211b if cfg["standard"] == "b" else ns.WIFI_STANDARD_80211g)
    rts = ns.UintegerValue(int(cfg.get("rts_threshold", 0 if cfg.get("rts_cts") else 65535)))
    if cfg.get("auto_rate"):
        wifi.SetRemoteStationManager("ns3::MinstrelWifiManager", "RtsCtsThreshold", rts)
    else:
        manager, extra = "ns3::ConstantRateWifiManager", []
        if cfg.get("no_retry_tids"):
            # Fixed rate, and no link retries for the frames of some TIDs (medium_cpp.h).
            manager = str(hl.NoRetryTidManagerName())
            extra = ["NoRetryTids", ns.UintegerValue(int(cfg["no_retry_tids"]))]
        wifi.SetRemoteStationManager(
            manager,
            "DataMode",
            ns.StringValue(cfg["data_mode"]),
            "ControlMode",
            ns.StringValue(cfg["control_mode"]),
            "RtsCtsThreshold",
            rts,
            *extra,
        )
    mac = ns.WifiMacHelper()
    mac.SetType(
        "ns3::AdhocWifiMac",
        "QosSupported",
        ns.BooleanValue(True),
        "FrameRetryLimit",
        ns.UintegerValue(int(cfg["frame_retry_limit"])),
    )
    devices = wifi.Install(phy, mac, nodes)

    # The helper's channel only builds the PHYs: Hook moves each to a channel of its own
    # (medium_cpp.h, "one channel per sender").
    hl.Setup(n, matrix, delay, bool(cfg.get("classify_dscp", True)), bool(cfg.get("overhear", False)))
    for i in range(n):
        hl.SetMobility(i, nodes.Get(i).GetObject[ns.MobilityModel]())
    for i in range(n):
        dev = devices.Get(i).GetObject[ns.WifiNetDevice]()
        hl.Hook(i, dev, ns.Mac48Address(cfg["macs"][i]), 1000 + i)
        if cfg.get("nonunicast_mode"):
            dev.GetRemoteStationManager().SetAttribute(
                "NonUnicastMode", ns.StringValue(cfg["nonunicast_mode"])
            )
        for ac, us in cfg.get("txop_us", {}).items():
            hl.SetTxop(dev, AC_INDEX[ac], float(us))
    for a, b, db, per in cfg["links"]:
        hl.SetLink(int(a), int(b), float(db), float(per))
    for a in cfg.get("down", []):
        hl.SetNodeDown(int(a), True)

    tap_fds = [open_tap(name) for name in cfg["taps"]]
    for i in range(n):
        hl.AttachTap(i, tap_fds[i], devices.Get(i).GetObject[ns.WifiNetDevice]())
    for i, path in enumerate(cfg.get("link_status") or []):
        # Each node's MAC backlog to the node's Unix socket (medium_cpp.h, "link status").
        err = str(hl.SetLinkStatus(i, devices.Get(i).GetObject[ns.WifiNetDevice](), str(path)))
        if err:
            raise OSError(f"medium: {err}")
    err = str(hl.StartTapIo())
    if err:
        raise OSError(f"medium: tap I/O threads: {err}")

    hl.StartControl(0)
    max_s = float(cfg.get("max_seconds", 3600))
    ns.Simulator.Stop(ns.Seconds(max_s))
    print(f"medium: ns-3 ready after {time.time() - t_import:.1f} s, running", flush=True)
    wall0 = time.time()
    try:
        ns.Simulator.Run()
    finally:
        hl.StopTapIo()
    wall = time.time() - wall0
    for fd in tap_fds:
        os.close(fd)
    sim_s = ns.Simulator.Now().GetSeconds()
    out = {
        "sim_seconds": sim_s,
        "wall_seconds": wall,
        "lag_ms": list(hl.LagSamples()),
        "probe_real_s": list(hl.ProbeRealSeconds()),
        "probe_cpu_s": list(hl.ProbeCpuSeconds()),
        "control_log": [str(s) for s in hl.ControlLog()],
        "counters": [
            dict(zip(COUNTER_NAMES, [int(x) for x in hl.CountersOf(i)])) for i in range(n)
        ],
        "taps": dict(zip(TAP_COUNTER_NAMES, [int(x) for x in hl.TapCountersAll()])),
        "link_status": dict(zip(["reports", "refused"], [int(x) for x in hl.LinkStatusCounters()])),
    }
    Path(cfg["out"]).write_text(json.dumps(out))
    ns.Simulator.Destroy()
    return 0


def serve(sock_path: str) -> int:
    """A medium server: load ns-3 once, then fork one medium per request.

    Each request on the Unix socket carries a configuration path and three file
    descriptors (the medium's stdin, stdout, stderr). The server forks; the child
    starts a new session, takes those descriptors and runs that configuration
    exactly as ``python -m hoplab.medium CONFIG`` would, from the state right after
    the import. The reply carries the child's pid and a pidfd that becomes readable
    when the child exits. The server ends when its own stdin closes."""
    import selectors  # noqa: PLC0415
    import socket  # noqa: PLC0415
    import traceback  # noqa: PLC0415

    t0 = time.time()
    ns, hl = load()
    Path(sock_path).unlink(missing_ok=True)
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(sock_path)
    os.chmod(sock_path, 0o600)
    lsock.listen(8)
    print(f"medium server: ns-3 loaded in {time.time() - t0:.1f} s, listening on {sock_path}", flush=True)
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ, "accept")
    sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
    try:
        while True:
            for key, _ in sel.select(timeout=1.0):
                if key.data == "stdin":
                    if not os.read(sys.stdin.fileno(), 4096):
                        return 0
                    continue
                conn, _ = lsock.accept()
                with conn:
                    try:
                        msg, fds, _, _ = socket.recv_fds(conn, 4096, 3)
                    except OSError:
                        continue
                    if len(fds) != 3:
                        for fd in fds:
                            os.close(fd)
                        continue
                    pid = os.fork()
                    if pid == 0:  # the medium for this request
                        rc = 1
                        try:
                            lsock.close()
                            conn.close()
                            os.setsid()
                            for i, fd in enumerate(fds):
                                os.dup2(fd, i)
                                os.close(fd)
                            sys.stdin = open(0, closefd=False)
                            sys.stdout = open(1, "w", closefd=False)
                            sys.stderr = open(2, "w", closefd=False)
                            cfg = json.loads(Path(msg.decode()).read_text())
                            rc = run(cfg, ns, hl, time.time())
                        except BaseException:  # noqa: BLE001  (report, never return into the server loop)
                            traceback.print_exc()
                        finally:
                            sys.stdout.flush()
                            sys.stderr.flush()
                            os._exit(rc)
                    for fd in fds:
                        os.close(fd)
                    pidfd = os.pidfd_open(pid)
                    try:
                        socket.send_fds(conn, [str(pid).encode()], [pidfd])
                    except OSError:
                        pass
                    os.close(pidfd)
            while True:  # reap finished media
                try:
                    done, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if done == 0:
                    break
    finally:
        Path(sock_path).unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
