"""Upstream LMCache 0.5.6's ``lmcache.observability``, reduced to the memory-layer counters.

:class:`LMCStatsMonitor` is the process's statistics collector.  Upstream's also gathers
request hit rates, latencies and storage-tier figures and feeds a Prometheus logger; ours
keeps only what the memory layer reports (pinned objects, forced unpins by the
:class:`~upstream_056.pin_monitor.PinMonitor`, bytes and objects held by the allocators of
:mod:`upstream_056.memory_allocators`), with the same attribute and method names.

``LMCStatsMonitor.GetOrCreate()`` is a **per-process singleton**, as upstream has it: every
allocator and memory object reports into one instance, so the counters describe the
process.  ``DestroyInstance()`` drops it (tests start from a clean slate with it).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import ClassVar

from lmcache.v1.memory.pin_hooks import PIN_HOOKS

logger = logging.getLogger(__name__)

__all__ = ["LMCStatsMonitor", "MemoryStats"]


@dataclass(frozen=True)
class MemoryStats:
    """A snapshot of :class:`LMCStatsMonitor`'s counters."""

    pinned_memory_objs_count: int
    interval_forced_unpin_count: int
    local_cache_usage_bytes: int
    active_memory_objs_count: int


class LMCStatsMonitor:
    """Counters the memory layer updates; read them directly or via :meth:`get_stats`."""

    _instance: ClassVar[LMCStatsMonitor | None] = None
    _instance_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        # Updates come from allocator callers and the PinMonitor thread at once.
        self._lock = threading.Lock()
        self.pinned_memory_objs_count = 0
        # "interval": reset by get_stats(reset_interval=True), like upstream's per-log
        # interval counters.
        self.interval_forced_unpin_count = 0
        self.local_cache_usage_bytes = 0
        self.active_memory_objs_count = 0

    @staticmethod
    def GetOrCreate() -> LMCStatsMonitor:
        """The process's monitor, created on first use."""
        with LMCStatsMonitor._instance_lock:
            if LMCStatsMonitor._instance is None:
                LMCStatsMonitor._instance = LMCStatsMonitor()
            return LMCStatsMonitor._instance

    @staticmethod
    def DestroyInstance() -> None:
        """Forget the process's monitor; the next ``GetOrCreate()`` starts from zero."""
        with LMCStatsMonitor._instance_lock:
            LMCStatsMonitor._instance = None

    def update_pinned_memory_objs_count(self, delta: int) -> None:
        """An object became pinned (+1) or fully unpinned (-1)."""
        with self._lock:
            self.pinned_memory_objs_count += delta

    def update_forced_unpin_count(self, delta: int) -> None:
        """The PinMonitor released ``delta`` objects whose pin timed out."""
        with self._lock:
            self.interval_forced_unpin_count += delta

    def update_local_cache_usage(self, usage_bytes: int) -> None:
        """Bytes an allocator now has handed out (the latest report wins)."""
        with self._lock:
            self.local_cache_usage_bytes = usage_bytes

    def update_active_memory_objs_count(self, count: int) -> None:
        """Objects an allocator now has handed out (the latest report wins)."""
        with self._lock:
            self.active_memory_objs_count = count

    def get_stats(self, reset_interval: bool = False) -> MemoryStats:
        """A snapshot; with ``reset_interval`` the interval counters restart from zero."""
        with self._lock:
            stats = MemoryStats(
                pinned_memory_objs_count=self.pinned_memory_objs_count,
                interval_forced_unpin_count=self.interval_forced_unpin_count,
                local_cache_usage_bytes=self.local_cache_usage_bytes,
                active_memory_objs_count=self.active_memory_objs_count,
            )
            if reset_interval:
                self.interval_forced_unpin_count = 0
        return stats


class _PinCounter:
    """Counts pinned objects in the process's stats monitor, as upstream's objects do:
    +1 on an object's first pin, -1 on its last unpin."""

    def on_pin(self, obj: object, pin_count: int) -> None:
        if pin_count == 1:
            LMCStatsMonitor.GetOrCreate().update_pinned_memory_objs_count(1)

    def on_unpin(self, obj: object, pin_count: int) -> None:
        if pin_count == 0:
            LMCStatsMonitor.GetOrCreate().update_pinned_memory_objs_count(-1)


PIN_COUNTER = _PinCounter()
PIN_HOOKS.register(PIN_COUNTER)
