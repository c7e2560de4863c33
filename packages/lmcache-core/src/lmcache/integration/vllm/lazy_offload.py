"""Lazy offload (``lmcache.mp.lazy_offload``): stores deferred until vLLM is about to
evict the blocks, instead of issued after every step.

With vLLM's prefix caching on, a finished request's blocks stay in vLLM's own cache (the
free queue, evicted from its head) and serve that vLLM's hits.  Storing them into LMCache
at once spends bandwidth on data that may be used again locally or never; lazy offload
buffers each store operation here and a policy decides, once per step, which to release:

* ``EVICTION_AWARE`` (default): an operation is released when one of its blocks is within
  the *danger depth* of the free queue -- the number of blocks vLLM is expected to take in
  the next ``horizon_steps`` steps (a moving average of blocks allocated per step, or the
  next step's estimate if larger) -- or when it has waited ``max_deferral_seconds``
  (0 = no deadline).  At most ``max_drain_per_step`` operations are released per step,
  those closest to eviction first.
* ``FIFO``: once ``threshold`` finished requests have buffered operations, the oldest
  ``select_count`` of them are released whole.  Block pressure is not read.

Correctness does not depend on the policy.  A block keeps its prefix-cache hash until
vLLM evicts it; each operation snapshots the hashes of the blocks it covers when it is
buffered, and they are read again when it is released: a changed hash means the block
was reused, so the operation (and every later one of its request, unreachable without
it) is dropped and counted, never stored stale.  Released operations are stored in the
same step's ``wait_for_save``, after the forward and before any later step can write to
those blocks, so no block needs pinning -- except at the end of a request under pressure:
vLLM frees a finished request's blocks and, when requests wait for room, hands them out
in its next ``schedule()``, before any step could release their stores.  So when a
request with buffered operations finishes while vLLM is expected to take more blocks
than its free queue holds, ``EVICTION_AWARE`` releases them at once and the connector
asks vLLM to keep the blocks (``delay_free_blocks``) until the next step has stored them
(:meth:`LazyOffloadQueue.release_at_finish`).  Operations whose last block has no hash
yet (a partial block) are trimmed to their last whole chunk: such a block could be
reused without any trace.

A request preempted by vLLM loses its buffered operations (their block table is gone);
its tracker restarts from what was released.  What is still buffered at shutdown is
lost, as it would be on a vLLM crash, and logged.

Nothing here imports vLLM: the block pool is read through :class:`BlockPoolView`, which
:class:`VllmBlockPool` implements over vLLM's ``BlockPool``.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol

from lmcache.integration.vllm.scheduler_state import (
    LMCacheMPRequestMetadata,
    LoadStoreOp,
)

logger = logging.getLogger(__name__)

# Weight of the newest step in the moving average of blocks allocated per step.
_EMA_WEIGHT = 0.3


class LazyOffloadPolicy(enum.Enum):
    """Upstream's ``lmcache.mp.lazy_offload_policy`` values."""

    FIFO = "FIFO"
    EVICTION_AWARE = "EVICTION_AWARE"


@dataclasses.dataclass(frozen=True)
class LazyOffloadConfig:
    """The ``lmcache.mp.lazy_offload_*`` tunables (upstream's names and defaults)."""

    policy: LazyOffloadPolicy = LazyOffloadPolicy.EVICTION_AWARE
    threshold: int = 100
    select_count: int = 10
    horizon_steps: float = 2.5
    max_drain_per_step: int = 64
    max_deferral_seconds: float = 0.0

    def __post_init__(self) -> None:
        checks = (
            ("threshold", self.threshold >= 1, ">= 1"),
            ("select_count", self.select_count >= 1, ">= 1"),
            ("horizon_steps", self.horizon_steps > 0, "> 0"),
            ("max_drain_per_step", self.max_drain_per_step >= 1, ">= 1"),
            ("max_deferral_seconds", self.max_deferral_seconds >= 0, ">= 0"),
        )
        for name, ok, bound in checks:
            if not ok:
                raise ValueError(
                    f"lmcache.mp.lazy_offload_{name} must be {bound}, got {getattr(self, name)}"
                )


class BlockPoolView(Protocol):
    """What lazy offload reads of vLLM's block pool (the scheduler's)."""

    def block_hash(self, block_id: int) -> Hashable | None:
        """The block's prefix-cache hash; None when it has none (partial or evicted)."""
        ...

    def free_queue_head(self, depth: int) -> list[int]:
        """The first ``depth`` block ids of the free queue, the next to be evicted first."""
        ...

    def num_free_blocks(self) -> int:
        """Blocks in the free queue: a block freed now is taken after all of them."""
        ...


