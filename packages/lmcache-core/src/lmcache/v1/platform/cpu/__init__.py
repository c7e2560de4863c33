"""The in-tree ``cpu`` backend: the torch baseline on host memory (priority 0).

It is always available, so it is the final fallback of backend selection.  A vendor wheel
for device_type ``cpu`` with a higher ``priority`` (such as ``lmcache-cpu``) takes over
automatically; ``LMCACHE_DEVICE_BACKEND=cpu`` forces this one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmcache.v1.platform.base.device_spec import DeviceSpec
from lmcache.v1.platform.transfer_mode import MPTransferMode

if TYPE_CHECKING:
    from lmcache.v1.platform.base.cache_context import BaseCacheContext
    from lmcache.v1.platform.base.device_ops import DeviceOps
    from lmcache.v1.platform.base.event_ipc import EventIPCBackend
    from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
    from lmcache.v1.platform.base.streams import DeviceLike


class CpuDeviceSpec(DeviceSpec):
    """Host memory through plain torch tensors."""

    _event_backend_cache: EventIPCBackend | None = None

    @property
    def device_type(self) -> str:
        return "cpu"

    @property
    def backend_name(self) -> str:
        return "cpu"

    @property
    def torch_module_name(self) -> str:
        return "cpu"

    @property
    def ops_cls(self) -> type[DeviceOps]:
        from lmcache.v1.platform.cpu.device_ops import CpuDeviceOps

        return CpuDeviceOps

    def is_available(self) -> bool:
        return True

    def is_lmcache_driven_available(self) -> bool:
        return True

    def default_mp_transfer_mode(self) -> MPTransferMode:
        # AUTO dispatches strictly by device type: only cuda defaults to LMCache-driven.
        # The shared-memory LMCache-driven path stays available when asked for explicitly.
        return MPTransferMode.ENGINE_DRIVEN

    @property
    def ipc_wrapper_cls(self) -> type[DeviceIPCWrapper]:
        from lmcache.v1.platform.cpu.shm import CpuShmTensorWrapper

        return CpuShmTensorWrapper

    @property
    def event_ipc_backend(self) -> EventIPCBackend:
        backend = self._event_backend_cache
        if backend is None:
            from lmcache.v1.platform.cpu.event_ipc import HostEventIPCBackend

            backend = HostEventIPCBackend()
            self._event_backend_cache = backend
        return backend

    def create_cache_context(self, *args: Any, **kwargs: Any) -> BaseCacheContext:
        from lmcache.v1.platform.cpu.cache_context import CPUCacheContext

        return CPUCacheContext(*args, **kwargs)

    def synchronize_device(self, device: DeviceLike = None) -> None:
        return None

    def synchronize_stream(self, stream: Any) -> None:
        # Host work runs in order on the calling thread (torch.cpu.Stream has no
        # synchronize()): by the time this is called it is done.
        return None
