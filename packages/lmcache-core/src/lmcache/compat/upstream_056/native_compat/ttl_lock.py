"""A counting lock that lapses, with upstream LMCache 0.5.6's ``lmcache_native.TTLLock`` API.

Upstream builds ``TTLLock`` in C++ (two atomics behind pybind11); its L1 manager gives
every cached object a read lock and a write lock of this kind, so that a reader or
writer that dies without unlocking cannot pin the object for ever.  It is not a mutex:
nothing ever waits on it.  It is a counter of holders with a deadline:

* ``lock()`` adds a holder and pushes the deadline to now + ``ttl_second``; when the
  previous deadline has already passed, the old count is void and the count restarts
  at 1 (holders that let it lapse are forgotten);
* ``unlock()`` removes a holder, never going below 0, whether or not the deadline has
  passed (it does not touch the deadline);
* ``is_locked()`` is true while the count is positive **and** the deadline is in the
  future, so a lapsed lock reads unlocked without anyone calling ``unlock``;
* ``reset()`` forgets every holder and the deadline.

Every operation takes one ``threading.Lock``, so concurrent callers see each call as
atomic, as upstream's compare-and-swap loops make them.  Time is ``time.monotonic``
(upstream: ``steady_clock``), so wall-clock jumps do not expire or extend a lock.
Upstream counts in whole milliseconds; here the deadline is exact, which only moves an
expiry by less than a millisecond.  A ``ttl_second`` of 0 gives a lock that never reads
locked.
"""

from __future__ import annotations

import math
import threading
import time

from lmcache.compat.upstream_056.native_compat._convert import as_unsigned

__all__ = ["TTLLock"]


def _as_uint32(value: object, name: str) -> int:
    return as_unsigned(value, name, 32)


class TTLLock:
    """A holder count that reads unlocked once ``ttl_second`` pass without a ``lock()``."""

    __slots__ = ("_count", "_deadline", "_guard", "_ttl_s")

    def __init__(self, ttl_second: int = 300) -> None:
        self._ttl_s = float(_as_uint32(ttl_second, "ttl_second"))
        self._guard = threading.Lock()
        self._count = 0
        # -inf: "already expired", whatever the monotonic clock's origin.
        self._deadline = -math.inf

    def lock(self) -> None:
        """Add a holder and refresh the deadline; after a lapse the count restarts at 1."""
        with self._guard:
            now = time.monotonic()
            self._count = 1 if now >= self._deadline else self._count + 1
            self._deadline = now + self._ttl_s

    def unlock(self) -> None:
        """Remove a holder (the count stays at 0 when there is none); the deadline stays."""
        with self._guard:
            if self._count > 0:
                self._count -= 1

    def is_locked(self) -> bool:
        """Whether any holder remains and the deadline has not passed."""
        with self._guard:
            return self._count > 0 and time.monotonic() < self._deadline

    def reset(self) -> None:
        """Back to the initial state: no holder, deadline expired."""
        with self._guard:
            self._count = 0
            self._deadline = -math.inf
