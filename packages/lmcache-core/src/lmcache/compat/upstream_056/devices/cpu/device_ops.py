"""Upstream's ``devices.cpu.device_ops`` path for the in-tree CPU ops."""

from lmcache.v1.platform.cpu.device_ops import CpuDeviceOps

__all__ = ["CpuDeviceOps"]
