"""Upstream's ``TensorMemoryAllocator``: variable-size memory objects in a caller's tensor.

Objects are byte ranges of the flat uint8 view of the given tensor, placed by the memory
layer's buddy core (:class:`~lmcache.v1.memory.buddy.BuddySpace`) in units of
``align_bytes``.  Differences from upstream:
  * placement is first-fit buddy (freed neighbours always coalesce) rather than upstream's
    explicit free list; ``batched_allocate`` is all or nothing but does not need the
    batch to be contiguous;
  * a free is matched against the object the allocator handed out at that address, so a
    stale handle freed twice cannot release a block that was handed out again since;
  * ``parent_allocator`` (keyword) names the allocator the objects report as ``parent()``
    and free themselves through, so a wrapper that owns this allocator sees every free;
  * ``init_address_space`` (bytes) limits placement to a prefix of the buffer, as
    upstream; the prefix grows with :meth:`TensorMemoryAllocator.extend_address_space`
    (upstream's ``address_manager.sbrk``; there is no separate address manager).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import torch

from lmcache.observability import LMCStatsMonitor
from lmcache.v1.memory.base import MemoryAllocatorInterface, MemoryObj, MemoryObjMetadata
from lmcache.v1.memory.buddy import BuddySpace
from lmcache.v1.memory.format import (
    DtypesArg,
    MemoryFormat,
    ShapesArg,
    normalize_shapes_dtypes,
    part_offsets,
)
from lmcache.v1.memory.objects import TensorMemoryObj

logger = logging.getLogger(__name__)

__all__ = ["TensorMemoryAllocator", "flat_bytes", "request_nbytes"]


def flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor as a flat uint8 view (no copy)."""
    if not tensor.is_contiguous():
        raise ValueError("an allocator buffer must be a contiguous tensor")
    return tensor.reshape(-1).view(torch.uint8)


def request_nbytes(
    shapes: ShapesArg, dtypes: DtypesArg
) -> tuple[list[torch.Size], list[torch.dtype], int]:
    """Normalised shapes and dtypes of a request and its size in bytes (> 0)."""
    shape_list, dtype_list = normalize_shapes_dtypes(shapes, dtypes)
    nbytes = part_offsets(shape_list, dtype_list)[-1]
    if nbytes <= 0:
        raise ValueError(f"size must be greater than 0 (shapes {shape_list})")
    return shape_list, dtype_list, nbytes