class VllmBlockPool:
    """:class:`BlockPoolView` over vLLM's ``vllm.v1.core.block_pool.BlockPool``."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def block_hash(self, block_id: int) -> Hashable | None:
        value: Hashable | None = self._pool.blocks[block_id].block_hash
        return value

    def free_queue_head(self, depth: int) -> list[int]:
        # Walk the linked list instead of get_all_free_blocks(), which copies the whole
        # queue; the fake tail is the only node without a successor.
        ids: list[int] = []
        block = self._pool.free_block_queue.fake_free_list_head.next_free_block
        while block is not None and block.next_free_block is not None and len(ids) < depth:
            ids.append(int(block.block_id))
            block = block.next_free_block
        return ids

    def num_free_blocks(self) -> int:
        return int(self._pool.get_num_free_blocks())


@dataclasses.dataclass
class LazyOffloadCounters:
    """Operations (token ranges of one step) by fate, since start-up."""

    admitted: int = 0
    released: int = 0
    released_overdue: int = 0
    released_at_finish: int = 0
    trimmed_unhashed: int = 0
    rejected_unhashed: int = 0
    rejected_broken_prefix: int = 0
    dropped_evicted: int = 0
    dropped_preempted: int = 0
    dropped_id_reuse: int = 0

    def as_metrics(self) -> dict[str, int]:
        """The totals behind the connector's ``lazy_*_ops`` counters (stats_recorder)."""
        return {
            "lazy_deferred_ops": self.admitted,
            "lazy_released_ops": self.released,
            "lazy_released_at_finish_ops": self.released_at_finish,
            "lazy_dropped_ops": (
                self.dropped_evicted + self.dropped_preempted + self.dropped_id_reuse
            ),
            "lazy_rejected_ops": self.rejected_unhashed + self.rejected_broken_prefix,
        }


@dataclasses.dataclass(frozen=True)
class StepSignals:
    """One scheduler step's block pressure, read from its ``SchedulerOutput``."""

    new_blocks_allocated: int
    est_next_step_blocks: int


@dataclasses.dataclass
class _Buffered:
    item: LMCacheMPRequestMetadata
    hashes: dict[int, Hashable]
    admitted_at: float


@dataclasses.dataclass
class _RequestBuffer:
    ops: list[_Buffered] = dataclasses.field(default_factory=list)
    released_end: int = 0  # tokens [0, released_end) were handed to the workers
    finished: bool = False
    broken: bool = False  # an operation was lost: later ones are unreachable


