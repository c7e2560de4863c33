"""``LMCacheMPConnector``'s metrics, through vLLM's KV-connector stats hook.

vLLM asks every connector, after each step, for ``get_kv_connector_stats()``: the
scheduler's connector and each worker's.  It sums the workers' payloads
(``KVOutputAggregator``), adds the scheduler's (``aggregate``), sends the resulting
``to_dict()`` to the API server, and there

* ``KVConnectorPromMetrics.observe`` adds each step's payload to the Prometheus metrics on
  ``/metrics`` (``vllm:lmcache_mp_*``), and
* ``KVConnectorLogging`` aggregates the payloads of one logging interval and logs
  ``reduce()`` ("KV Transfer metrics: ...").

Who records what: lookups and hit tokens are counted once per request by the scheduler;
bytes, tokens and load latency are counted by every TP worker for its own shard, so the
sum over workers is what really moved (the latency histogram holds one observation per
worker and load).  Each ``take()`` hands over what was recorded since the last one and
starts a new interval, so nothing is counted twice.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from lmcache.integration.vllm.stats_recorder import (
    COUNTERS,
    LOAD_SECONDS,
    StatsRecorder,
    empty_data,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig

PROM_PREFIX = "vllm:lmcache_mp_"
LOAD_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclasses.dataclass
class LMCacheMPConnectorStats(KVConnectorStats):  # type: ignore[misc]
    """``data``: one number per ``COUNTERS`` name, and ``load_seconds``: a list of floats.

    Plain ints, floats and lists, so vLLM can serialize it between its processes.
    """

    def __post_init__(self) -> None:
        # A payload from another process may omit names (an empty interval, an older peer).
        for name, value in empty_data().items():
            self.data.setdefault(name, value)

    def reset(self) -> None:
        self.data = empty_data()

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        """Adds ``other`` into this one (vLLM keeps using the returned object)."""
        if other.is_empty():
            return self
        if not isinstance(other, LMCacheMPConnectorStats):
            raise TypeError(f"cannot aggregate {type(other).__name__} into LMCache stats")
        for name in COUNTERS:
            self.data[name] += other.data[name]
        self.data[LOAD_SECONDS].extend(other.data[LOAD_SECONDS])
        return self

    def reduce(self) -> dict[str, int | float]:
        """The interval's summary for vLLM's log line."""
        summary: dict[str, int | float] = {name: self.data[name] for name in COUNTERS}
        lookup_tokens = self.data["lookup_tokens"]
        summary["hit_rate"] = (
            round(self.data["hit_tokens"] / lookup_tokens, 4) if lookup_tokens else 0.0
        )
        latencies = self.data[LOAD_SECONDS]
        summary["loads"] = len(latencies)
        if latencies:
            summary["avg_load_ms"] = round(1000 * statistics.fmean(latencies), 3)
            summary["max_load_ms"] = round(1000 * max(latencies), 3)
        return summary

    def is_empty(self) -> bool:
        return not self.data[LOAD_SECONDS] and not any(self.data[name] for name in COUNTERS)


def take_stats(recorder: StatsRecorder) -> LMCacheMPConnectorStats | None:
    """What ``recorder`` recorded since the last call, as vLLM's stats object; None when
    nothing was."""
    payload = recorder.take()
    return None if payload is None else LMCacheMPConnectorStats(data=payload)


class LMCacheMPPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]
    """The ``vllm:lmcache_mp_*`` metrics on vLLM's ``/metrics``, one child per engine."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters: dict[str, dict[int, Any]] = {}
        for name, documentation in COUNTERS.items():
            counter = self._counter_cls(
                name=f"{PROM_PREFIX}{name}", documentation=documentation, labelnames=labelnames
            )
            self._counters[name] = self._per_engine(counter)
        histogram = self._histogram_cls(
            name=f"{PROM_PREFIX}load_seconds",
            documentation="Latency of one load from LMCache, per TP worker.",
            labelnames=labelnames,
            buckets=LOAD_LATENCY_BUCKETS,
        )
        self._load_seconds = self._per_engine(histogram)

    def _per_engine(self, metric: Any) -> dict[int, Any]:
        return {
            engine: metric.labels(*values) for engine, values in self.per_engine_labelvalues.items()
        }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        stats = LMCacheMPConnectorStats(data=dict(transfer_stats_data))
        for name in COUNTERS:
            value = stats.data[name]
            if value:
                self._counters[name][engine_idx].inc(value)
        for seconds in stats.data[LOAD_SECONDS]:
            self._load_seconds[engine_idx].observe(seconds)