class TensorMemoryAllocator(MemoryAllocatorInterface):
    """Buddy placement of variable-size objects in a caller-owned tensor."""

    ALIGN_BYTES = 4096

    def __init__(
        self,
        tensor: torch.Tensor,
        align_bytes: int = ALIGN_BYTES,
        init_address_space: int | None = None,
        *,
        parent_allocator: MemoryAllocatorInterface | None = None,
    ) -> None:
        """``init_address_space``: bytes of the buffer's start that objects may use at
        first (default: all of it); see :meth:`extend_address_space`."""
        if align_bytes <= 0 or align_bytes & (align_bytes - 1):
            raise ValueError(f"align_bytes must be a positive power of two, got {align_bytes}")
        self.buffer = flat_bytes(tensor)
        self.align_bytes = align_bytes
        space = self.buffer.numel() if init_address_space is None else init_address_space
        if not 0 <= space <= self.buffer.numel():
            raise ValueError(
                f"init_address_space must be within the buffer's {self.buffer.numel()} bytes,"
                f" got {space}"
            )
        self._space_bytes = space
        units = space // align_bytes
        if units == 0:
            raise ValueError(
                f"address space of {space} bytes is smaller than one {align_bytes}-byte unit"
            )
        # A tail shorter than one unit is never handed out.
        self._space = BuddySpace(units)
        self._live: dict[int, TensorMemoryObj] = {}  # start unit -> the object there
        self._lock = threading.Lock()
        self._parent = parent_allocator or self
        self.stats_monitor = LMCStatsMonitor.GetOrCreate()

    @property
    def total_allocated_size(self) -> int:
        """Bytes handed out (whole units)."""
        return self._space.used_units * self.align_bytes

    def extend_address_space(self, nbytes: int) -> int:
        """Let objects use ``nbytes`` more of the buffer (upstream's ``sbrk``).

        The address space never grows past the buffer; objects use whole units of it, and
        objects already handed out stay where they are.  Returns the address space in
        bytes afterwards.
        """
        if nbytes < 0:
            raise ValueError(f"cannot extend the address space by {nbytes} bytes")
        with self._lock:
            self._space_bytes = min(self._space_bytes + nbytes, self.buffer.numel())
            self._space.grow(self._space_bytes // self.align_bytes)
            return self._space_bytes

    @property
    def num_active_allocations(self) -> int:
        return len(self._live)

    @property
    def capacity_bytes(self) -> int:
        return self._space.total_units * self.align_bytes

    @property
    def used_bytes(self) -> int:
        return self.total_allocated_size

    def allocate(
        self,
        shapes: ShapesArg,
        dtypes: DtypesArg,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
    ) -> TensorMemoryObj | None:
        """One object, or None when no free run is large enough."""
        objs = self._allocate_many(shapes, dtypes, 1, fmt)
        return objs[0] if objs else None

    def batched_allocate(
        self,
        shapes: ShapesArg,
        dtypes: DtypesArg,
        batch_size: int,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
    ) -> list[MemoryObj] | None:
        """``batch_size`` equal objects, or None (nothing taken) if they do not all fit.

        A negative ``batch_size`` gets None (as upstream), a zero-size shape ValueError.
        """
        objs = self._allocate_many(shapes, dtypes, batch_size, fmt)
        return None if objs is None else list(objs)

    def _allocate_many(
        self, shapes: ShapesArg, dtypes: DtypesArg, batch_size: int, fmt: MemoryFormat
    ) -> list[TensorMemoryObj] | None:
        shape_list, dtype_list, nbytes = request_nbytes(shapes, dtypes)
        if batch_size < 0:
            return None
        units = -(-nbytes // self.align_bytes)
        with self._lock:
            starts = self._take_all(units, batch_size)
            if starts is None:
                return None
            objs = [self._make_obj(s, units, shape_list, dtype_list, fmt) for s in starts]
            for start, obj in zip(starts, objs, strict=True):
                self._live[start] = obj
        self._report()
        return objs

    def _take_all(self, units: int, count: int) -> list[int] | None:
        starts: list[int] = []
        for _ in range(count):
            start = self._space.take(units)
            if start is None:
                for taken in starts:
                    self._space.give(taken, units)
                return None
            starts.append(start)
        return starts

    def _make_obj(
        self,
        start: int,
        units: int,
        shapes: list[torch.Size],
        dtypes: list[torch.dtype],
        fmt: MemoryFormat,
    ) -> TensorMemoryObj:
        address, phy_size = start * self.align_bytes, units * self.align_bytes
        multi = len(shapes) > 1
        meta = MemoryObjMetadata(
            shape=shapes[0],
            dtype=dtypes[0],
            address=address,
            phy_size=phy_size,
            ref_count=1,
            fmt=fmt,
            shapes=shapes if multi else None,
            dtypes=dtypes if multi else None,
        )
        raw = self.buffer[address : address + phy_size]
        return TensorMemoryObj(raw, meta, self._parent)

    def free(self, memory_obj: MemoryObj, allocator_type: str | None = None) -> None:
        """Give the object's bytes back; freeing a stale or foreign object does nothing."""
        with self._lock:
            self._free_locked(memory_obj)
        self._report()

    def batched_free(
        self,
        memory_objs: Sequence[MemoryObj],
        allocator_type: str | None = None,
        update_stats: bool = True,
    ) -> None:
        with self._lock:
            for obj in memory_objs:
                self._free_locked(obj)
        if update_stats:
            self._report()

    def _free_locked(self, memory_obj: MemoryObj) -> None:
        start = memory_obj.metadata.address // self.align_bytes
        if self._live.get(start) is not memory_obj:
            logger.debug("free of an object this allocator does not hold (already freed?)")
            return
        del self._live[start]
        self._space.give(start, memory_obj.metadata.phy_size // self.align_bytes)
        memory_obj.invalidate()

    def _report(self) -> None:
        self.stats_monitor.update_local_cache_usage(self.total_allocated_size)
        self.stats_monitor.update_active_memory_objs_count(self.num_active_allocations)

    def memcheck(self) -> bool:
        """Free blocks and live objects tile the buffer, with every free buddy merged."""
        with self._lock:
            runs = [(s, o.metadata.phy_size // self.align_bytes) for s, o in self._live.items()]
            ok = self._space.is_consistent(runs)
        if not ok:
            logger.error("%s: free list and live objects are inconsistent", self)
        return ok

    def close(self) -> None:
        """Nothing to release: the buffer belongs to the caller."""
        if self._live:
            logger.debug("%s closed with %d live objects", self, len(self._live))

    def __str__(self) -> str:
        return "TensorMemoryAllocator"
