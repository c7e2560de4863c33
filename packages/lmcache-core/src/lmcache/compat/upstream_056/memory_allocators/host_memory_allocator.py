"""Upstream's ``HostMemoryAllocator(size, use_paging=False, shapes, dtypes, fmt)``.

Objects in one pageable host buffer of ``size`` bytes (see
:class:`~upstream_056.memory_allocators.pooled.BufferPoolAllocator`).  Not to be confused
with :class:`lmcache.v1.memory.allocator.HostMemoryAllocator`, the L1 tier's buddy
allocator with optional shared memory, which keeps its own constructor.
"""

from __future__ import annotations

import torch

from lmcache.compat.upstream_056.memory_allocators.pooled import BufferPoolAllocator
from lmcache.v1.memory.format import DtypesArg, MemoryFormat, ShapesArg

__all__ = ["HostMemoryAllocator"]


class HostMemoryAllocator(BufferPoolAllocator):
    """Objects in a pageable host buffer of ``size`` bytes."""

    def __init__(
        self,
        size: int,
        use_paging: bool = False,
        shapes: ShapesArg | None = None,
        dtypes: DtypesArg | None = None,
        fmt: MemoryFormat | None = None,
    ) -> None:
        if size <= 0:
            raise ValueError(f"allocator size must be > 0, got {size}")
        buffer = torch.empty(size, dtype=torch.uint8, device="cpu")
        super().__init__(buffer, use_paging, shapes, dtypes, fmt)

    def __str__(self) -> str:
        return "HostMemoryAllocator"
