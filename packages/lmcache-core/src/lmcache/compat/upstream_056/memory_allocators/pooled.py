"""The part upstream's host, pinned, device and mixed allocators share (our module).

:class:`BufferPoolAllocator` owns a buffer made by its subclass and places objects in it
with :class:`~.paged_tensor_memory_allocator.PagedTensorMemoryAllocator`
(``use_paging``: one page per object, ``shapes``/``dtypes``/``fmt`` give the page) or
:class:`~upstream_056.memory_allocators.tensor_memory_allocator.TensorMemoryAllocator`.
Objects name the pool as their ``parent()``, so dropping an object's last reference
frees it through the pool.  The inner allocators lock themselves; upstream's extra
wrapper lock is not needed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from lmcache.compat.upstream_056.memory_allocators.paged_tensor_memory_allocator import (
    PagedTensorMemoryAllocator,
)
from lmcache.compat.upstream_056.memory_allocators.tensor_memory_allocator import (
    TensorMemoryAllocator,
)
from lmcache.v1.memory.base import MemoryAllocatorInterface, MemoryObj
from lmcache.v1.memory.format import DtypesArg, MemoryFormat, ShapesArg

logger = logging.getLogger(__name__)

__all__ = ["BufferPoolAllocator"]


class BufferPoolAllocator(MemoryAllocatorInterface):
    """Objects in ``buffer``, paged or buddy-placed; :meth:`_release_buffer` on close."""

    allocator: TensorMemoryAllocator | PagedTensorMemoryAllocator

    def __init__(
        self,
        buffer: torch.Tensor,
        use_paging: bool = False,
        shapes: ShapesArg | None = None,
        dtypes: DtypesArg | None = None,
        fmt: MemoryFormat | None = None,
        align_bytes: int | None = None,
    ) -> None:
        self.buffer = buffer
        self._closed = False
        if use_paging:
            if shapes is None or dtypes is None or fmt is None:
                raise ValueError("a paged allocator needs shapes, dtypes and fmt")
            self.allocator = PagedTensorMemoryAllocator(
                buffer, shapes, dtypes, fmt, parent_allocator=self
            )
        else:
            self.allocator = TensorMemoryAllocator(
                buffer,
                align_bytes or TensorMemoryAllocator.ALIGN_BYTES,
                parent_allocator=self,
            )

    @property
    def capacity_bytes(self) -> int:
        return self.allocator.capacity_bytes

    @property
    def used_bytes(self) -> int:
        return self.allocator.used_bytes

    @property
    def total_allocated_size(self) -> int:
        return self.allocator.total_allocated_size

    @property
    def num_active_allocations(self) -> int:
        return self.allocator.num_active_allocations

    def allocate(
        self,
        shapes: ShapesArg,
        dtypes: DtypesArg,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
    ) -> MemoryObj | None:
        return self.allocator.allocate(shapes, dtypes, fmt, str(self))

    def batched_allocate(
        self,
        shapes: ShapesArg,
        dtypes: DtypesArg,
        batch_size: int,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
    ) -> list[MemoryObj] | None:
        return self.allocator.batched_allocate(shapes, dtypes, batch_size, fmt, str(self))

    def free(self, memory_obj: MemoryObj, allocator_type: str | None = None) -> None:
        self.allocator.free(memory_obj)

    def batched_free(
        self,
        memory_objs: Sequence[MemoryObj],
        allocator_type: str | None = None,
        update_stats: bool = True,
    ) -> None:
        self.allocator.batched_free(memory_objs, update_stats=update_stats)

    def memcheck(self) -> bool:
        return self.allocator.memcheck()

    def close(self) -> None:
        """Release the buffer once (later calls do nothing)."""
        if self._closed:
            return
        self._closed = True
        self.allocator.close()
        self._release_buffer()

    def _release_buffer(self) -> None:
        """Subclass hook: give back what the buffer holds beyond its memory."""
