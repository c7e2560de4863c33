"""Adaptive Replacement Cache (Megiddo and Modha, FAST 2003), over our policy interface.

Resident keys live in two LRU lists: ``T1`` holds keys seen once since they entered,
``T2`` keys seen at least twice.  Two ghost lists remember keys (not data) recently
evicted from each: ``B1`` from ``T1``, ``B2`` from ``T2``.  A put of a key remembered in
``B1`` means ``T1`` was too small, so its target size ``p`` grows; one remembered in
``B2`` shrinks it.  A one-pass scan therefore only churns ``T1`` and leaves the reused
keys in ``T2`` alone, which plain LRU cannot do.

The tier has a byte budget, not an entry count, so ARC's capacity ``c`` is the largest
number of keys the tier has held (right for equal-sized chunks, as upstream's ARC does).
Only evictions (:meth:`on_evict`) feed the ghost lists; an explicit removal forgets the
key.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator

from lmcache.v1.storage_backend.cache_policy.base_policy import BaseCachePolicy

_List = OrderedDict[Hashable, None]


class ARCCachePolicy(BaseCachePolicy[Hashable]):
    """ARC: balances recency (``T1``) and frequency (``T2``) by learning from its misses."""

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and capacity <= 0:
            raise ValueError(f"ARC capacity must be positive (got {capacity})")
        self._t1: _List = OrderedDict()
        self._t2: _List = OrderedDict()
        self._b1: _List = OrderedDict()
        self._b2: _List = OrderedDict()
        self._target_t1 = 0.0  # ARC's p
        self._fixed_capacity = capacity
        self._capacity = capacity or 0

    # -- events ---------------------------------------------------------------------------

    def on_put(self, key: Hashable) -> None:
        if key in self._t1 or key in self._t2:
            self.on_hit(key)  # a second put is a second reference
            return
        if key in self._b1:
            # A recent T1 victim came back: T1 deserved more room.
            step = max(1.0, len(self._b2) / len(self._b1))
            self._target_t1 = min(float(self._capacity), self._target_t1 + step)
            del self._b1[key]
            self._t2[key] = None
        elif key in self._b2:
            step = max(1.0, len(self._b1) / len(self._b2))
            self._target_t1 = max(0.0, self._target_t1 - step)
            del self._b2[key]
            self._t2[key] = None
        else:
            self._t1[key] = None
        if self._fixed_capacity is None:
            self._capacity = max(self._capacity, len(self))
        self._trim_ghosts()

    def on_hit(self, key: Hashable) -> None:
        if key in self._t1:
            del self._t1[key]
            self._t2[key] = None
        elif key in self._t2:
            self._t2.move_to_end(key)

    def on_remove(self, key: Hashable) -> None:
        for entries in (self._t1, self._t2, self._b1, self._b2):
            entries.pop(key, None)

    def on_evict(self, key: Hashable) -> None:
        if key in self._t1:
            del self._t1[key]
            self._b1[key] = None
        elif key in self._t2:
            del self._t2[key]
            self._b2[key] = None
        self._trim_ghosts()

    def _trim_ghosts(self) -> None:
        """Keep ARC's bounds: |T1|+|B1| <= c and all four lists <= 2c."""
        c = self._capacity
        if c <= 0:
            return
        while self._b1 and len(self._t1) + len(self._b1) > c:
            self._b1.popitem(last=False)
        while (self._b1 or self._b2) and len(self) + len(self._b1) + len(self._b2) > 2 * c:
            (self._b2 if self._b2 else self._b1).popitem(last=False)

    # -- victims --------------------------------------------------------------------------

    def candidates(self) -> Iterator[Hashable]:
        """ARC's REPLACE, repeated: the LRU end of ``T1`` while ``T1`` holds at least
        ``int(p)`` keys, else of ``T2``; either list once the other runs out.

        The tier evicts after the write, not for one incoming key, so the paper's tie
        rule (which looks at where the incoming key was) cannot apply; a tie goes to
        ``T1``, as in upstream's and vLLM's ARC.  The count of ``T1`` keys still ahead
        drops with every ``T1`` key yielded (taken by the tier or skipped as pinned), so
        a long victim run alternates as ARC would.
        """
        t1, t2 = iter(self._t1), iter(self._t2)
        t1_left, t2_left = len(self._t1), len(self._t2)
        target = int(self._target_t1)
        while t1_left or t2_left:
            from_t1 = t1_left > 0 and (t1_left >= target or t2_left == 0)
            if from_t1:
                t1_left -= 1
                yield next(t1)
            else:
                t2_left -= 1
                yield next(t2)

    # -- introspection --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    @property
    def capacity(self) -> int:
        """ARC's ``c``: the entry count the ghost lists are bounded by."""
        return self._capacity

    @property
    def target_t1_size(self) -> float:
        """ARC's ``p``: how many resident keys it currently wants in ``T1``."""
        return self._target_t1

    def lists(self) -> dict[str, list[Hashable]]:
        """Copies of the four lists, LRU end first (for tests and diagnostics)."""
        return {
            "t1": list(self._t1),
            "t2": list(self._t2),
            "b1": list(self._b1),
            "b2": list(self._b2),
        }
