"""What upstream's tensor and paged allocators share (our module): objects that are views
of one caller-owned buffer, handed out by slot and remembered until freed.

:class:`BufferViewAllocator` keeps the live objects by slot (a start unit or a page
index), checks every free against the object handed out at that slot (a stale handle
cannot free the slot's next owner), builds the :class:`TensorMemoryObj` views and reports
usage to :class:`~upstream_056.observability.LMCStatsMonitor`.  A subclass decides placement:
:meth:`BufferViewAllocator._take_slots` and :meth:`BufferViewAllocator._give_slot`.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Sequence

import torch

from lmcache.compat.upstream_056.observability import LMCStatsMonitor
from lmcache.v1.memory.base import MemoryAllocatorInterface, MemoryObj, MemoryObjMetadata
from lmcache.v1.memory.format import (
    DtypesArg,
    MemoryFormat,
    ShapesArg,
    normalize_shapes_dtypes,
    part_offsets,
)
from lmcache.v1.memory.objects import TensorMemoryObj

logger = logging.getLogger(__name__)

__all__ = ["BufferViewAllocator", "flat_bytes", "request_nbytes"]


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


class BufferViewAllocator(MemoryAllocatorInterface):
    """Objects as views of ``tensor``'s bytes, tracked by slot (see the module docstring)."""

    def __init__(
        self, tensor: torch.Tensor, parent_allocator: MemoryAllocatorInterface | None
    ) -> None:
        self.buffer = flat_bytes(tensor)
        self._live: dict[int, TensorMemoryObj] = {}  # slot -> the object handed out there
        self._lock = threading.Lock()
        self._parent = parent_allocator or self
        self.stats_monitor = LMCStatsMonitor.GetOrCreate()

    # -- placement, decided by the subclass (called with self._lock held) ----------------

    @abc.abstractmethod
    def _take_slots(self, nbytes: int, count: int) -> list[tuple[int, int, int]] | None:
        """``count`` free places for ``nbytes`` each as ``(slot, byte offset, physical
        size)``, or None (nothing taken) when they do not all fit."""

    @abc.abstractmethod
    def _give_slot(self, slot: int, memory_obj: TensorMemoryObj) -> None:
        """Make ``slot`` (held by ``memory_obj`` until now) free again."""

    @abc.abstractmethod
    def _slot_of(self, memory_obj: MemoryObj) -> int:
        """The slot ``memory_obj``'s metadata names."""

    def _check_request(self, nbytes: int) -> None:
        """Refuse a request no slot could hold (a ValueError); nothing by default."""

    def _metadata_address(self, slot: int, offset: int) -> int:
        """What ``metadata.address`` holds for an object at ``slot`` (its byte offset)."""
        return offset

    # -- the interface -------------------------------------------------------------------

    @property
    def num_active_allocations(self) -> int:
        return len(self._live)

    @property
    @abc.abstractmethod
    def total_allocated_size(self) -> int:
        """Bytes handed out."""

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
        """One object, or None when there is no room for it."""
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
        self._check_request(nbytes)
        if batch_size < 0:
            return None
        with self._lock:
            places = self._take_slots(nbytes, batch_size)
            if places is None:
                logger.debug("%s: no room for %d objects of %d bytes", self, batch_size, nbytes)
                return None
            objs = []
            for slot, offset, phy_size in places:
                obj = self._new_obj(slot, offset, phy_size, nbytes, shape_list, dtype_list, fmt)
                self._live[slot] = obj
                objs.append(obj)
        self._report()
        return objs

    def _new_obj(
        self,
        slot: int,
        offset: int,
        phy_size: int,
        nbytes: int,
        shapes: list[torch.Size],
        dtypes: list[torch.dtype],
        fmt: MemoryFormat,
    ) -> TensorMemoryObj:
        multi = len(shapes) > 1
        meta = MemoryObjMetadata(
            shape=shapes[0],
            dtype=dtypes[0],
            address=self._metadata_address(slot, offset),
            phy_size=phy_size,
            ref_count=1,
            fmt=fmt,
            shapes=shapes if multi else None,
            dtypes=dtypes if multi else None,
        )
        return TensorMemoryObj(self._view(offset, phy_size, nbytes), meta, self._parent)

    def _view(self, offset: int, phy_size: int, nbytes: int) -> torch.Tensor:
        """The bytes an object at ``offset`` gets (its whole physical size by default)."""
        return self.buffer[offset : offset + phy_size]

    def free(self, memory_obj: MemoryObj, allocator_type: str | None = None) -> None:
        """Give the object's slot back; freeing a stale or foreign object does nothing."""
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
        slot = self._slot_of(memory_obj)
        held = self._live.get(slot)
        if held is not memory_obj:
            logger.debug("%s: free of an object it does not hold (already freed?)", self)
            return
        del self._live[slot]
        self._give_slot(slot, held)
        held.invalidate()

    def _report(self) -> None:
        self.stats_monitor.update_local_cache_usage(self.total_allocated_size)
        self.stats_monitor.update_active_memory_objs_count(self.num_active_allocations)

    def close(self) -> None:
        """Nothing to release: the buffer belongs to the caller."""
        if self._live:
            logger.debug("%s closed with %d live objects", self, len(self._live))
