"""``CpuNativeDeviceSpec``: the entry-point target of the ``cpu_native`` backend.

Imported while the platform registry initializes, so it only imports the core's spec
classes; the ops (and with them the C++ extension) load lazily through ``ops_cls``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmcache.v1.platform.cpu import CpuDeviceSpec

if TYPE_CHECKING:
    from lmcache.v1.platform.base.device_ops import DeviceOps

BACKEND_NAME = "cpu_native"
PRIORITY = 10


class CpuNativeDeviceSpec(CpuDeviceSpec):
    """Host memory with native copy kernels; otherwise identical to the in-tree ``cpu``.

    It inherits the in-tree backend's shared-memory IPC wrapper, event IPC and cache
    context, and outranks it (priority 10 > 0), so installing the wheel selects it for
    device_type ``cpu`` without any environment variable; ``LMCACHE_DEVICE_BACKEND=cpu``
    still forces the baseline.
    """

    @property
    def backend_name(self) -> str:
        return BACKEND_NAME

    @property
    def priority(self) -> int:
        return PRIORITY

    @property
    def ops_cls(self) -> type[DeviceOps]:
        from lmcache_cpu.device_ops import CpuNativeDeviceOps

        return CpuNativeDeviceOps

    def is_available(self) -> bool:
        # The extension is built for the baseline ISA of its platform tag (no -march=native),
        # so any host that can install the wheel can run it; a broken or missing extension
        # is handled in ensure_native(), which keeps the torch baseline with one warning.
        return True
