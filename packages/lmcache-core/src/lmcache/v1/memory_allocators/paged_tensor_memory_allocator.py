"""Upstream's ``PagedTensorMemoryAllocator``: fixed-size pages of a caller's tensor.

The buffer is cut into pages of the size of one object of the configured ``shapes`` and
``dtypes``; every allocation takes one free page (an object of a smaller shape uses the
start of its page).  Freed pages go to the back of a FIFO, so the page freed last is
reused last.  As upstream, ``metadata.address`` is the page index, not a byte offset.

Differences from upstream:
  * every allocation returns a fresh :class:`~lmcache.v1.memory.objects.TensorMemoryObj`
    for the page (upstream recycles the object itself), so a stale handle to a freed page
    stays invalid and cannot free or read the page's next owner; a recycled page
    therefore always starts with its layout-derived size;
  * a request larger than a page, or of zero bytes, is a ValueError (upstream would hand
    out a short view), and a buffer that is not a whole number of pages is a ValueError
    (upstream asserts);
  * ``parent_allocator`` (keyword) names the allocator the objects report as ``parent()``.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence

import torch

from lmcache.observability import LMCStatsMonitor
from lmcache.v1.memory.base import MemoryAllocatorInterface, MemoryObj, MemoryObjMetadata
from lmcache.v1.memory.format import DtypesArg, MemoryFormat, ShapesArg
from lmcache.v1.memory.objects import TensorMemoryObj
from lmcache.v1.memory_allocators.tensor_memory_allocator import flat_bytes, request_nbytes

logger = logging.getLogger(__name__)

__all__ = ["PagedTensorMemoryAllocator"]


class PagedTensorMemoryAllocator(MemoryAllocatorInterface):
    """One object per page of a caller-owned tensor."""

    def __init__(
        self,
        tensor: torch.Tensor,
        shapes: ShapesArg,
        dtypes: DtypesArg,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        *,
        parent_allocator: MemoryAllocatorInterface | None = None,
    ) -> None:
        self.buffer = flat_bytes(tensor)
        self.shapes, self.dtypes, self.align_bytes = request_nbytes(shapes, dtypes)
        self.fmt = fmt
        self.buffer_size = self.buffer.numel()
        if self.buffer_size == 0 or self.buffer_size % self.align_bytes:
            raise ValueError(
                f"buffer of {self.buffer_size} bytes is not a whole number of "
                f"{self.align_bytes}-byte pages"
            )
        self.paged_buffers: tuple[torch.Tensor, ...] = torch.split(self.buffer, self.align_bytes)
        self.free_blocks: deque[int] = deque(range(len(self.paged_buffers)))
        self._live: dict[int, TensorMemoryObj] = {}  # page index -> the object there
        self._lock = threading.Lock()
        self._parent = parent_allocator or self
        self.stats_monitor = LMCStatsMonitor.GetOrCreate()

    @property
    def num_pages(self) -> int:
        return len(self.paged_buffers)

    @property
    def num_active_allocations(self) -> int:
        return len(self._live)

    @property
    def total_allocated_size(self) -> int:
        """Bytes of the pages handed out."""
        return len(self._live) * self.align_bytes

    @property
    def capacity_bytes(self) -> int:
        return self.buffer_size

    @property
    def used_bytes(self) -> int:
        return self.total_allocated_size

    def get_paged_buffers(self) -> tuple[torch.Tensor, ...]:
        """The page views, in page-index order (for registering fixed I/O buffers)."""
        return self.paged_buffers

    def allocate(
        self,
        shapes: ShapesArg,
        dtypes: DtypesArg,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
    ) -> TensorMemoryObj | None:
        """An object on the first free page, or None when every page is taken."""
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
        """``batch_size`` pages, or None (nothing taken) if there are not that many free."""
        objs = self._allocate_many(shapes, dtypes, batch_size, fmt)
        return None if objs is None else list(objs)

    def _allocate_many(
        self, shapes: ShapesArg, dtypes: DtypesArg, batch_size: int, fmt: MemoryFormat
    ) -> list[TensorMemoryObj] | None:
        shape_list, dtype_list, nbytes = request_nbytes(shapes, dtypes)
        if nbytes > self.align_bytes:
            raise ValueError(f"request of {nbytes} bytes exceeds the {self.align_bytes}-byte page")
        if batch_size < 0:
            return None
        with self._lock:
            if len(self.free_blocks) < batch_size:
                logger.debug("no %d free pages (%d free)", batch_size, len(self.free_blocks))
                return None
            pages = [self.free_blocks.popleft() for _ in range(batch_size)]
            objs = [self._make_obj(p, nbytes, shape_list, dtype_list, fmt) for p in pages]
            self._live.update(zip(pages, objs, strict=True))
        self._report()
        return objs

    def _make_obj(
        self,
        page: int,
        nbytes: int,
        shapes: list[torch.Size],
        dtypes: list[torch.dtype],
        fmt: MemoryFormat,
    ) -> TensorMemoryObj:
        multi = len(shapes) > 1
        meta = MemoryObjMetadata(
            shape=shapes[0],
            dtype=dtypes[0],
            address=page,
            phy_size=self.align_bytes,
            ref_count=1,
            fmt=fmt,
            shapes=shapes if multi else None,
            dtypes=dtypes if multi else None,
        )
        return TensorMemoryObj(self.paged_buffers[page][:nbytes], meta, self._parent)

    def free(self, memory_obj: MemoryObj, allocator_type: str | None = None) -> None:
        """Put the object's page at the back of the free queue (stale handles: no-op)."""
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
        page = memory_obj.metadata.address
        if self._live.get(page) is not memory_obj:
            logger.debug("free of a page object this allocator does not hold (already freed?)")
            return
        del self._live[page]
        self.free_blocks.append(page)
        memory_obj.invalidate()

    def _report(self) -> None:
        self.stats_monitor.update_local_cache_usage(self.total_allocated_size)
        self.stats_monitor.update_active_memory_objs_count(self.num_active_allocations)

    def memcheck(self) -> bool:
        """Every page is either free (once) or held by exactly one live object."""
        with self._lock:
            free = list(self.free_blocks)
            ok = (
                len(set(free)) == len(free)
                and not set(free) & self._live.keys()
                and len(free) + len(self._live) == self.num_pages
            )
        if not ok:
            logger.error("%s: free pages and live objects are inconsistent", self)
        return ok

    def close(self) -> None:
        """Nothing to release: the buffer belongs to the caller."""
        if self._live:
            logger.debug("%s closed with %d live objects", self, len(self._live))

    def __str__(self) -> str:
        return "PagedTensorMemoryAllocator"
