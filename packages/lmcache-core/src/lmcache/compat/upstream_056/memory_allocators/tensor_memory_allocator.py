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

import torch

from lmcache.compat.upstream_056.memory_allocators.buffer_views import (
    BufferViewAllocator,
    flat_bytes,
    request_nbytes,
)
from lmcache.v1.memory.base import MemoryAllocatorInterface, MemoryObj
from lmcache.v1.memory.buddy import BuddySpace
from lmcache.v1.memory.objects import TensorMemoryObj

logger = logging.getLogger(__name__)

# flat_bytes and request_nbytes stay importable from here (their first home).
__all__ = ["TensorMemoryAllocator", "flat_bytes", "request_nbytes"]


class TensorMemoryAllocator(BufferViewAllocator):
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
        super().__init__(tensor, parent_allocator)
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
        self._space = BuddySpace(units)  # slots are start units

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
    def capacity_bytes(self) -> int:
        return self._space.total_units * self.align_bytes

    def _take_slots(self, nbytes: int, count: int) -> list[tuple[int, int, int]] | None:
        units = -(-nbytes // self.align_bytes)
        starts: list[int] = []
        for _ in range(count):
            start = self._space.take(units)
            if start is None:
                for taken in starts:
                    self._space.give(taken, units)
                return None
            starts.append(start)
        return [(s, s * self.align_bytes, units * self.align_bytes) for s in starts]

    def _give_slot(self, slot: int, memory_obj: TensorMemoryObj) -> None:
        self._space.give(slot, memory_obj.metadata.phy_size // self.align_bytes)

    def _slot_of(self, memory_obj: MemoryObj) -> int:
        return memory_obj.metadata.address // self.align_bytes

    def memcheck(self) -> bool:
        """Free blocks and live objects tile the buffer, with every free buddy merged."""
        with self._lock:
            runs = [(s, o.metadata.phy_size // self.align_bytes) for s, o in self._live.items()]
            ok = self._space.is_consistent(runs)
        if not ok:
            logger.error("%s: free list and live objects are inconsistent", self)
        return ok

    def __str__(self) -> str:
        return "TensorMemoryAllocator"
