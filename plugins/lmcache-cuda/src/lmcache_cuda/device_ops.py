"""``CudaDeviceOps`` / ``RocmDeviceOps``: the torch baseline with the CUDA kernels over it."""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Sequence
from types import ModuleType
from typing import Any, ClassVar

import torch

from lmcache.v1.platform.base.device_ops import DeviceOps

logger = logging.getLogger(__name__)

NATIVE_OPS_MODULE = "lmcache_cuda.native_ops"
DISABLE_NATIVE_ENV_VAR = "LMCACHE_CUDA_DISABLE_NATIVE"
_BASELINE = "CudaDeviceOps stays on the torch baseline for all ops."


def _native_disabled() -> bool:
    value = os.environ.get(DISABLE_NATIVE_ENV_VAR, "").strip().lower()
    return value not in ("", "0", "false", "no")


def _kernel_problem() -> str:
    """Why this module's kernels cannot run on the current device ('' when they can)."""
    import lmcache_cuda._native as _native

    if _native.device_count() <= 0:
        return "the CUDA runtime sees no device (no GPU or no driver)"
    device = torch.cuda.current_device() if torch.cuda.is_available() else 0
    reason = str(_native.probe(device))
    if reason:
        return f"{reason} (kernels built for {_native.COMPILED_ARCHS})"
    return ""


@functools.cache
def load_native_ops() -> ModuleType | None:
    """The native ops module, or None after exactly one warning per process.

    Cached so the probe launch and the warning happen once however many ops objects exist.
    """
    if _native_disabled():
        logger.warning("%s is set: %s", DISABLE_NATIVE_ENV_VAR, _BASELINE)
        return None
    try:
        module = importlib.import_module(NATIVE_OPS_MODULE)
        problem = _kernel_problem()
    except ImportError as exc:  # extension missing (built without nvcc) or unloadable
        logger.warning(
            "lmcache_cuda native extension unavailable (%s: %s); %s",
            type(exc).__name__,
            exc,
            _BASELINE,
        )
        return None
    except Exception as exc:  # a driver or runtime failure while probing
        logger.warning(
            "lmcache_cuda kernels cannot be probed (%s: %s); %s", type(exc).__name__, exc, _BASELINE
        )
        return None
    if problem:
        logger.warning("lmcache_cuda kernels unusable here: %s; %s", problem, _BASELINE)
        return None
    return module


class CudaDeviceOps(DeviceOps):
    """CUDA ops: native kernels from ``lmcache_cuda.native_ops`` where usable, else torch."""

    device_type: ClassVar[str] = "cuda"

    def ensure_native(self) -> None:
        if self._native_bound:
            return
        module = load_native_ops()
        if module is not None:
            self.bind_native(module)

    def tensor_from_ptr(
        self, ptr: int, shape: Sequence[int], dtype: torch.dtype, device: Any = None
    ) -> torch.Tensor:
        """Zero-copy view of device memory (``__cuda_array_interface__``); host pointers
        keep the baseline's host view."""
        if device is not None and torch.device(device).type == "cuda":
            from lmcache_cuda._device_mem import device_tensor

            return device_tensor(ptr, shape, None, dtype, device)
        return super().tensor_from_ptr(ptr, shape, dtype, device)


class RocmDeviceOps(CudaDeviceOps):
    """ROCm: the extension is CUDA-only (no HIP build yet), so every op is the baseline."""

    def ensure_native(self) -> None:
        if self._native_bound:
            return
        logger.info("lmcache_cuda has no HIP kernels; RocmDeviceOps uses the torch baseline.")
