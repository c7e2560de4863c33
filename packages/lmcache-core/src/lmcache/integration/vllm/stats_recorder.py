"""What one side of ``LMCacheMPConnector`` counts for its metrics, without vLLM.

The scheduler and worker sides record into a ``StatsRecorder``; the connector hands what
was recorded to vLLM as ``connector_stats.LMCacheMPConnectorStats`` (``take_stats``).
This module imports nothing from vLLM, so the sides (and their tests) work where vLLM is
not installed.
"""

from __future__ import annotations

import threading
from typing import Any

# Counters (summed across workers and steps).  Name -> help text of its Prometheus metric.
COUNTERS: dict[str, str] = {
    "lookups": "Requests whose prefix was looked up in LMCache (a failed lookup counts as a miss).",
    "lookup_tokens": "Prompt tokens looked up in LMCache.",
    "hit_tokens": "Prompt tokens found in LMCache and usable by vLLM (lookup hits).",
    "lookup_refreshes": (
        "Lookups sent again for a request vLLM could not schedule yet "
        "(lmcache.mp.lookup_refresh_interval)."
    ),
    "refresh_hit_tokens": (
        "Prompt tokens a repeated lookup found beyond the request's earlier answer "
        "(also counted in hit_tokens)."
    ),
    "loaded_tokens": "Tokens loaded from LMCache into vLLM's KV cache, summed over TP workers.",
    "loaded_bytes": "KV bytes loaded from LMCache, summed over TP workers.",
    "stored_tokens": "Tokens stored into LMCache, summed over TP workers.",
    "stored_bytes": "KV bytes stored into LMCache, summed over TP workers.",
    "failed_loads": "Loads that failed (vLLM recomputes those tokens), per TP worker.",
    "failed_stores": "Stores that failed (a future miss), per TP worker.",
    # Lazy offload (lmcache.mp.lazy_offload), counted by the scheduler in store operations
    # (one request's token range of one step).
    "lazy_deferred_ops": "Store operations buffered by lazy offload instead of issued.",
    "lazy_released_ops": "Buffered store operations released to the workers to be stored.",
    "lazy_released_at_finish_ops": (
        "Buffered store operations released as their request finished under pressure, "
        "vLLM keeping its blocks until they were stored (also counted in lazy_released_ops)."
    ),
    "lazy_dropped_ops": (
        "Buffered store operations dropped: vLLM evicted or reassigned their blocks first."
    ),
    "lazy_rejected_ops": (
        "Store operations lazy offload could not buffer (no whole block, or an earlier "
        "range of the request was lost)."
    ),
}
LOAD_SECONDS = "load_seconds"


def empty_data() -> dict[str, Any]:
    """An interval with nothing recorded: every counter 0, no load latencies."""
    data: dict[str, Any] = {name: 0 for name in COUNTERS}
    data[LOAD_SECONDS] = []
    return data


def _is_empty(data: dict[str, Any]) -> bool:
    return not data[LOAD_SECONDS] and not any(data[name] for name in COUNTERS)


class StatsRecorder:
    """Thread-safe counters of one connector side; ``take`` starts a new interval."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data = empty_data()

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                if name not in COUNTERS:
                    raise KeyError(f"unknown LMCache connector counter {name!r}")
                self._data[name] += int(value)

    def observe_load(self, seconds: float) -> None:
        with self._lock:
            self._data[LOAD_SECONDS].append(float(seconds))

    def take(self) -> dict[str, Any] | None:
        """The payload recorded since the last call (``connector_stats.take_stats`` wraps
        it for vLLM), or None when nothing was."""
        with self._lock:
            if _is_empty(self._data):
                return None
            taken, self._data = self._data, empty_data()
        return taken
