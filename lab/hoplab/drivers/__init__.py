"""Protocol drivers: one module per protocol family, the interface in base.py.

The lab finds a flow's driver by its `driver` key in DRIVERS.
"""

from __future__ import annotations

from .base import BASE_PORT, Driver
from .dtn import DtnDriver
from .dtnhop import DtnHopDriver
from .hbhtcp import HbhTcpDriver
from .hop import HopDriver
from .tcp import TcpDriver
from .udp import UdpDriver, VoipDriver, voip_stats

DRIVERS: dict[str, type[Driver]] = {
    "tcp": TcpDriver,
    "udp": UdpDriver,
    "voip": VoipDriver,
    "hop": HopDriver,
    "hbhtcp": HbhTcpDriver,
    "dtn": DtnDriver,
    "dtn-hop": DtnHopDriver,
}

__all__ = ["BASE_PORT", "DRIVERS", "Driver", "DtnDriver", "DtnHopDriver", "HbhTcpDriver", "HopDriver", "TcpDriver", "UdpDriver",
           "VoipDriver", "voip_stats"]
