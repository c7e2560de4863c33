"""``LMCacheMPConnector`` metrics through vLLM's real stats classes.

Checks what vLLM does with them: ``KVOutputAggregator`` sums the TP workers' stats, the
scheduler adds its own, ``KVConnectorLogging`` aggregates an interval and resets, and
``KVConnectorProm`` puts them on ``/metrics``.  Requires vLLM (the ``vllm-e2e`` session).
"""

from __future__ import annotations

import functools
import logging
import time
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from prerequisites import require_module

require_module(
    "vllm",
    "vLLM is installed only in the vllm-e2e nox session (nox -s vllm-e2e)",
    required_env="LMCACHE_TEST_REQUIRE_VLLM",
)

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (  # noqa: E402
    KVConnectorLogging,
    KVConnectorProm,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402

from lmcache.integration.vllm.connector_stats import (  # noqa: E402
    LMCacheMPConnectorStats,
    take_stats,
)
from lmcache.integration.vllm.lmcache_mp_connector import LMCacheMPConnector  # noqa: E402
from lmcache.integration.vllm.mp_config import parse_extra_config  # noqa: E402
from lmcache.integration.vllm.scheduler_side import SchedulerSide  # noqa: E402
from lmcache.integration.vllm.scheduler_state import (  # noqa: E402
    LMCacheMPRequestMetadata,
    LoadStoreOp,
)
from lmcache.integration.vllm.stats_recorder import StatsRecorder  # noqa: E402
from lmcache.integration.vllm.vllm_kv_layout import DetectedLayout  # noqa: E402
from lmcache.integration.vllm.worker_side import WorkerSide, _bytes_per_token  # noqa: E402
from lmcache.v1.platform.ops_types import EngineKVFormat  # noqa: E402

MODULE = "lmcache.integration.vllm.lmcache_mp_connector"
CHUNK = 32


def _transfer_config() -> KVTransferConfig:
    return KVTransferConfig(
        kv_connector="LMCacheMPConnector", kv_connector_module_path=MODULE, kv_role="kv_both"
    )


def _worker_stats(loaded_bytes: int, latency: float) -> LMCacheMPConnectorStats:
    recorder = StatsRecorder()
    recorder.add(loaded_tokens=64, loaded_bytes=loaded_bytes)
    recorder.observe_load(latency)
    taken = take_stats(recorder)
    assert taken is not None
    return taken


def _runner_output(stats: LMCacheMPConnectorStats | None) -> ModelRunnerOutput:
    return ModelRunnerOutput(
        req_ids=[],
        req_id_to_index={},
        kv_connector_output=KVConnectorOutput(kv_connector_stats=stats),
    )


def test_recorder_hands_over_an_interval_once() -> None:
    recorder = StatsRecorder()
    assert take_stats(recorder) is None  # nothing recorded: vLLM gets None, sends nothing
    recorder.add(lookups=1, lookup_tokens=100, hit_tokens=64)
    taken = take_stats(recorder)
    assert taken is not None and taken.data["hit_tokens"] == 64
    assert take_stats(recorder) is None  # the next interval starts empty
    with pytest.raises(KeyError, match="unknown"):
        recorder.add(no_such_counter=1)


def test_vllm_sums_the_tp_workers_and_adds_the_scheduler() -> None:
    aggregator = KVOutputAggregator(expected_finished_count=3)
    output = aggregator.aggregate(
        [
            _runner_output(_worker_stats(1000, 0.01)),
            _runner_output(None),  # a rank with nothing to report this step
            _runner_output(_worker_stats(3000, 0.03)),
        ]
    )
    workers = output.kv_connector_output.kv_connector_stats
    assert isinstance(workers, LMCacheMPConnectorStats)
    scheduler = StatsRecorder()
    scheduler.add(lookups=1, lookup_tokens=100, hit_tokens=64)
    scheduler_stats = take_stats(scheduler)
    assert scheduler_stats is not None and not scheduler_stats.is_empty()
    total = workers.aggregate(scheduler_stats)
    assert total.data["loaded_bytes"] == 4000
    assert total.data["loaded_tokens"] == 128
    assert total.data["load_seconds"] == [0.01, 0.03]
    assert (total.data["lookups"], total.data["hit_tokens"]) == (1, 64)


def test_vllm_logging_aggregates_an_interval_then_resets() -> None:
    logging_ = KVConnectorLogging(_transfer_config())
    first = StatsRecorder()
    first.add(lookups=1, lookup_tokens=100, hit_tokens=50)
    first.observe_load(0.002)
    second = StatsRecorder()
    second.add(lookups=1, lookup_tokens=100, stored_bytes=7)
    for recorder in (first, second):
        taken = take_stats(recorder)
        assert taken is not None
        logging_.observe(taken.to_dict())  # what reaches the API server: a plain dict
    lines: list[str] = []
    logging_.log(lambda fmt, *args: lines.append(fmt % args))
    assert len(lines) == 1
    assert "lookups=2" in lines[0] and "hit_rate=0.25" in lines[0]
    assert "stored_bytes=7" in lines[0] and "avg_load_ms=2.0" in lines[0]
    logging_.log(lambda fmt, *args: lines.append(fmt % args))
    assert len(lines) == 1  # the interval was reset: nothing new to log


def test_build_kv_connector_stats_round_trips_a_payload() -> None:
    stats = _worker_stats(10, 0.5)
    rebuilt = LMCacheMPConnector.build_kv_connector_stats(stats.to_dict())
    assert isinstance(rebuilt, LMCacheMPConnectorStats)
    assert rebuilt.data == stats.data
    empty = LMCacheMPConnector.build_kv_connector_stats()
    assert empty is not None and empty.is_empty()
    partial = LMCacheMPConnector.build_kv_connector_stats({"lookups": 3})
    assert partial is not None and partial.reduce()["lookups"] == 3


def _registry_bound(registry: CollectorRegistry) -> type[KVConnectorProm]:
    class ScopedProm(KVConnectorProm):  # type: ignore[misc]
        # A private registry, so the test does not depend on (or pollute) the global one.
        _gauge_cls = functools.partial(Gauge, registry=registry)
        _counter_cls = functools.partial(Counter, registry=registry)
        _histogram_cls = functools.partial(Histogram, registry=registry)

    return ScopedProm


def test_vllm_prometheus_metrics_per_engine() -> None:
    registry = CollectorRegistry()
    vllm_config = SimpleNamespace(kv_transfer_config=_transfer_config())
    prom = _registry_bound(registry)(
        vllm_config, ["model_name", "engine"], {0: ["m", "0"], 1: ["m", "1"]}
    )
    assert prom.prom_metrics is not None
    recorder = StatsRecorder()
    recorder.add(lookups=2, lookup_tokens=200, hit_tokens=96, loaded_bytes=4096)
    recorder.observe_load(0.004)
    taken = take_stats(recorder)
    assert taken is not None
    prom.observe(taken.to_dict(), engine_idx=1)
    prom.observe(taken.to_dict(), engine_idx=1)

    def sample(name: str, engine: str) -> float | None:
        value = registry.get_sample_value(name, {"model_name": "m", "engine": engine})
        return None if value is None else float(value)

    assert sample("vllm:lmcache_mp_hit_tokens_total", "1") == 192
    assert sample("vllm:lmcache_mp_loaded_bytes_total", "1") == 8192
    assert sample("vllm:lmcache_mp_lookups_total", "1") == 4
    assert sample("vllm:lmcache_mp_load_seconds_count", "1") == 2
    assert sample("vllm:lmcache_mp_load_seconds_bucket", "1") is None  # needs an le label
    assert sample("vllm:lmcache_mp_hit_tokens_total", "0") == 0  # the other engine


# -- the two sides record ---------------------------------------------------------------------


class AnsweringLink:
    """A server whose lookup answers ``hit_chunks`` chunks at once."""

    def __init__(self, hit_chunks: int) -> None:
        self.generation = 1
        self.ready = True
        self.chunk_size = CHUNK
        self.block_size = CHUNK  # vLLM's block size (ServerLink.block_size)
        self.hit_chunks = hit_chunks

    def run(self, what: str, call: Any) -> Any:
        return self.hit_chunks if what == "query_prefetch_status" else None


def _matched_when_resolved(side: SchedulerSide, request: Any) -> tuple[int | None, bool]:
    """Ask as vLLM does, step after step, until the lookup thread has answered."""
    deadline = time.monotonic() + 10.0
    while (answer := side.get_num_new_matched_tokens(request, 0))[0] is None:
        assert time.monotonic() < deadline, "the lookup never resolved"
        time.sleep(0.01)
    return answer


def test_scheduler_counts_each_lookup_once() -> None:
    config = parse_extra_config({"lmcache.mp.async_load": False})
    side = SchedulerSide(AnsweringLink(2), config, "m", 1)  # type: ignore[arg-type]
    request = SimpleNamespace(request_id="a", prompt_token_ids=list(range(100)))
    try:
        assert _matched_when_resolved(side, request) == (64, False)
        # vLLM asks again when it could not allocate the blocks: not a second lookup.
        assert side.get_num_new_matched_tokens(request, 0) == (64, False)
    finally:
        side.close()
    taken = take_stats(side.stats)
    assert taken is not None
    assert (taken.data["lookups"], taken.data["lookup_tokens"]) == (1, 100)
    assert taken.data["hit_tokens"] == 64


class DoneTransfer:
    """A transfer context whose store/retrieve succeed (``ok``) at once."""

    def __init__(self, ok: bool) -> None:
        self.ok = ok

    def _done(self, *args: Any) -> Future[bool]:
        future: Future[bool] = Future()
        future.set_result(self.ok)
        return future

    submit_store = _done
    submit_retrieve = _done


def _item(start: int, end: int, skip: int = 0) -> LMCacheMPRequestMetadata:
    op = LoadStoreOp(
        token_ids=tuple(range(end)),
        block_ids=(tuple(range(end // 16)),),
        start=start,
        end=end,
        skip_first_n_tokens=skip,
    )
    return LMCacheMPRequestMetadata("r", op)


def _worker(ok: bool) -> WorkerSide:
    link = SimpleNamespace(ready=True, chunk_size=CHUNK, health=SimpleNamespace())
    link.health.warn_once = lambda *args: None
    worker = WorkerSide(link, parse_extra_config({}), "m", 1, 16)  # type: ignore[arg-type]
    worker._transfer = DoneTransfer(ok)
    worker._bytes_per_token = 10
    return worker


def test_worker_counts_bytes_tokens_and_latency() -> None:
    worker = _worker(ok=True)
    worker.load([_item(0, 64, skip=32)])
    worker.store([_item(64, 96)])
    taken = take_stats(worker.stats)
    assert taken is not None
    assert (taken.data["loaded_tokens"], taken.data["loaded_bytes"]) == (32, 320)
    assert (taken.data["stored_tokens"], taken.data["stored_bytes"]) == (32, 320)
    assert len(taken.data["load_seconds"]) == 1 and taken.data["load_seconds"][0] >= 0


def test_worker_counts_failures() -> None:
    worker = _worker(ok=False)
    worker.load([_item(0, 64)])
    worker.store([_item(0, 32)])
    taken = take_stats(worker.stats)
    assert taken is not None
    assert (taken.data["failed_loads"], taken.data["failed_stores"]) == (1, 1)
    assert taken.data["loaded_bytes"] == 0 and taken.data["load_seconds"] == []


def test_bytes_per_token_covers_every_layer() -> None:
    # 2 layers of [2 (K/V), 4 blocks, 16 tokens, 2 heads, 8 dims] float32.
    views = {f"l{i}": torch.zeros(2, 4, 16, 2, 8) for i in range(2)}
    layout = DetectedLayout(EngineKVFormat.NL_X_TWO_NB_BS_NH_HS, 4, 16, 2, 8, torch.float32)
    assert _bytes_per_token(views, layout) == 2 * 2 * 2 * 8 * 4


def test_logging_is_quiet_for_an_empty_interval(caplog: pytest.LogCaptureFixture) -> None:
    logging_ = KVConnectorLogging(_transfer_config())
    with caplog.at_level(logging.INFO):
        logging_.observe(LMCacheMPConnectorStats().to_dict())
        lines: list[str] = []
        logging_.log(lambda fmt, *args: lines.append(fmt % args))
    assert lines == []


# Needs vLLM: the vllm-e2e nox session runs exactly these files (-m vllm).
pytestmark = pytest.mark.vllm
