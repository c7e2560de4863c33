"""The puts a tier has in flight: each key with the future that finishes its write.

The disk and Redis tiers write in the background; this table is what lets them

* skip a second put of a key whose first is still being written,
* make a reader of a key wait for its pending put (a reader never misses a value this
  process is still writing),
* wait for every put (shutdown, tests, benchmarks), and
* bound the keys queued (``limit``): a full table refuses new puts at once
  (:class:`PutTasksFull`) instead of letting the queue -- and the memory it holds -- grow.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import CancelledError, Future
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class PutTasksFull(Exception):
    """The table holds ``limit`` keys: the put of ``keys`` was not started."""

    def __init__(self, keys: int, limit: int) -> None:
        super().__init__(f"{keys} puts refused: {limit} already queued")
        self.keys = keys
        self.limit = limit


class PutTasks(Generic[K]):
    """Keys with a put in flight, each mapped to the future of its write."""

    def __init__(self, limit: int | None = None) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"put queue limit must be >= 1 (or None), not {limit}")
        self._limit = limit
        self._tasks: dict[K, Future] = {}
        self._lock = threading.Lock()

    @property
    def limit(self) -> int | None:
        return self._limit

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, keys: Sequence[K], submit: Callable[[list[K]], Future]) -> Future | None:
        """Start the put of those of ``keys`` not already in flight: ``submit(fresh)``
        returns its future, registered for each of them.  None when all are in flight.

        ``submit`` runs under the table's lock, so a write that finishes at once cannot
        :meth:`finish` before it is registered; it must only queue the work.  Raises
        :class:`PutTasksFull` (nothing started) when ``limit`` would be exceeded."""
        with self._lock:
            fresh = [k for k in dict.fromkeys(keys) if k not in self._tasks]
            if not fresh:
                return None
            if self._limit is not None and len(self._tasks) + len(fresh) > self._limit:
                raise PutTasksFull(len(fresh), self._limit)
            future = submit(fresh)
            for key in fresh:
                self._tasks[key] = future
            return future

    def finish(self, keys: Iterable[K]) -> None:
        """Forget ``keys`` (their write is over, landed or not)."""
        with self._lock:
            for key in keys:
                self._tasks.pop(key, None)

    def pending(self, keys: Iterable[K] | None = None) -> list[Future]:
        """The distinct futures of ``keys`` still in flight (of every key when None)."""
        with self._lock:
            if keys is None:
                futures: Iterable[Future] = self._tasks.values()
            else:
                futures = (f for k in keys if (f := self._tasks.get(k)) is not None)
            return list({id(f): f for f in futures}.values())

    def wait_for(self, keys: Iterable[K] | None = None) -> None:
        """Block until the puts of ``keys`` (of every key when None) are over.  A failed
        or cancelled put is not an error here: it left nothing, so its key is a miss."""
        for future in self.pending(keys):
            try:
                future.exception()
            except CancelledError:
                pass
