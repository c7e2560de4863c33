"""The buddy bookkeeping shared by the allocators: which units of an address space are free.

:class:`BuddySpace` knows nothing of buffers, tensors or objects; it hands out and takes
back runs of ``units`` inside ``[0, total_units)``.  The host allocator
(:mod:`lmcache.v1.memory.allocator`) and upstream's ``TensorMemoryAllocator`` over a
caller's buffer (``lmcache.compat.upstream_056.memory_allocators``) both place
their objects with it, so there is one allocation algorithm in the memory layer.

Not thread-safe: each owner holds its own lock around every call.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

__all__ = ["BuddySpace", "aligned_pieces"]


def _lowbit(x: int) -> int:
    return x & -x


def _floor_pow2(x: int) -> int:
    return 1 << (x.bit_length() - 1)


def aligned_pieces(start: int, length: int) -> list[tuple[int, int]]:
    """Split ``[start, start + length)`` into power-of-two blocks aligned to their size."""
    pieces = []
    pos, end = start, start + length
    while pos < end:
        size = _floor_pow2(end - pos)
        if pos:
            size = min(size, _lowbit(pos))
        pieces.append((pos, size))
        pos += size
    return pieces


class BuddySpace:
    """Free-block bookkeeping of a buddy allocator over ``total_units`` units.

    Why buddy and not slabs: slabs need the chunk size up front and strand memory when
    the mix of sizes changes, while buddy bookkeeping needs no size hint and coalesces
    every freed block with its free buddy in O(log n).  Two departures from textbook
    buddy keep it from wasting memory:
      * no rounding to a power of two: a run occupies exactly the units asked for; it is
        given back as aligned power-of-two pieces, which the buddy merge then coalesces
        with whatever is free around them;
      * placement is first fit by address over runs of adjacent free blocks, so runs of
        one size pack back to back instead of each claiming an aligned 2^k block.
    """

    def __init__(self, total_units: int) -> None:
        if total_units <= 0:
            raise ValueError(f"a buddy space needs at least one unit, got {total_units}")
        self.total_units = total_units
        self.used_units = 0
        self._max_order = total_units.bit_length() - 1
        # Free blocks: start unit -> order, plus the starts in address order for first fit.
        self._free_order: dict[int, int] = {}
        self._free_starts: list[int] = []
        for start, length in aligned_pieces(0, total_units):
            self._insert_free(start, length.bit_length() - 1)

    def take(self, units: int) -> int | None:
        """Start of a run of ``units`` free units (now used), or None if none fits.

        Taking the lowest run that fits, rather than the smallest aligned block of the
        rounded-up order, packs same-sized runs back to back: with plain buddy placement
        every 192 KiB object would sit at a 256 KiB boundary and strand the gaps.
        """
        if units <= 0:
            raise ValueError(f"size must be greater than 0 (got {units} units)")
        starts, orders = self._free_starts, self._free_order
        run_start, run_end, first = -1, -1, 0
        for i, start in enumerate(starts):
            if start != run_end:
                run_start, first = start, i
            run_end = start + (1 << orders[start])
            if run_end - run_start >= units:
                break
        else:
            return None
        for start in starts[first : i + 1]:
            del orders[start]
        del starts[first : i + 1]
        end = run_start + units
        for piece_start, piece_len in aligned_pieces(end, run_end - end):
            self._merge_in(piece_start, piece_len.bit_length() - 1)
        self.used_units += units
        return run_start

    def give(self, start: int, units: int) -> None:
        """Return the run ``[start, start + units)`` that :meth:`take` handed out."""
        self.used_units -= units
        for piece_start, piece_len in aligned_pieces(start, units):
            self._merge_in(piece_start, piece_len.bit_length() - 1)

    def grow(self, total_units: int) -> None:
        """Extend the space to ``total_units`` units; the new units at the end are free.

        Runs already handed out keep their starts (nothing moves), and the new units merge
        with any free block they are the buddy of.  Shrinking is refused (ValueError).
        """
        if total_units < self.total_units:
            raise ValueError(
                f"a buddy space cannot shrink ({self.total_units} -> {total_units} units)"
            )
        old_total = self.total_units
        self.total_units = total_units
        # Raise the merge cap first so that old blocks can pair with the new units.
        self._max_order = total_units.bit_length() - 1
        for start, length in aligned_pieces(old_total, total_units - old_total):
            self._merge_in(start, length.bit_length() - 1)

    @property
    def free_units(self) -> int:
        return self.total_units - self.used_units

    def largest_free_units(self) -> int:
        """Size of the largest single free block (a lower bound of the largest run)."""
        return max((1 << o for o in self._free_order.values()), default=0)

    def is_consistent(self, used_runs: Iterable[tuple[int, int]]) -> bool:
        """Free blocks and ``used_runs`` (start, units) tile the space, buddies all merged."""
        if sorted(self._free_order) != self._free_starts:
            return False
        spans = list(used_runs)
        if sum(n for _, n in spans) != self.used_units:
            return False
        for s, order in self._free_order.items():
            if s % (1 << order):
                return False
            if order < self._max_order and self._free_order.get(s ^ (1 << order)) == order:
                return False
            spans.append((s, 1 << order))
        spans.sort()
        pos = 0
        for s, n in spans:
            if s != pos:
                return False
            pos += n
        return pos == self.total_units

    def _insert_free(self, start: int, order: int) -> None:
        self._free_order[start] = order
        bisect.insort(self._free_starts, start)

    def _remove_free(self, start: int) -> None:
        del self._free_order[start]
        del self._free_starts[bisect.bisect_left(self._free_starts, start)]

    def _merge_in(self, start: int, order: int) -> None:
        while order < self._max_order:
            buddy = start ^ (1 << order)
            if self._free_order.get(buddy) != order:
                break
            self._remove_free(buddy)
            start = min(start, buddy)
            order += 1
        self._insert_free(start, order)
