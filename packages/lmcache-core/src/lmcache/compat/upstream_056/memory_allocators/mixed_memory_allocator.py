"""Upstream's ``MixedMemoryAllocator``: tensor objects in pinned memory plus byte buffers.

``BINARY_BUFFER`` requests get a :class:`~lmcache.v1.memory.objects.BytesBufferMemoryObj`
over a fresh ``bytearray`` of ``shapes[0]`` bytes (the dtypes are ignored, as upstream);
the KV, encoder-cache and hidden-state formats get tensor objects in one host buffer from
:func:`~upstream_056.host_buffers.allocate_cpu_memory` (pinned where CUDA is present,
huge pages with ``use_hugepages``, a shared-memory segment with ``shm_name``); any other
format is a ValueError.  Upstream reads ``shm_name`` from ``config``'s extra config; here
it is a keyword argument, and NUMA binding is not supported.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmcache.compat.upstream_056.host_buffers import allocate_cpu_memory, free_cpu_memory
from lmcache.compat.upstream_056.memory_allocators.pooled import BufferPoolAllocator
from lmcache.compat.upstream_056.memory_allocators.tensor_memory_allocator import (
    TensorMemoryAllocator,
)
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.memory.format import DtypesArg, MemoryFormat, ShapesArg
from lmcache.v1.memory.objects import BytesBufferMemoryObj

__all__ = ["TENSOR_FORMATS", "MixedMemoryAllocator"]

# The formats placed in the pinned buffer.
TENSOR_FORMATS = frozenset(
    {
        MemoryFormat.KV_2LTD,
        MemoryFormat.KV_2TD,
        MemoryFormat.KV_T2D,
        MemoryFormat.KV_MLA_FMT,
        MemoryFormat.EC_TD,
        MemoryFormat.HS_TD,
    }
)


def _buffer_length(shapes: ShapesArg) -> int:
    first = shapes if isinstance(shapes, torch.Size) else shapes[0]
    if isinstance(first, int):
        return first
    return int(first[0])


class MixedMemoryAllocator(BufferPoolAllocator):
    """Pinned tensor objects and ``bytearray`` buffers behind one allocator."""

    def __init__(
        self,
        size: int,
        use_paging: bool = False,
        use_hugepages: bool = False,
        shapes: ShapesArg | None = None,
        dtypes: DtypesArg | None = None,
        fmt: MemoryFormat | None = None,
        align_bytes: int = TensorMemoryAllocator.ALIGN_BYTES,
        shm_name: str | None = None,
    ) -> None:
        if size <= 0:
            raise ValueError(f"allocator size must be > 0, got {size}")
        self.size = size
        self.use_hugepages = use_hugepages
        self.shm_name = shm_name
        buffer = allocate_cpu_memory(size, shm_name=shm_name, use_hugepages=use_hugepages)
        super().__init__(buffer, use_paging, shapes, dtypes, fmt, align_bytes)

    def allocate(
        self,
        shapes: ShapesArg,
        dtypes: DtypesArg,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
    ) -> MemoryObj | None:
        if fmt == MemoryFormat.BINARY_BUFFER:
            return BytesBufferMemoryObj(bytearray(_buffer_length(shapes)))
        _check_tensor_format(fmt)
        return super().allocate(shapes, dtypes, fmt, allocator_type)

    def batched_allocate(
        self,
        shapes: ShapesArg,
        dtypes: DtypesArg,
        batch_size: int,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
    ) -> list[MemoryObj] | None:
        if fmt == MemoryFormat.BINARY_BUFFER:
            if batch_size < 0:
                return None
            n = _buffer_length(shapes)
            return [BytesBufferMemoryObj(bytearray(n)) for _ in range(batch_size)]
        _check_tensor_format(fmt)
        return super().batched_allocate(shapes, dtypes, batch_size, fmt, allocator_type)

    def free(self, memory_obj: MemoryObj, allocator_type: str | None = None) -> None:
        if isinstance(memory_obj, BytesBufferMemoryObj):
            # Its bytearray is garbage collected; only the handle is retired.
            memory_obj.invalidate()
            return
        super().free(memory_obj, allocator_type)

    def batched_free(
        self,
        memory_objs: Sequence[MemoryObj],
        allocator_type: str | None = None,
        update_stats: bool = True,
    ) -> None:
        tensors = [o for o in memory_objs if not isinstance(o, BytesBufferMemoryObj)]
        for obj in memory_objs:
            if isinstance(obj, BytesBufferMemoryObj):
                obj.invalidate()
        super().batched_free(tensors, allocator_type, update_stats)

    def _release_buffer(self) -> None:
        free_cpu_memory(
            self.buffer, self.size, shm_name=self.shm_name, use_hugepages=self.use_hugepages
        )

    def __str__(self) -> str:
        return "MixedMemoryAllocator"


def _check_tensor_format(fmt: MemoryFormat) -> None:
    if fmt not in TENSOR_FORMATS:
        raise ValueError(f"Unsupported memory format: {fmt}")
