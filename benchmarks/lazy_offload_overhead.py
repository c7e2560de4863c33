"""Scheduler-thread cost of lazy offload (``lmcache.mp.lazy_offload``) per engine step.

Usage::

    python benchmarks/lazy_offload_overhead.py [--requests 10,100,1000] [--blocks 16]

With ``R`` finished requests buffered (``B`` blocks each, two operations per request) in
a vLLM-shaped block pool (``KVCacheBlock``-like objects with a linked free queue, read
through the connector's own ``VllmBlockPool``), it times one ``drain`` on a step with
typical pressure (the danger window does not reach the buffered blocks, so nothing is
released: the steady-state cost).  Printed per size: microseconds per step, per buffered
block, and the ratio to a lower bound measured in the same run: one Python loop reading
every buffered block's hash once (what any hash-validating design must at least do).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace

from lmcache.integration.vllm.lazy_offload import (
    LazyOffloadConfig,
    LazyOffloadQueue,
    StepSignals,
    VllmBlockPool,
)
from lmcache.integration.vllm.scheduler_state import LMCacheMPRequestMetadata, LoadStoreOp

BLOCK_SIZE = 16
CHUNK = 256


def vllm_like_pool(num_blocks: int) -> SimpleNamespace:
    """Blocks with ``block_hash`` and a doubly linked free queue with fake head and tail."""
    blocks = [
        SimpleNamespace(block_id=i, block_hash=("h", i), next_free_block=None)
        for i in range(num_blocks)
    ]
    head = SimpleNamespace(block_id=-1, next_free_block=None)
    tail = SimpleNamespace(block_id=-2, next_free_block=None)
    chain = [head, *blocks, tail]
    for node, successor in itertools.pairwise(chain):
        node.next_free_block = successor
    return SimpleNamespace(
        blocks=blocks, free_block_queue=SimpleNamespace(fake_free_list_head=head)
    )


def buffered_queue(requests: int, blocks: int) -> tuple[LazyOffloadQueue, list[int]]:
    # Buffered requests' blocks sit at the tail of the free queue, far from eviction.
    spare = 4096
    pool = vllm_like_pool(spare + requests * blocks)
    queue = LazyOffloadQueue(LazyOffloadConfig(), BLOCK_SIZE)
    queue.pool = VllmBlockPool(pool)
    tokens = blocks * BLOCK_SIZE
    half = (tokens // 2 // CHUNK) * CHUNK or BLOCK_SIZE
    buffered: list[int] = []
    for r in range(requests):
        table = tuple(range(spare + r * blocks, spare + (r + 1) * blocks))
        buffered.extend(table)
        for start, end in ((0, half), (half, tokens)):
            op = LoadStoreOp(tuple(range(end)), (table,), start, end)
            queue.admit(LMCacheMPRequestMetadata(f"r{r}", op), CHUNK)
        queue.on_finished(f"r{r}")
    return queue, buffered


def median_time(fn: Callable[[], object], repeats: int = 15) -> float:
    timings = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        timings.append(time.perf_counter() - t0)
    return statistics.median(timings)


def measure(requests: int, blocks: int) -> tuple[int, float, float]:
    """(buffered blocks, seconds per drain, seconds per lower-bound pass)."""
    signals = StepSignals(new_blocks_allocated=32, est_next_step_blocks=32)
    queue, buffered = buffered_queue(requests, blocks)
    view = queue.pool
    assert view is not None

    def bound() -> None:
        for block_id in buffered:
            view.block_hash(block_id)

    drain = median_time(lambda: queue.drain(signals))
    floor = median_time(bound)
    assert queue.pending_operations() == 2 * requests  # nothing released
    return len(buffered), drain, floor


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", default="10,100,1000")
    parser.add_argument("--blocks", type=int, default=16)
    args = parser.parse_args()
    header = ("requests", "blocks", "drain us", "us/block", "bound us", "x bound")
    print("{:>9} {:>8} {:>10} {:>9} {:>9} {:>8}".format(*header))
    for requests in [int(n) for n in args.requests.split(",")]:
        blocks, drain, floor = measure(requests, args.blocks)
        print(
            f"{requests:>9} {blocks:>8} {drain * 1e6:>10.1f} "
            f"{drain * 1e6 / blocks:>9.3f} {floor * 1e6:>9.1f} {drain / floor:>8.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
