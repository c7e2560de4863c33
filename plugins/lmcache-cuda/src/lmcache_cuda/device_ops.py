"""``CudaDeviceOps`` / ``RocmDeviceOps``: the torch baseline with the CUDA kernels over it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import ClassVar

import torch

from lmcache.v1.platform.kernel_kit.native_loader import NativeDeviceOps, NativeModuleLoader

logger = logging.getLogger(__name__)

NATIVE_OPS_MODULE = "lmcache_cuda.native_ops"
DISABLE_NATIVE_ENV_VAR = "LMCACHE_CUDA_DISABLE_NATIVE"


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


# The probe launch and its warning happen once per process, however many ops objects exist.
load_native_ops = NativeModuleLoader(
    NATIVE_OPS_MODULE,
    disable_env_var=DISABLE_NATIVE_ENV_VAR,
    ops_name="CudaDeviceOps",
    label="lmcache_cuda",
    logger=logger,
    probe=_kernel_problem,
)


class CudaDeviceOps(NativeDeviceOps):
    """CUDA ops: native kernels from ``lmcache_cuda.native_ops`` where usable, else torch."""

    device_type: ClassVar[str] = "cuda"
    native_loader = load_native_ops

    def tensor_from_ptr(
        self,
        ptr: int,
        shape: Sequence[int],
        dtype: torch.dtype,
        device: torch.device | str | None = None,
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
