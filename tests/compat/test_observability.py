"""LMCStatsMonitor: the process's memory counters."""

from __future__ import annotations

from lmcache.compat.upstream_056.observability import LMCStatsMonitor


def test_singleton_counters_and_interval_reset() -> None:
    LMCStatsMonitor.DestroyInstance()
    monitor = LMCStatsMonitor.GetOrCreate()
    assert LMCStatsMonitor.GetOrCreate() is monitor
    monitor.update_forced_unpin_count(2)
    monitor.update_pinned_memory_objs_count(1)
    monitor.update_local_cache_usage(4096)
    monitor.update_active_memory_objs_count(3)
    stats = monitor.get_stats(reset_interval=True)
    assert (stats.interval_forced_unpin_count, stats.pinned_memory_objs_count) == (2, 1)
    assert (stats.local_cache_usage_bytes, stats.active_memory_objs_count) == (4096, 3)
    assert monitor.interval_forced_unpin_count == 0
    LMCStatsMonitor.DestroyInstance()
    assert LMCStatsMonitor.GetOrCreate() is not monitor
