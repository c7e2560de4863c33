"""Host-memory pinning through the device runtime (``cudaHostRegister`` / ``hipHostRegister``).

Prefers the extension (static CUDA runtime, always present when the wheel was built with
nvcc); otherwise binds the runtime library already loaded by torch through ctypes.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

from lmcache.v1.platform.base.pin_memory import PinMemoryBackend

logger = logging.getLogger(__name__)


class _CtypesRuntime:
    """``<prefix>HostRegister`` / ``<prefix>HostUnregister`` of a runtime library."""

    def __init__(self, lib: Any, prefix: str) -> None:
        self._register = getattr(lib, f"{prefix}HostRegister")
        self._register.restype = ctypes.c_int
        self._register.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        self._unregister = getattr(lib, f"{prefix}HostUnregister")
        self._unregister.restype = ctypes.c_int
        self._unregister.argtypes = [ctypes.c_void_p]

    def host_register(self, ptr: int, size: int, flags: int) -> int:
        return int(self._register(ptr, size, flags))

    def host_unregister(self, ptr: int) -> int:
        return int(self._unregister(ptr))


class RuntimePinMemoryBackend(PinMemoryBackend):
    """Pins with the first runtime that loads; reports unsupported when none does."""

    symbol_prefix = "cuda"
    prefer_native = True

    def __init__(self) -> None:
        self._runtime: Any = None
        self._resolved = False
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if not self._resolved:
                self._resolved = True
                self._runtime = self._find_runtime()
        return self._runtime

    def _find_runtime(self) -> Any:
        if self.prefer_native:
            try:
                import lmcache_cuda._native as _native

                # Without a device every registration fails: report unsupported instead.
                return _native if _native.device_count() > 0 else None
            except ImportError:
                pass
        from lmcache.v1.platform.kernel_kit.runtime import device_runtime

        lib = device_runtime()
        if lib is None or not hasattr(lib, f"{self.symbol_prefix}HostRegister"):
            return None
        return _CtypesRuntime(lib, self.symbol_prefix)

    def pin_memory(self, ptr: int, size: int, flags: int = 0) -> bool:
        runtime = self._load()
        if runtime is None or size <= 0:
            return False
        rc = runtime.host_register(int(ptr), int(size), int(flags))
        if rc != 0:
            logger.debug("%sHostRegister(%#x, %d) failed: %d", self.symbol_prefix, ptr, size, rc)
        return rc == 0

    def unpin_memory(self, ptr: int) -> bool:
        runtime = self._load()
        return runtime is not None and runtime.host_unregister(int(ptr)) == 0

    @property
    def is_pin_supported(self) -> bool:
        return self._load() is not None


class CudaPinMemoryBackend(RuntimePinMemoryBackend):
    symbol_prefix = "cuda"
    prefer_native = True


class RocmPinMemoryBackend(RuntimePinMemoryBackend):
    symbol_prefix = "hip"
    prefer_native = False  # the extension speaks CUDA, not HIP
