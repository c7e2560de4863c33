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
from collections import deque

import torch

from lmcache.compat.upstream_056.memory_allocators.buffer_views import (
    BufferViewAllocator,
    request_nbytes,
)
from lmcache.v1.memory.base import MemoryAllocatorInterface, MemoryObj
from lmcache.v1.memory.format import DtypesArg, MemoryFormat, ShapesArg
from lmcache.v1.memory.objects import TensorMemoryObj

logger = logging.getLogger(__name__)

__all__ = ["PagedTensorMemoryAllocator"]


class PagedTensorMemoryAllocator(BufferViewAllocator):
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
        super().__init__(tensor, parent_allocator)
        self.shapes, self.dtypes, self.align_bytes = request_nbytes(shapes, dtypes)
        self.fmt = fmt
        self.buffer_size = self.buffer.numel()
        if self.buffer_size == 0 or self.buffer_size % self.align_bytes:
            raise ValueError(
                f"buffer of {self.buffer_size} bytes is not a whole number of "
                f"{self.align_bytes}-byte pages"
            )
        self.paged_buffers: tuple[torch.Tensor, ...] = torch.split(self.buffer, self.align_bytes)
        self.free_blocks: deque[int] = deque(range(len(self.paged_buffers)))  # slots: pages

    @property
    def num_pages(self) -> int:
        return len(self.paged_buffers)

    @property
    def total_allocated_size(self) -> int:
        """Bytes of the pages handed out."""
        return len(self._live) * self.align_bytes

    @property
    def capacity_bytes(self) -> int:
        return self.buffer_size

    def get_paged_buffers(self) -> tuple[torch.Tensor, ...]:
        """The page views, in page-index order (for registering fixed I/O buffers)."""
        return self.paged_buffers

    def _check_request(self, nbytes: int) -> None:
        if nbytes > self.align_bytes:
            raise ValueError(f"request of {nbytes} bytes exceeds the {self.align_bytes}-byte page")

    def _take_slots(self, nbytes: int, count: int) -> list[tuple[int, int, int]] | None:
        """The first ``count`` free pages (the longest free first: FIFO reuse)."""
        if len(self.free_blocks) < count:
            return None
        pages = [self.free_blocks.popleft() for _ in range(count)]
        return [(p, p * self.align_bytes, self.align_bytes) for p in pages]

    def _give_slot(self, slot: int, memory_obj: TensorMemoryObj) -> None:
        self.free_blocks.append(slot)

    def _slot_of(self, memory_obj: MemoryObj) -> int:
        return memory_obj.metadata.address

    def _metadata_address(self, slot: int, offset: int) -> int:
        return slot  # upstream's paged objects carry the page index

    def _view(self, offset: int, phy_size: int, nbytes: int) -> torch.Tensor:
        return self.buffer[offset : offset + nbytes]

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

    def __str__(self) -> str:
        return "PagedTensorMemoryAllocator"
