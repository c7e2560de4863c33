"""Lazy offload's queue and policies (``lmcache.integration.vllm.lazy_offload``), on a
stand-in block pool that behaves as vLLM's: a block keeps its prefix-cache hash until
it is taken from the head of the free queue (evicted), which resets it."""

from __future__ import annotations

import random
from collections.abc import Hashable
from types import SimpleNamespace

import pytest
from fake_block_pool import FakePool
from hypothesis import given, settings
from hypothesis import strategies as st

from lmcache.integration.vllm.lazy_offload import (
    LazyOffloadConfig,
    LazyOffloadPolicy,
    LazyOffloadQueue,
    StepSignals,
    VllmBlockPool,
    coalesce,
    covered_blocks,
    step_signals,
)
from lmcache.integration.vllm.mp_config import parse_extra_config
from lmcache.integration.vllm.scheduler_state import LMCacheMPRequestMetadata, LoadStoreOp

BS = 4  # vLLM block size
CHUNK = 8  # server chunk size: two blocks


def _item(rid: str, table: list[int], start: int, end: int) -> LMCacheMPRequestMetadata:
    op = LoadStoreOp(token_ids=tuple(range(end)), block_ids=(tuple(table),), start=start, end=end)
    return LMCacheMPRequestMetadata(rid, op)


def _queue(pool: FakePool, **config: object) -> LazyOffloadQueue:
    queue = LazyOffloadQueue(LazyOffloadConfig(**config), BS)  # type: ignore[arg-type]
    queue.pool = pool
    return queue


IDLE = StepSignals(0, 0)