def covered_blocks(op: LoadStoreOp, block_size: int) -> list[int]:
    """Block ids of KV group 0 holding the op's tokens ``[start, end)``, in order."""
    if op.end <= op.start or not op.block_ids:
        return []
    table = op.block_ids[0]
    return [int(b) for b in table[op.start // block_size : -(-op.end // block_size)]]


def coalesce(items: list[LMCacheMPRequestMetadata]) -> LMCacheMPRequestMetadata:
    """One store for consecutive operations of one request.

    The request's block table only grows while it runs, so the last operation's table and
    token ids cover the earlier ones' ranges too."""
    first, last = items[0], items[-1]
    op = dataclasses.replace(last.op, start=first.op.start)
    return dataclasses.replace(last, op=op)


class LazyOffloadQueue:
    """Buffered store operations of one scheduler side, and the policy that drains them.

    Scheduler thread only.  ``pool`` is bound once vLLM's scheduler has its block pool
    (``bind_gpu_block_pool``); until then every operation passes through unbuffered.
    """

    def __init__(
        self,
        config: LazyOffloadConfig,
        block_size: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.block_size = block_size
        self.pool: BlockPoolView | None = None
        self.counters = LazyOffloadCounters()
        self._clock = clock
        # Insertion order is admission order: FIFO's order and the tie-break.
        self._buffers: dict[str, _RequestBuffer] = {}
        self._blocks_per_step = 0.0
        self._next_step_estimate = 0
        self._seen_a_step = False

    # -- admission ----------------------------------------------------------------------------

    def admit(self, item: LMCacheMPRequestMetadata, chunk_size: int) -> bool:
        """Buffer a store operation (trimmed, see the module docstring); False when none of
        it could be.  Either way the caller moves on: a later operation of the request, if
        any (``save_decode_cache``), starts at the chunk boundary below this one's end, so
        a trimmed tail is offered again once its blocks are whole; a prompt's partial last
        chunk is otherwise not stored lazily."""
        if self.pool is None:
            raise RuntimeError("lazy offload has no block pool bound yet")
        buffer = self._buffers.get(item.request_id)
        if buffer is not None and buffer.broken:
            self.counters.rejected_broken_prefix += 1
            return False
        admissible = self._hashed_prefix(item, chunk_size)
        if admissible is None:
            self.counters.rejected_unhashed += 1
            return False
        trimmed, hashes = admissible
        if buffer is None:
            buffer = self._buffers[item.request_id] = _RequestBuffer()
        buffer.ops.append(_Buffered(trimmed, hashes, self._clock()))
        self.counters.admitted += 1
        return True

    def _hashed_prefix(
        self, item: LMCacheMPRequestMetadata, chunk_size: int
    ) -> tuple[LMCacheMPRequestMetadata, dict[int, Hashable]] | None:
        """The op (cut back to its last whole chunk when its tail blocks have no hash) and
        the hashes of the blocks it then covers, each read once; None when no whole chunk
        of it is hashed."""
        assert self.pool is not None
        op = item.op
        hashes: dict[int, Hashable] = {}
        for block_id in covered_blocks(op, self.block_size):
            value = self.pool.block_hash(block_id)
            if value is None:
                break
            hashes[block_id] = value
        else:
            return item, hashes
        # The leading hashed blocks hold tokens up to hashed_end; keep whole chunks of them.
        hashed_end = (op.start // self.block_size + len(hashes)) * self.block_size
        end = (min(op.end, hashed_end) // chunk_size) * chunk_size
        if end <= op.start:
            return None
        trimmed = dataclasses.replace(op, end=end, token_ids=op.token_ids[:end])
        self.counters.trimmed_unhashed += 1
        kept = {b: hashes[b] for b in covered_blocks(trimmed, self.block_size)}
        return dataclasses.replace(item, op=trimmed), kept

    # -- request lifecycle --------------------------------------------------------------------

    def on_new_request(self, request_id: str) -> None:
        """A new request took this id: what a finished one of that id left is dropped."""
        buffer = self._buffers.get(request_id)
        if buffer is not None and buffer.finished:
            self.counters.dropped_id_reuse += len(buffer.ops)
            del self._buffers[request_id]

    def on_finished(self, request_id: str) -> None:
        """vLLM finished the request; its buffered operations stay until released."""
        buffer = self._buffers.get(request_id)
        if buffer is None:
            return
        if buffer.ops:
            buffer.finished = True
        else:
            del self._buffers[request_id]

    def release_at_finish(
        self, request_id: str, waiting_blocks: int
    ) -> LMCacheMPRequestMetadata | None:
        """vLLM is finishing the request: its buffered operations, coalesced into one
        store, when its blocks would be taken soon after vLLM frees them; None leaves them
        buffered (then call :meth:`on_finished`).

        "Soon" (``EVICTION_AWARE`` only): vLLM is expected to take more blocks than its
        free queue holds -- the danger depth, or ``waiting_blocks`` (what the requests
        waiting for room need) if larger -- so blocks freed now, which join the queue's
        tail, would go too.  The caller must keep the blocks (vLLM's
        ``delay_free_blocks``) until the store has run: under pressure vLLM hands a
        finished request's blocks to a waiting one in its very next ``schedule()``,
        before any later step could release the store."""
        buffer = self._buffers.get(request_id)
        if (
            buffer is None
            or not buffer.ops
            or self.pool is None
            or self.config.policy is not LazyOffloadPolicy.EVICTION_AWARE
        ):
            return None
        needed = max(self.danger_depth(), waiting_blocks)
        if needed <= self.pool.num_free_blocks():
            return None
        buffer.finished = True
        count = len(buffer.ops)
        self.counters.released_at_finish += count
        return self._release(request_id, count, overdue=False)

    def on_preempted(self, request_id: str) -> int:
        """vLLM preempted the request and freed its blocks: its buffered operations name a
        block table it no longer has.  Returns how far its KV was released (the tracker
        stores again from there)."""
        buffer = self._buffers.pop(request_id, None)
        if buffer is None:
            return 0
        self.counters.dropped_preempted += len(buffer.ops)
        return buffer.released_end

    def pending_operations(self) -> int:
        return sum(len(buffer.ops) for buffer in self._buffers.values())

    def is_buffered(self, request_id: str) -> bool:
        buffer = self._buffers.get(request_id)
        return buffer is not None and bool(buffer.ops)

    # -- draining -----------------------------------------------------------------------------

    def drain(self, signals: StepSignals) -> list[LMCacheMPRequestMetadata]:
        """The stores this step releases, one per request (its due operations coalesced)."""
        self._observe(signals)
        if self.pool is None or not self._buffers:
            return []
        self._drop_evicted()
        if self.config.policy is LazyOffloadPolicy.FIFO:
            plan = self._plan_fifo()
        else:
            plan = self._plan_eviction_aware()
        return [self._release(request_id, count, overdue) for request_id, count, overdue in plan]

    def _observe(self, signals: StepSignals) -> None:
        if self._seen_a_step:
            self._blocks_per_step += _EMA_WEIGHT * (
                signals.new_blocks_allocated - self._blocks_per_step
            )
        else:
            self._blocks_per_step = float(signals.new_blocks_allocated)
            self._seen_a_step = True
        self._next_step_estimate = signals.est_next_step_blocks

    def danger_depth(self) -> int:
        """Free-queue blocks expected to be taken within the horizon (0 on an idle engine)."""
        per_step = max(self._blocks_per_step, float(self._next_step_estimate))
        blocks = per_step * self.config.horizon_steps
        return 0 if blocks < 0.5 else math.ceil(blocks)

    def _drop_evicted(self) -> None:
        """Drop, per finished request, the first operation whose blocks changed and all
        after it.  A running request holds its blocks (vLLM cannot evict a block in use;
        a preempted request's buffer is dropped in on_preempted), so only finished ones
        are read."""
        assert self.pool is not None
        pool = self.pool
        for request_id in [rid for rid, buffer in self._buffers.items() if buffer.finished]:
            buffer = self._buffers[request_id]
            for index, buffered in enumerate(buffer.ops):
                if any(pool.block_hash(b) != h for b, h in buffered.hashes.items()):
                    lost = len(buffer.ops) - index
                    self.counters.dropped_evicted += lost
                    logger.info(
                        "lazy offload: %d store operation(s) of %s dropped, vLLM evicted "
                        "their blocks before they were released",
                        lost,
                        request_id,
                    )
                    del buffer.ops[index:]
                    buffer.broken = True
                    break
            if not buffer.ops and buffer.finished:
                del self._buffers[request_id]

    def _plan_fifo(self) -> list[tuple[str, int, bool]]:
        eligible = [rid for rid, b in self._buffers.items() if b.finished and b.ops]
        if len(eligible) < self.config.threshold:
            return []
        return [
            (rid, len(self._buffers[rid].ops), False)
            for rid in eligible[: self.config.select_count]
        ]

    def _plan_eviction_aware(self) -> list[tuple[str, int, bool]]:
        """(request, operations to release from its front, overdue) in release order."""
        assert self.pool is not None
        window = self.pool.free_queue_head(self.danger_depth())
        rank = {block_id: position for position, block_id in enumerate(window)}
        deadline = self.config.max_deferral_seconds
        now = self._clock()
        due: list[tuple[int, int, str, int, bool]] = []
        for order, (request_id, buffer) in enumerate(self._buffers.items()):
            last_due, first_rank = -1, math.inf
            for index, buffered in enumerate(buffer.ops):
                ranks = [rank[b] for b in buffered.hashes if b in rank]
                if ranks:
                    last_due, first_rank = index, min(first_rank, min(ranks))
            if last_due >= 0:
                # Releasing a later op needs the ones before it (a prefix is read from 0).
                due.append((int(first_rank), order, request_id, last_due + 1, False))
            elif deadline > 0 and buffer.ops and now - buffer.ops[0].admitted_at >= deadline:
                # Behind every request with a block about to go: a backlog of expired
                # operations must not take the budget those need.
                due.append((len(window), order, request_id, len(buffer.ops), True))
        due.sort()
        plan: list[tuple[str, int, bool]] = []
        budget = self.config.max_drain_per_step
        for _, _, request_id, count, overdue in due:
            if budget <= 0:
                break
            count = min(count, budget)
            budget -= count
            plan.append((request_id, count, overdue))
        return plan

    def _release(self, request_id: str, count: int, overdue: bool) -> LMCacheMPRequestMetadata:
        buffer = self._buffers[request_id]
        released, buffer.ops = buffer.ops[:count], buffer.ops[count:]
        self.counters.released += len(released)
        if overdue:
            self.counters.released_overdue += len(released)
        store = coalesce([buffered.item for buffered in released])
        buffer.released_end = max(buffer.released_end, store.op.end)
        if not buffer.ops and buffer.finished:
            del self._buffers[request_id]
        return store

    # -- shutdown -----------------------------------------------------------------------------

    def log_final_stats(self) -> None:
        pending = self.pending_operations()
        counters = dataclasses.asdict(self.counters)
        if pending:
            logger.warning(
                "lazy offload: %d buffered store operation(s) not released at shutdown are "
                "lost (counters: %s)",
                pending,
                counters,
            )
        else:
            logger.info("lazy offload counters at shutdown: %s", counters)


def step_signals(
    new_block_ids: Iterable[Iterable[Iterable[int]] | None],
    num_scheduled_tokens: int,
    block_size: int,
) -> StepSignals:
    """The block pressure of a step: the blocks it allocated (``new_block_ids`` holds,
    per scheduled request, its new block ids per KV group) and those the next step will
    need if it schedules as many tokens."""
    allocated = sum(len(list(group)) for groups in new_block_ids if groups for group in groups)
    return StepSignals(
        new_blocks_allocated=allocated,
        est_next_step_blocks=-(-num_scheduled_tokens // block_size) if block_size else 0,
    )
