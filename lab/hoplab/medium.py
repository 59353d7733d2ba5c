"""The medium process: ns-3 in real time as the shared 802.11 channel.

Run as ``python -m hoplab.medium CONFIG.json``. The configuration names the
taps (one per node), their MAC addresses, the PHY/MAC settings and the
directed links. Commands arrive as text lines on standard input (see
``medium_cpp.h``); end of input stops the simulation. On exit the process
writes counters and lag samples as JSON to the configured output file.
"""

from __future__ import annotations

import json
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
] + [f"tid{i}" for i in range(8)]


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[1]).read_text())
    t_import = time.time()
    from ns import ns  # noqa: PLC0415  (slow import, only in this process)
    import cppyy  # noqa: PLC0415

    ns.GlobalValue.Bind("SimulatorImplementationType", ns.StringValue("ns3::RealtimeSimulatorImpl"))
    ns.GlobalValue.Bind("ChecksumEnabled", ns.BooleanValue(True))
    ns.RngSeedManager.SetSeed(int(cfg.get("seed", 1)) or 1)
    cppyy.cppdef(Path(__file__).with_name("medium_cpp.h").read_text())
    hl = cppyy.gbl.hoplab

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
    channel.SetPropagationDelayModel(ns.CreateObject[ns.ConstantSpeedPropagationDelayModel]())

    phy = ns.YansWifiPhyHelper()
    phy.SetChannel(channel)
    wifi = ns.WifiHelper()
    wifi.SetStandard(ns.WIFI_STANDARD_80211b if cfg["standard"] == "b" else ns.WIFI_STANDARD_80211g)
    rts = ns.UintegerValue(0 if cfg.get("rts_cts") else 65535)
    if cfg.get("auto_rate"):
        wifi.SetRemoteStationManager("ns3::MinstrelWifiManager", "RtsCtsThreshold", rts)
    else:
        wifi.SetRemoteStationManager(
            "ns3::ConstantRateWifiManager",
            "DataMode",
            ns.StringValue(cfg["data_mode"]),
            "ControlMode",
            ns.StringValue(cfg["control_mode"]),
            "RtsCtsThreshold",
            rts,
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

    hl.Setup(n, matrix, bool(cfg.get("classify_dscp", True)))
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

    tap = ns.TapBridgeHelper()
    tap.SetAttribute("Mode", ns.StringValue("UseLocal"))
    for i in range(n):
        tap.SetAttribute("DeviceName", ns.StringValue(cfg["taps"][i]))
        tap.Install(nodes.Get(i), devices.Get(i))

    hl.StartControl(0)
    max_s = float(cfg.get("max_seconds", 3600))
    ns.Simulator.Stop(ns.Seconds(max_s))
    print(f"medium: ns-3 ready after {time.time() - t_import:.1f} s, running", flush=True)
    wall0 = time.time()
    ns.Simulator.Run()
    wall = time.time() - wall0
    sim_s = ns.Simulator.Now().GetSeconds()
    out = {
        "sim_seconds": sim_s,
        "wall_seconds": wall,
        "lag_ms": list(hl.LagSamples()),
        "control_log": [str(s) for s in hl.ControlLog()],
        "counters": [
            dict(zip(COUNTER_NAMES, [int(x) for x in hl.CountersOf(i)])) for i in range(n)
        ],
    }
    Path(cfg["out"]).write_text(json.dumps(out))
    ns.Simulator.Destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