def _finished_request(pool: FakePool, queue: LazyOffloadQueue, rid: str, blocks: int) -> list[int]:
    """A request of ``blocks`` full blocks, stored in two operations, then finished."""
    table = pool.allocate(blocks)
    pool.fill(table)
    tokens = blocks * BS
    half = (tokens // 2 // CHUNK) * CHUNK
    assert queue.admit(_item(rid, table, 0, half), CHUNK)
    assert queue.admit(_item(rid, table, half, tokens), CHUNK)
    queue.on_finished(rid)
    pool.release(table)
    return table


def test_nothing_is_stored_while_the_blocks_are_far_from_eviction() -> None:
    pool = FakePool(64)
    queue = _queue(pool)
    _finished_request(pool, queue, "a", 4)
    # 4 blocks a step over a 2.5-step horizon: the first 10 of 64 free blocks are at risk.
    assert queue.drain(StepSignals(4, 4)) == []
    assert queue.danger_depth() == 10
    assert queue.is_buffered("a")
    assert queue.counters.admitted == 2 and queue.counters.released == 0


def test_a_request_is_stored_whole_when_its_blocks_near_eviction() -> None:
    pool = FakePool(24)
    queue = _queue(pool)
    table = _finished_request(pool, queue, "a", 4)
    pool.allocate(20)  # other work: "a"'s blocks drift to the head of the free queue
    assert pool.free[:4] == list(reversed(table))
    [store] = queue.drain(StepSignals(4, 4))
    assert (store.request_id, store.op.start, store.op.end) == ("a", 0, 16)
    assert store.op.block_ids == (tuple(table),)
    assert queue.counters.released == 2 and not queue.is_buffered("a")
    # Released once: nothing left to release on later steps.
    assert queue.drain(StepSignals(4, 4)) == []


def _running_request(pool: FakePool, queue: LazyOffloadQueue, rid: str, blocks: int) -> list[int]:
    """A request of ``blocks`` full blocks with two buffered operations, still running."""
    table = pool.allocate(blocks)
    pool.fill(table)
    half = (blocks * BS // 2 // CHUNK) * CHUNK
    assert queue.admit(_item(rid, table, 0, half), CHUNK)
    assert queue.admit(_item(rid, table, half, blocks * BS), CHUNK)
    return table


def test_a_request_finishing_with_requests_waiting_for_room_is_released_at_once() -> None:
    pool = FakePool(12)
    queue = _queue(pool)
    table = _running_request(pool, queue, "a", 8)  # 4 blocks stay free
    queue.drain(IDLE)
    assert queue.danger_depth() == 0
    # A waiting request needs 6 blocks: vLLM would take 2 of "a"'s once they are freed.
    store = queue.release_at_finish("a", waiting_blocks=6)
    assert store is not None
    assert (store.request_id, store.op.start, store.op.end) == ("a", 0, 32)
    assert store.op.block_ids == (tuple(table),)
    assert not queue.is_buffered("a") and queue.pending_operations() == 0
    assert (queue.counters.released, queue.counters.released_at_finish) == (2, 2)
    queue.on_finished("a")  # nothing left: a no-op
    assert queue.drain(StepSignals(8, 8)) == []


def test_a_request_finishing_under_the_danger_depth_is_released_at_once() -> None:
    pool = FakePool(12)
    queue = _queue(pool)
    _running_request(pool, queue, "a", 8)
    queue.drain(StepSignals(4, 4))  # 4 blocks a step: 10 at risk, 4 free
    assert queue.danger_depth() == 10
    assert queue.release_at_finish("a", waiting_blocks=0) is not None


def test_a_request_finishing_with_room_to_spare_stays_buffered() -> None:
    pool = FakePool(32)
    queue = _queue(pool)
    _running_request(pool, queue, "a", 8)  # 24 free
    queue.drain(StepSignals(4, 4))  # 10 at risk
    assert queue.release_at_finish("a", waiting_blocks=24) is None  # exactly the free ones
    assert queue.release_at_finish("idle", waiting_blocks=100) is None  # nothing buffered
    queue.on_finished("a")
    assert queue.is_buffered("a") and queue.counters.released_at_finish == 0
    fifo = _queue(FakePool(12), policy=LazyOffloadPolicy.FIFO)
    _running_request(fifo.pool, fifo, "f", 8)  # type: ignore[arg-type]
    assert fifo.release_at_finish("f", waiting_blocks=100) is None  # FIFO reads no pressure


def test_blocks_evicted_before_release_drop_the_rest_of_the_request_only() -> None:
    pool = FakePool(32)
    queue = _queue(pool)
    _finished_request(pool, queue, "a", 4)
    _finished_request(pool, queue, "b", 4)
    pool.allocate(24 + 2)  # a burst takes the whole queue head, half of "a" with it
    stores = queue.drain(StepSignals(0, 0))
    assert stores == []  # no pressure left now, and "a" is broken
    assert queue.counters.dropped_evicted >= 1
    # "a" can never again be stored from 0: refused, not stored stale.
    assert not queue.admit(_item("a", [0, 1], 0, 8), CHUNK)
    assert queue.counters.rejected_broken_prefix == 1
    assert queue.is_buffered("b")


def test_the_op_whose_blocks_changed_is_never_released() -> None:
    pool = FakePool(16)
    queue = _queue(pool, policy=LazyOffloadPolicy.FIFO, threshold=1)
    table = pool.allocate(4)
    pool.fill(table)
    assert queue.admit(_item("a", table, 0, 8), CHUNK)
    assert queue.admit(_item("a", table, 8, 16), CHUNK)
    queue.on_finished("a")
    pool.hashes[table[3]] = "reused"  # evicted and refilled with other tokens
    [store] = queue.drain(IDLE)
    assert (store.op.start, store.op.end) == (0, 8)  # the intact front only
    assert queue.counters.dropped_evicted == 1


def test_a_partial_tail_block_is_trimmed_to_the_last_whole_chunk() -> None:
    pool = FakePool(16)
    queue = _queue(pool, policy=LazyOffloadPolicy.FIFO, threshold=1)
    table = pool.allocate(5)
    pool.fill(table[:4])  # 18 tokens: the fifth block holds 2 and has no hash
    assert queue.admit(_item("a", table, 0, 18), CHUNK)
    assert queue.counters.trimmed_unhashed == 1
    queue.on_finished("a")
    [store] = queue.drain(IDLE)
    assert (store.op.start, store.op.end, len(store.op.token_ids)) == (0, 16, 16)
    # Nothing whole at all: refused, and counted.
    bare = pool.allocate(1)
    assert not queue.admit(_item("b", bare, 0, 3), CHUNK)
    assert queue.counters.rejected_unhashed == 1


def test_fifo_waits_for_threshold_finished_requests_and_releases_the_oldest() -> None:
    pool = FakePool(64)
    queue = _queue(pool, policy=LazyOffloadPolicy.FIFO, threshold=3, select_count=2)
    _finished_request(pool, queue, "a", 2)
    _finished_request(pool, queue, "b", 2)
    running = pool.allocate(2)
    pool.fill(running)
    queue.admit(_item("running", running, 0, 8), CHUNK)
    assert queue.drain(IDLE) == []  # two finished, threshold three
    _finished_request(pool, queue, "c", 2)
    assert [s.request_id for s in queue.drain(IDLE)] == ["a", "b"]
    assert queue.is_buffered("c") and queue.is_buffered("running")


def test_an_overdue_request_is_released_without_pressure() -> None:
    now = [100.0]
    pool = FakePool(64)
    queue = LazyOffloadQueue(LazyOffloadConfig(max_deferral_seconds=5.0), BS, clock=lambda: now[0])
    queue.pool = pool
    _finished_request(pool, queue, "a", 2)
    assert queue.drain(IDLE) == []
    now[0] += 5.0
    [store] = queue.drain(IDLE)
    assert (store.op.start, store.op.end) == (0, 8)
    assert queue.counters.released_overdue == 2


def test_the_budget_goes_to_the_blocks_closest_to_eviction() -> None:
    pool = FakePool(32)
    queue = _queue(pool, max_drain_per_step=2)
    _finished_request(pool, queue, "a", 4)
    _finished_request(pool, queue, "b", 4)
    pool.allocate(24)  # "a" then "b" now head the free queue, both in the window
    [store] = queue.drain(StepSignals(8, 8))
    assert store.request_id == "a"  # its blocks go first; the budget (2 ops) is spent
    [store] = queue.drain(StepSignals(8, 8))
    assert store.request_id == "b"


def test_preemption_and_id_reuse_drop_what_named_the_old_blocks() -> None:
    pool = FakePool(64)
    queue = _queue(pool, policy=LazyOffloadPolicy.FIFO, threshold=1)
    table = pool.allocate(4)
    pool.fill(table)
    queue.admit(_item("p", table, 0, 8), CHUNK)
    assert queue.on_preempted("p") == 0  # nothing was released: store again from 0
    assert queue.counters.dropped_preempted == 1
    _finished_request(pool, queue, "r", 2)
    queue.on_new_request("r")  # an unrelated request reuses the id
    assert not queue.is_buffered("r") and queue.counters.dropped_id_reuse == 2


def test_an_idle_engine_has_no_danger_window() -> None:
    queue = _queue(FakePool(8))
    queue.drain(StepSignals(10, 0))
    for _ in range(20):
        queue.drain(StepSignals(0, 0))
    assert queue.danger_depth() == 0


def test_step_signals_count_new_blocks_and_next_step_estimate() -> None:
    signals = step_signals([([1, 2, 3],), None, ([4],)], num_scheduled_tokens=9, block_size=4)
    assert signals == StepSignals(new_blocks_allocated=4, est_next_step_blocks=3)


def test_coalesce_and_covered_blocks() -> None:
    table = [7, 8, 9, 10]
    first, last = _item("a", table, 0, 8), _item("a", table, 8, 14)
    merged = coalesce([first, last])
    assert (merged.op.start, merged.op.end, merged.op.token_ids) == (0, 14, tuple(range(14)))
    assert covered_blocks(merged.op, BS) == [7, 8, 9, 10]
    assert covered_blocks(last.op, BS) == [9, 10]


def test_vllm_block_pool_walks_the_free_list_from_its_head() -> None:
    tail = SimpleNamespace(block_id=-2, next_free_block=None)
    b1 = SimpleNamespace(block_id=5, next_free_block=tail, block_hash="x")
    b0 = SimpleNamespace(block_id=3, next_free_block=b1, block_hash=None)
    head = SimpleNamespace(block_id=-1, next_free_block=b0)
    pool = SimpleNamespace(
        free_block_queue=SimpleNamespace(fake_free_list_head=head),
        blocks={3: b0, 5: b1},
    )
    view = VllmBlockPool(pool)
    assert view.free_queue_head(10) == [3, 5]
    assert view.free_queue_head(1) == [3]
    assert view.free_queue_head(0) == []
    assert (view.block_hash(5), view.block_hash(3)) == ("x", None)


def test_extra_config_keys() -> None:
    off = parse_extra_config({}, env={})
    assert off.lazy_offload is None
    on = parse_extra_config(
        {
            "lmcache.mp.lazy_offload": "true",
            "lmcache.mp.lazy_offload_policy": "fifo",
            "lmcache.mp.lazy_offload_threshold": "7",
            "lmcache.mp.lazy_offload_max_deferral_seconds": "1.5",
        },
        env={},
    )
    assert on.lazy_offload == LazyOffloadConfig(
        policy=LazyOffloadPolicy.FIFO, threshold=7, max_deferral_seconds=1.5
    )
    with pytest.raises(ValueError, match="lazy_offload_policy"):
        parse_extra_config(
            {"lmcache.mp.lazy_offload": True, "lmcache.mp.lazy_offload_policy": "LRU"}, env={}
        )
    with pytest.raises(ValueError, match="lazy_offload_horizon_steps"):
        parse_extra_config(
            {"lmcache.mp.lazy_offload": True, "lmcache.mp.lazy_offload_horizon_steps": 0},
            env={},
        )


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(list(LazyOffloadPolicy)))
def test_random_workloads_never_release_stale_or_unreachable_ranges(
    seed: int, policy: LazyOffloadPolicy
) -> None:
    """Whatever the allocation pattern: every released store covers only blocks still
    holding what they held when buffered, and each request's releases form one prefix
    from token 0 (a later range is never released without the ones before it)."""
    rng = random.Random(seed)
    pool = FakePool(48)
    queue = _queue(pool, policy=policy, threshold=2, select_count=2, max_drain_per_step=3)
    # (request, block) -> the block's hash when the request's op was admitted
    snapshot: dict[tuple[str, int], Hashable | None] = {}
    released_to: dict[str, int] = {}
    running: dict[str, tuple[list[int], int]] = {}
    held: list[tuple[list[int], LMCacheMPRequestMetadata]] = []  # released at finish
    for step in range(40):
        # Last step's finish releases ran with their blocks kept; vLLM frees them now.
        for table, store in held:
            blocks = covered_blocks(store.op, BS)
            assert all(pool.hashes[b] == snapshot[store.request_id, b] for b in blocks)
            assert store.op.start <= released_to.get(store.request_id, 0), "gap"
            released_to[store.request_id] = store.op.end
            pool.release(table)
        held = []
        if rng.random() < 0.5 and len(pool.free) >= 4:
            rid = f"r{step}"
            table = pool.allocate(rng.randint(1, 4))
            running[rid] = (table, 0)
        for rid, (table, stored) in list(running.items()):
            end = min(len(table) * BS, stored + CHUNK)
            pool.fill([b for b in table[stored // BS : end // BS] if pool.hashes[b] is None])
            if queue.admit(_item(rid, table, stored, end), CHUNK):
                for block in table[stored // BS : -(-end // BS)]:
                    snapshot[rid, block] = pool.hashes[block]
            running[rid] = (table, end)
            if end == len(table) * BS or rng.random() < 0.2:
                del running[rid]
                store = queue.release_at_finish(rid, waiting_blocks=rng.randint(0, 12))
                if store is not None:
                    held.append((table, store))
                    continue
                queue.on_finished(rid)
                pool.release(table)
        allocated = rng.randint(0, 6)
        for store in queue.drain(StepSignals(allocated, allocated)):
            blocks = covered_blocks(store.op, BS)
            rid = store.request_id
            assert all(pool.hashes[b] == snapshot[rid, b] for b in blocks), "stale store"
            assert store.op.start <= released_to.get(store.request_id, 0), "gap"
            released_to[store.request_id] = store.op.end
        pool.allocate(min(allocated, max(0, len(pool.free) - 4)))
