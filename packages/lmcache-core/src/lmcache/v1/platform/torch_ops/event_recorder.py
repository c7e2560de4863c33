"""Stream-ordered event records (CacheBlend / observability hooks).

A native backend enqueues a host callback on the stream so the record lands when the stream
reaches it; the baseline has no stream to wait for and records immediately. Drains are atomic:
the list is swapped out under the lock, so a record is returned by exactly one drain.
"""

from __future__ import annotations

import threading
import time
from typing import Generic, TypeVar

from lmcache.v1.platform.ops_types import EventRecord

__all__ = ["drain_recorded_events", "record_event_on_stream"]

T = TypeVar("T")


class _RecordLog(Generic[T]):
    """An append-only list whose drain swaps it out under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[T] = []

    def append(self, item: T) -> None:
        with self._lock:
            self._items.append(item)

    def drain(self) -> list[T]:
        with self._lock:
            items, self._items = self._items, []
        return items


# Per-process queue of records waiting for the next drain (the stream-callback target).
_events: _RecordLog[EventRecord] = _RecordLog()


def record_event_on_stream(
    cuda_stream_ptr: int,
    event_type_name: str,
    session_id: str,
    str_metadata: dict[str, str],
    int_metadata: dict[str, int],
) -> None:
    """Record ``(event_type_name, session_id, time.time(), str_md, int_md)``.

    ``cuda_stream_ptr`` is ignored: without a device stream the record is taken now.
    The metadata dicts are copied so later caller mutations do not leak in.
    """
    _events.append(
        (event_type_name, session_id, time.time(), dict(str_metadata), dict(int_metadata))
    )


def drain_recorded_events() -> list[EventRecord]:
    """Every record since the previous drain, oldest first."""
    return _events.drain()
