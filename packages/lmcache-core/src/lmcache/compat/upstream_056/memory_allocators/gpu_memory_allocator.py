"""Upstream's ``GPUMemoryAllocator(size, device=..., align_bytes=None, use_paging=False, ...)``.

Objects in one buffer on the accelerator.  The device defaults, as upstream, to the
selected backend's device type (``lmcache.torch_device_type``) and falls back to the CPU
when that backend has no device available; on the CPU backend (a machine without an
accelerator) the buffer therefore lives in host memory and the allocator works the same,
only without device memory behind it.
"""

from __future__ import annotations

import torch

from lmcache.compat.upstream_056.memory_allocators.pooled import BufferPoolAllocator
from lmcache.v1.memory.format import DtypesArg, MemoryFormat, ShapesArg
from lmcache.v1.platform import get_torch_device

__all__ = ["GPUMemoryAllocator", "default_device"]


def default_device() -> str:
    """The selected backend's device type, or ``"cpu"`` if it has no device available."""
    torch_dev, device_type = get_torch_device()
    available = torch_dev is not None and torch_dev.is_available()
    return device_type if available else "cpu"


class GPUMemoryAllocator(BufferPoolAllocator):
    """Objects in a device buffer of ``size`` bytes."""

    def __init__(
        self,
        size: int,
        device: str | torch.device | None = None,
        align_bytes: int | None = None,
        use_paging: bool = False,
        shapes: ShapesArg | None = None,
        dtypes: DtypesArg | None = None,
        fmt: MemoryFormat | None = None,
    ) -> None:
        if size <= 0:
            raise ValueError(f"allocator size must be > 0, got {size}")
        self.device = torch.device(device if device is not None else default_device())
        self.tensor = torch.empty(size, dtype=torch.uint8, device=self.device)
        super().__init__(self.tensor, use_paging, shapes, dtypes, fmt, align_bytes)

    def __str__(self) -> str:
        return "GPUMemoryAllocator"
