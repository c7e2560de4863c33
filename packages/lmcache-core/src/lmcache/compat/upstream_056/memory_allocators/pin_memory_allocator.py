"""Upstream's ``PinMemoryAllocator(size, use_paging=False, shapes, dtypes, fmt)``.

Objects in one host buffer from
:func:`~upstream_056.host_buffers.allocate_cpu_memory`: page-locked when CUDA is
present (fast device copies), ordinary pageable memory on a machine without it.
"""

from __future__ import annotations

from lmcache.compat.upstream_056.host_buffers import allocate_cpu_memory, free_cpu_memory
from lmcache.compat.upstream_056.memory_allocators.pooled import BufferPoolAllocator
from lmcache.v1.memory.format import DtypesArg, MemoryFormat, ShapesArg

__all__ = ["PinMemoryAllocator"]


class PinMemoryAllocator(BufferPoolAllocator):
    """Objects in a pinned (where possible) host buffer of ``size`` bytes."""

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
        self.size = size
        super().__init__(allocate_cpu_memory(size), use_paging, shapes, dtypes, fmt)

    def _release_buffer(self) -> None:
        free_cpu_memory(self.buffer, self.size)

    def __str__(self) -> str:
        return "PinMemoryAllocator"
