"""The host allocator: a buddy allocator over one preallocated (optionally shared) buffer.

:class:`HostMemoryAllocator` hands out :class:`~lmcache.v1.memory.objects.TensorMemoryObj`
views of its buffer; with shared memory the buffer is a POSIX segment made by
:mod:`lmcache.v1.memory.shm`, so other processes can map the same bytes.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import torch

from lmcache.v1.memory.base import HostBufferAllocator, MemoryObj, MemoryObjMetadata
from lmcache.v1.memory.buddy import BuddySpace
from lmcache.v1.memory.format import (
    DtypesArg,
    MemoryFormat,
    ShapesArg,
    normalize_shapes_dtypes,
    part_offsets,
)
from lmcache.v1.memory.objects import TensorMemoryObj
from lmcache.v1.memory.shm import create_host_segment, release_host_segment

logger = logging.getLogger(__name__)


@dataclass
class FreeBlock:
    """A free byte range ``[start, start + size)``."""

    start: int
    size: int

    def can_be_coalesced(self, succ: FreeBlock) -> bool:
        return self.start + self.size == succ.start


class HostMemoryAllocator(HostBufferAllocator):
    """Buddy allocator over one preallocated host buffer, optionally POSIX shared memory.

    Placement is :class:`~lmcache.v1.memory.buddy.BuddySpace` (first-fit buddy, no
    power-of-two rounding) in units of ``min_block_size``.
    Internal waste is below ``min_block_size`` per object, and all free space coalesces
    back into one block when the objects are gone (``memcheck`` verifies the tiling).
    """

    def __init__(
        self,
        size: int,
        min_block_size: int = 256,
        use_shm: bool = False,
        shm_name: str | None = None,
        pin_memory: bool = False,
    ) -> None:
        if min_block_size <= 0 or min_block_size & (min_block_size - 1):
            raise ValueError(f"min_block_size must be a power of two, got {min_block_size}")
        if size < min_block_size:
            raise ValueError(f"allocator size {size} smaller than one block ({min_block_size})")
        self._unit = min_block_size
        self._total_units = size // min_block_size
        self._size = self._total_units * min_block_size
        self._space = BuddySpace(self._total_units)
        self._allocated: dict[int, int] = {}  # start unit -> length in units
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self.counter_lock = threading.Lock()
        self.shm_name: str | None = None
        self._owned_segment: str | None = None
        self.buffer = self._make_buffer(use_shm or shm_name is not None, shm_name, pin_memory)

    def _make_buffer(self, use_shm: bool, shm_name: str | None, pin_memory: bool) -> torch.Tensor:
        if not use_shm:
            buf = torch.empty(self._size, dtype=torch.uint8)
            if pin_memory and torch.cuda.is_available():
                buf = buf.pin_memory()
            elif pin_memory:
                logger.debug("pin_memory requested without an accelerator; using pageable memory")
            return buf
        self.shm_name, buffer = create_host_segment(self._size, shm_name)
        self._owned_segment = self.shm_name
        return buffer

    @staticmethod
    def from_config(config: Any, shm_name: str | None = None) -> HostMemoryAllocator:
        """Allocator of ``config.max_local_cpu_size`` GB (shared memory when named)."""
        size = int(config.max_local_cpu_size * 1024**3)
        extra = getattr(config, "extra_config", None) or {}
        shm = shm_name or extra.get("local_cpu.shm_name")
        return HostMemoryAllocator(
            size,
            use_shm=bool(shm) or bool(extra.get("local_cpu.use_shm", False)),
            shm_name=shm or None,
            pin_memory=bool(extra.get("local_cpu.pin_memory", False)),
        )

    # -- public API -------------------------------------------------------------------------

    @property
    def capacity_bytes(self) -> int:
        return self._size

    @property
    def used_bytes(self) -> int:
        return self._space.used_units * self._unit

    @property
    def num_allocated(self) -> int:
        return len(self._allocated)

    def allocate(
        self,
        shapes: ShapesArg,
        dtypes: DtypesArg,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
    ) -> TensorMemoryObj | None:
        shape_list, dtype_list = normalize_shapes_dtypes(shapes, dtypes)
        nbytes = part_offsets(shape_list, dtype_list)[-1]
        units = max(1, -(-nbytes // self._unit))
        if units > self._total_units:
            return None
        with self._lock:
            start = self._space.take(units)
            if start is None:
                return None
            self._allocated[start] = units
        multi = len(shape_list) > 1
        meta = MemoryObjMetadata(
            shape=shape_list[0],
            dtype=dtype_list[0],
            address=start * self._unit,
            phy_size=units * self._unit,
            ref_count=1,
            fmt=fmt,
            shapes=shape_list if multi else None,
            dtypes=dtype_list if multi else None,
        )
        return TensorMemoryObj(None, meta, self)

    def free(self, memory_obj: MemoryObj, allocator_type: str | None = None) -> None:
        start = memory_obj.metadata.address // self._unit
        with self._lock:
            units = self._allocated.pop(start, None)
            if units is None:
                logger.error("free of an object this allocator does not own (double free?)")
                return
            self._space.give(start, units)
            self._freed.notify_all()
        memory_obj.invalidate()

    def wait_for_free(self, timeout: float) -> bool:
        with self._freed:
            return self._freed.wait(timeout)

    def largest_free_block(self) -> int:
        with self._lock:
            return self._space.largest_free_units() * self._unit

    def memcheck(self) -> bool:
        """Free blocks and live objects tile the buffer exactly, with no buddy left unmerged."""
        with self._lock:
            return self._space.is_consistent(self._allocated.items())

    def close(self) -> None:
        if self._allocated:
            logger.warning("closing allocator with %d live objects", len(self._allocated))
        if self._owned_segment is not None:
            release_host_segment(self._owned_segment)
            self._owned_segment = None

    def __enter__(self) -> HostMemoryAllocator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
