"""Upstream's ``lmcache.v1.platform.devices.cpu``: lmcache-core's in-tree CPU backend."""

from lmcache.v1.platform.cpu import CpuDeviceSpec

__all__ = ["CpuDeviceSpec"]
