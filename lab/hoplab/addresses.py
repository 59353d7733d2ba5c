"""Addresses of the lab's nodes: node i is 10.77.x.y (x.y = i + 1) with a locally
administered MAC on the interface IFACE of its namespace.

The lab (which configures them) and the drivers (which write them into their daemons'
configurations) both read them here.
"""

from __future__ import annotations

IFACE = "wl0"
SUBNET = "10.77"
BROADCAST = f"{SUBNET}.255.255"


def mac_of(i: int) -> str:
    return f"02:48:4c:00:{(i + 1) >> 8:02x}:{(i + 1) & 0xFF:02x}"


def ip_of(i: int) -> str:
    return f"{SUBNET}.{(i + 1) >> 8}.{(i + 1) & 0xFF}"


def node_of(ip: str) -> int | None:
    """The lab node with address `ip`, or None (inverse of ip_of)."""
    parts = ip.split(".")
    if len(parts) != 4 or ".".join(parts[:2]) != SUBNET or not all(p.isdigit() for p in parts[2:]):
        return None
    v = int(parts[2]) * 256 + int(parts[3])
    return v - 1 if v >= 1 else None
