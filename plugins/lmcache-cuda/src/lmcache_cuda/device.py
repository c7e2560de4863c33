"""``CudaDeviceSpec`` and ``RocmDeviceSpec``: the entry-point targets of this wheel.

Imported while the platform registry initializes, so this module imports only the core's
spec base; ops (and with them the CUDA extension), the IPC wrapper, the cache context and
the pinning backend load lazily through properties.

Both share device_type ``cuda`` (PyTorch reports ROCm GPUs as ``cuda``); their availability
checks exclude each other through ``torch.version.cuda`` / ``torch.version.hip``, so AUTO
selection never sees both.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, cast

from lmcache.v1.platform.base.device_spec import DeviceSpec

if TYPE_CHECKING:
    import torch

    from lmcache.v1.platform.base.cache_context import BaseCacheContext
    from lmcache.v1.platform.base.device_ops import DeviceOps
    from lmcache.v1.platform.base.event_ipc import EventIPCBackend
    from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
    from lmcache.v1.platform.base.pin_memory import PinMemoryBackend
    from lmcache.v1.platform.base.streams import DeviceStream

PRIORITY = 10


def torch_gpu_available(flavour: str) -> bool:
    """True when torch sees a GPU and was built for ``flavour`` ("cuda" or "hip") alone."""
    try:
        import torch

        version = getattr(torch, "version", None)
        if getattr(version, flavour, None) is None:
            return False
        if flavour == "cuda" and getattr(version, "hip", None) is not None:
            return False
        return bool(torch.cuda.is_available())
    except Exception:
        return False


class CudaDeviceSpec(DeviceSpec):
    """NVIDIA GPUs through torch.cuda, with native kernels, CUDA IPC and event IPC."""

    def __init__(self) -> None:
        super().__init__()
        self._event_backend_cache: EventIPCBackend | None = None
        self._event_lock = threading.Lock()

    @property
    def device_type(self) -> str:
        return "cuda"

    @property
    def backend_name(self) -> str:
        return "cuda"

    @property
    def torch_module_name(self) -> str:
        return "cuda"

    @property
    def priority(self) -> int:
        return PRIORITY

    def is_available(self) -> bool:
        return torch_gpu_available("cuda")

    @property
    def ops_cls(self) -> type[DeviceOps]:
        from lmcache_cuda.device_ops import CudaDeviceOps

        return CudaDeviceOps

    def is_lmcache_driven_available(self) -> bool:
        return True

    @property
    def ipc_wrapper_cls(self) -> type[DeviceIPCWrapper]:
        from lmcache_cuda.ipc_wrapper import CudaIPCWrapper

        return CudaIPCWrapper

    @property
    def event_ipc_backend(self) -> EventIPCBackend:
        # Cached: request futures query this property on every poll.
        backend = self._event_backend_cache
        if backend is None:
            with self._event_lock:
                if self._event_backend_cache is None:
                    import torch

                    from lmcache.v1.platform.base.event_ipc import DefaultEventIPCBackend

                    self._event_backend_cache = DefaultEventIPCBackend(
                        event_module=torch.cuda, device_type=self.device_type
                    )
                backend = self._event_backend_cache
        return backend

    def create_cache_context(self, *args: Any, **kwargs: Any) -> BaseCacheContext:
        from lmcache_cuda.cache_context import CudaCacheContext

        return CudaCacheContext(*args, **kwargs)

    @property
    def pin_memory_backend(self) -> type[PinMemoryBackend]:
        from lmcache_cuda.pin_memory import CudaPinMemoryBackend

        return CudaPinMemoryBackend

    def get_stream_handle(self, stream: DeviceStream) -> int:
        return int(cast("torch.cuda.Stream", stream).cuda_stream)


class RocmDeviceSpec(CudaDeviceSpec):
    """AMD GPUs under a ROCm torch build (device_type ``cuda``, backend ``rocm``).

    Reuses the CUDA spec's IPC wrapper, event IPC and cache context (torch maps them to
    HIP); ops stay on the torch baseline because the extension is CUDA-only.
    """

    @property
    def backend_name(self) -> str:
        return "rocm"

    def is_available(self) -> bool:
        return torch_gpu_available("hip")

    @property
    def ops_cls(self) -> type[DeviceOps]:
        from lmcache_cuda.device_ops import RocmDeviceOps

        return RocmDeviceOps

    @property
    def pin_memory_backend(self) -> type[PinMemoryBackend]:
        from lmcache_cuda.pin_memory import RocmPinMemoryBackend

        return RocmPinMemoryBackend
