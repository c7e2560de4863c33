"""``hostsim``: a device backend that is not ``cpu``, over host memory, for tests only.

It proves the cache server's LMCache-driven path is device-neutral: a worker whose
selected backend is ``hostsim`` registers ``HostSimShmWrapper``s (device type
``hostsim``, wire kind ``hostsim_shm``), and the server must then map them with
``HostSimCacheContext``, copy with its ``transfer_blocks`` and order with
``HostSimEventIPCBackend`` -- whose handles the cpu backend would refuse.

Available only when ``LMCACHE_TEST_HOSTSIM_AVAILABLE=1``, so installing the wheel never
changes backend selection elsewhere.  ``LMCACHE_TEST_HOSTSIM_TRACE=<file>`` makes the
context and the event backend append one JSON line per copy / wait to that file.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from lmcache.v1.platform.base.device_spec import DeviceSpec

if TYPE_CHECKING:
    from lmcache.v1.platform.base.cache_context import BaseCacheContext
    from lmcache.v1.platform.base.event_ipc import EventIPCBackend
    from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
    from lmcache.v1.platform.base.streams import DeviceLike

AVAILABLE_ENV_VAR = "LMCACHE_TEST_HOSTSIM_AVAILABLE"
TRACE_ENV_VAR = "LMCACHE_TEST_HOSTSIM_TRACE"
DEVICE_TYPE = "hostsim"


class HostSimDeviceSpec(DeviceSpec):
    """Host memory under its own device type; torch-facing device: ``cpu``."""

    def __init__(self) -> None:
        super().__init__()
        self._events: EventIPCBackend | None = None

    @property
    def device_type(self) -> str:
        return DEVICE_TYPE

    @property
    def backend_name(self) -> str:
        return DEVICE_TYPE

    @property
    def torch_module_name(self) -> str:
        # torch has no ``hostsim`` module; its tensors are host tensors.
        return "cpu"

    def is_available(self) -> bool:
        return os.environ.get(AVAILABLE_ENV_VAR) == "1"

    def is_lmcache_driven_available(self) -> bool:
        return True

    @property
    def ipc_wrapper_cls(self) -> type[DeviceIPCWrapper]:
        from lmcache_tp_hostsim.wrapper import HostSimShmWrapper

        return HostSimShmWrapper

    @property
    def event_ipc_backend(self) -> EventIPCBackend:
        if self._events is None:
            from lmcache_tp_hostsim.events import HostSimEventIPCBackend

            self._events = HostSimEventIPCBackend()
        return self._events

    def create_cache_context(self, *args: Any, **kwargs: Any) -> BaseCacheContext:
        from lmcache_tp_hostsim.cache_context import HostSimCacheContext

        return HostSimCacheContext(*args, **kwargs)

    def synchronize_device(self, device: DeviceLike = None) -> None:
        return None
