"""``SchedulerSide`` with ``lmcache.mp.lazy_offload``: stores leave the step metadata and
come back when vLLM's free queue brings their blocks near eviction.

Driven step by step with stand-ins for vLLM's scheduler output and block pool.  Requires
vLLM (the metadata class subclasses vLLM's); the ``vllm-e2e`` nox session runs it.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from fake_block_pool import FakePool
from prerequisites import require_module

require_module(
    "vllm",
    "vLLM is installed only in the vllm-e2e nox session (nox -s vllm-e2e)",
    required_env="LMCACHE_TEST_REQUIRE_VLLM",
)

from lmcache.integration.vllm.mp_config import parse_extra_config  # noqa: E402
from lmcache.integration.vllm.scheduler_side import SchedulerSide  # noqa: E402

CHUNK = 32  # == vLLM's block size here
PROMPT = 100  # three whole blocks and 4 tokens


class MissLink:
    """A server whose every lookup misses."""

    def __init__(self) -> None:
        self.generation = 1
        self.ready = True
        self.chunk_size = CHUNK
        self.block_size = CHUNK

    def run(self, what: str, call: Any) -> Any:
        return 0 if what == "query_prefetch_status" else None


def _request(rid: str) -> SimpleNamespace:
    tokens = list(range(1000 * len(rid), 1000 * len(rid) + PROMPT))
    return SimpleNamespace(request_id=rid, prompt_token_ids=tokens, all_token_ids=tokens)


def _admit(side: SchedulerSide, request: Any) -> None:
    deadline = time.monotonic() + 10
    while side.get_num_new_matched_tokens(request, 0)[0] is None:
        assert time.monotonic() < deadline, "the lookup never finished"
        time.sleep(0.005)
    side.update_state_after_alloc(request, 0)


def _step(
    new: list[tuple[str, list[int]]] = (), resumed: tuple[str, list[int]] | None = None
) -> Any:  # type: ignore[assignment]
    """A SchedulerOutput stand-in: ``new`` requests prefill their whole prompt; a
    ``resumed`` one restarts from token 0 in new blocks."""
    cached = SimpleNamespace(
        req_ids=[], new_block_ids=[], resumed_req_ids=set(), num_computed_tokens=[]
    )
    scheduled = {rid: PROMPT for rid, _ in new}
    if resumed is not None:
        rid, blocks = resumed
        cached = SimpleNamespace(
            req_ids=[rid], new_block_ids=[[blocks]], resumed_req_ids={rid}, num_computed_tokens=[0]
        )
        scheduled[rid] = PROMPT
    return SimpleNamespace(
        scheduled_new_reqs=[
            SimpleNamespace(req_id=rid, block_ids=[blocks], num_computed_tokens=0)
            for rid, blocks in new
        ],
        scheduled_cached_reqs=cached,
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
    )


def _lazy_side(pool: FakePool | None, **extra: Any) -> SchedulerSide:
    config = parse_extra_config({"lmcache.mp.lazy_offload": "true", **extra}, env={})
    side = SchedulerSide(MissLink(), config, "m", 1)  # type: ignore[arg-type]
    if pool is not None:
        side.bind_block_pool(pool)
    return side


def _prefill(side: SchedulerSide, pool: FakePool, rid: str) -> tuple[Any, list[int]]:
    request = _request(rid)
    _admit(side, request)
    table = pool.allocate(4)
    pool.fill(table[:3])  # vLLM hashes the whole blocks when it schedules them
    return side.build_connector_meta(_step([(rid, table)])), table


def test_stores_wait_for_eviction_pressure_then_go_out_whole_chunks_only() -> None:
    pool = FakePool(16)
    side = _lazy_side(pool)
    meta, table = _prefill(side, pool, "a")
    assert meta.stores == []  # deferred: "a" still holds its blocks
    side.finish("a")
    pool.release(table)
    # "bb" takes the head of the free queue; "a"'s blocks come within the danger window.
    meta, _ = _prefill(side, pool, "bb")
    [store] = meta.stores
    assert (store.request_id, store.op.start, store.op.end) == ("a", 0, 96)
    assert store.op.block_ids == (tuple(table),)
    assert store.op.token_ids == tuple(_request("a").prompt_token_ids[:96])
    counted = side.stats.take()
    assert counted is not None
    assert (counted["lazy_deferred_ops"], counted["lazy_released_ops"]) == (2, 1)
    side.close()


def test_a_request_finishing_while_others_wait_keeps_its_blocks_for_its_store() -> None:
    pool = FakePool(6)
    side = _lazy_side(pool)
    meta, table = _prefill(side, pool, "a")
    assert meta.stores == [] and side.lazy is not None and side.lazy.is_buffered("a")
    for _ in range(10):  # decode steps allocate nothing: no danger window of its own
        side.build_connector_meta(_step())
    assert side.lazy.danger_depth() == 0
    # "bb" waits: vLLM looked it up but had no blocks to give it (2 free, it needs 4).
    waiting = _request("bb")
    while side.get_num_new_matched_tokens(waiting, 0)[0] is None:
        time.sleep(0.005)
    assert side.waiting_blocks() == 4
    assert side.finish("a") is True  # vLLM keeps "a"'s blocks: delay_free_blocks
    # The next step stores "a" whole and names it, so the workers report it sent.
    meta = side.build_connector_meta(_step())
    [store] = meta.stores
    assert (store.request_id, store.op.start, store.op.end) == ("a", 0, 96)
    assert store.op.block_ids == (tuple(table),)
    assert meta.held_requests == ["a"]
    counted = side.stats.take()
    assert counted is not None
    assert (counted["lazy_released_ops"], counted["lazy_released_at_finish_ops"]) == (1, 1)
    # Once only.
    assert side.build_connector_meta(_step()).held_requests == []
    side.close()


def test_requests_waiting_on_another_server_count_too() -> None:
    """Prefix placement: each server has its own scheduler side, but their requests wait
    for the same vLLM blocks."""
    from lmcache.integration.vllm.multi_server import SchedulerRouter

    pool = FakePool(6)
    sides = [_lazy_side(pool), _lazy_side(pool)]
    router = SchedulerRouter(sides, ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"], CHUNK)
    names = ["r" * n for n in range(1, 40)]
    finishing = next(n for n in names if router.side_for(_request(n)) is sides[0])
    waiting = next(n for n in names if router.side_for(_request(n)) is sides[1])
    _prefill(sides[0], pool, finishing)
    for _ in range(10):
        sides[0].build_connector_meta(_step())
    while router.get_num_new_matched_tokens(_request(waiting), 0)[0] is None:
        time.sleep(0.005)
    assert sides[0].waiting_blocks() == 0 and sides[1].waiting_blocks() == 4
    assert router.finish(_request(finishing)) is True
    assert router.build_connector_meta(_step()).held_requests == [finishing]
    router.close()


def test_a_request_finishing_with_room_to_spare_frees_its_blocks_at_once() -> None:
    pool = FakePool(16)
    side = _lazy_side(pool)
    _prefill(side, pool, "a")
    assert side.finish("a") is False
    assert side.lazy is not None and side.lazy.is_buffered("a")
    assert side.build_connector_meta(_step()).held_requests == []
    side.close()


def test_a_preempted_request_stores_again_from_what_was_released() -> None:
    pool = FakePool(32)
    side = _lazy_side(pool)
    _prefill(side, pool, "p")
    assert side.lazy is not None and side.lazy.is_buffered("p")
    new_table = pool.allocate(4)
    pool.fill(new_table[:3])
    meta = side.build_connector_meta(_step(resumed=("p", new_table)))
    assert meta.stores == []
    assert side.lazy.counters.dropped_preempted == 1
    # Buffered again from token 0, in the new blocks.
    [buffered] = side.lazy._buffers["p"].ops
    assert (buffered.item.op.start, buffered.item.op.end) == (0, 96)
    assert buffered.item.op.block_ids == (tuple(new_table),)
    side.close()


def test_without_a_bound_block_pool_stores_are_eager_and_that_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    side = _lazy_side(None)
    request = _request("e")
    _admit(side, request)
    meta = side.build_connector_meta(_step([("e", [0, 1, 2, 3])]))
    [store] = meta.stores
    assert (store.op.start, store.op.end) == (0, PROMPT)
    assert "bind_gpu_block_pool" in caplog.text
    side.close()


def test_lazy_offload_needs_prefix_caching() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from lmcache.integration.vllm.lmcache_mp_connector import LMCacheMPConnector

    transfer = SimpleNamespace(
        kv_connector_extra_config={"lmcache.mp.lazy_offload": "true"},
        kv_role="kv_both",
        engine_id="e",
    )
    vllm_config = SimpleNamespace(
        kv_transfer_config=transfer,
        model_config=SimpleNamespace(model="m", served_model_name="m"),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1),
        cache_config=SimpleNamespace(block_size=32, enable_prefix_caching=False),
    )
    with pytest.raises(ValueError, match="prefix caching"):
        LMCacheMPConnector(vllm_config, KVConnectorRole.SCHEDULER, None)  # type: ignore[arg-type]


# Needs vLLM: the vllm-e2e nox session runs exactly these files (-m vllm).
pytestmark = pytest.mark.vllm
