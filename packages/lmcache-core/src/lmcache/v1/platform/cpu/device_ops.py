"""``CpuDeviceOps``: the torch baseline on host memory, unchanged."""

from __future__ import annotations

from typing import ClassVar

from lmcache.v1.platform.base.device_ops import DeviceOps


class CpuDeviceOps(DeviceOps):
    device_type: ClassVar[str] = "cpu"
