"""Raw-pointer helpers: wrap host memory as tensors without copying."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

from lmcache.v1.platform.ops_resolver import resolve_ops_for

logger = logging.getLogger(__name__)

__all__ = ["_copy_bytes_with_tensor", "_get_copy_lib", "_tensor_from_ptr", "tensor_from_ptr"]

_COPY_LIB_CANDIDATES = (("cudart", "libcudart.so"), ("amdhip64", "libamdhip64.so"))


@functools.lru_cache(maxsize=1)
def _get_copy_lib() -> Any:
    """The device runtime library (CUDA runtime, then HIP), loaded once; None if absent."""
    for short_name, soname in _COPY_LIB_CANDIDATES:
        for candidate in (soname, ctypes.util.find_library(short_name)):
            if not candidate:
                continue
            try:
                return ctypes.CDLL(candidate)
            except OSError:
                continue
    logger.debug("no device runtime library found; raw-pointer ops are host-only")
    return None


def _device_runtime() -> Any:
    """The runtime library, but only when a device is usable (a bare libcudart without a
    driver fails every call)."""
    if not torch.cuda.is_available():
        return None
    return _get_copy_lib()


def _host_bytes(ptr: int, nbytes: int) -> torch.Tensor:
    """A uint8 tensor aliasing ``nbytes`` of host memory at ``ptr`` (no copy)."""
    if nbytes <= 0:
        return torch.empty(0, dtype=torch.uint8)
    if ptr == 0:
        raise ValueError("cannot wrap a null pointer")
    buffer = (ctypes.c_ubyte * nbytes).from_address(ptr)
    # frombuffer keeps `buffer` alive for as long as the tensor lives.
    return torch.frombuffer(buffer, dtype=torch.uint8)


def _require_host(device: torch.device | str | None) -> None:
    if device is not None and torch.device(device).type != "cpu":
        raise ValueError(
            f"Device backend {torch.device(device).type!r} does not support tensor "
            "construction from raw pointers in the torch baseline (host memory only)."
        )


def _tensor_from_ptr(
    ptr: int,
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device | str | None = None,
    strides: Sequence[int] | None = None,
) -> torch.Tensor:
    """Zero-copy tensor of ``shape``/``dtype`` over memory at ``ptr`` on ``device``.

    Host memory is wrapped here; any other device is delegated to that device's
    ``DeviceOps.tensor_from_ptr`` (upstream 0.5.6 routing), which raises ``ValueError``
    where the backend cannot alias raw device pointers.  ``strides`` (in elements)
    describes a non-contiguous host layout; the wrapped span then covers exactly the
    addressed elements. The caller keeps the memory alive.
    """
    if device is not None and strides is None:
        target = torch.device(device)
        if target.type != "cpu":
            return _device_tensor_from_ptr(ptr, shape, dtype, target)
    return _host_tensor_from_ptr(ptr, shape, dtype, device, strides)


def _device_tensor_from_ptr(
    ptr: int, shape: Sequence[int], dtype: torch.dtype, device: Any
) -> torch.Tensor:
    return resolve_ops_for(device.type).tensor_from_ptr(ptr, tuple(shape), dtype, device)


def _host_tensor_from_ptr(
    ptr: int,
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device | str | None,
    strides: Sequence[int] | None,
) -> torch.Tensor:
    _require_host(device)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    shape = [int(s) for s in shape]
    if strides is None:
        numel = math.prod(shape)
        return _host_bytes(int(ptr), numel * itemsize).view(dtype).view(shape)
    if any(s == 0 for s in shape):
        return torch.empty(shape, dtype=dtype)
    span = 1 + sum((size - 1) * stride for size, stride in zip(shape, strides))
    flat = _host_bytes(int(ptr), span * itemsize).view(dtype)
    return flat.as_strided(shape, [int(s) for s in strides])


def tensor_from_ptr(
    ptr: int, shape: Sequence[int], dtype: torch.dtype, device: torch.device | str | None
) -> torch.Tensor:
    """Public ``DeviceOps.tensor_from_ptr``: zero-copy over host memory.

    Raises ValueError for non-CPU devices: a generic torch build cannot alias device memory.
    """
    return _host_tensor_from_ptr(ptr, shape, dtype, device, None)


def _copy_bytes_with_tensor(dst: int, src: int, num_bytes: int) -> None:
    """Copy ``num_bytes`` between two host addresses through tensor views."""
    if num_bytes <= 0:
        return
    _host_bytes(int(dst), num_bytes).copy_(_host_bytes(int(src), num_bytes))
