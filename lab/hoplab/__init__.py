"""Hop lab: emulated 802.11 mesh experiments (ns-3 real time + network namespaces)."""

__version__ = "0.1.0"
