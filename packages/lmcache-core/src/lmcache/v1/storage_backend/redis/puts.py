"""The Redis tier's put path: ``SET NX [PX ttl]`` pipelines on a small thread pool.

Values are encoded (chunk format, :mod:`.codec`) on the pool, batched by bytes; a put
never raises to its caller and never waits: a failed or unreachable write is dropped and
counted in the tier's stats, and so is a put past the bounded queue
(``put_queue_chunks``), with a rate-limited warning.  Reads of a key wait for its pending
put, so a reader never misses a value this process is still writing.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from lmcache.logging import RateLimitedLog
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.storage_backend.put_tasks import PutTasks, PutTasksFull
from lmcache.v1.storage_backend.redis.cluster import UNREACHED, ShardedConnections
from lmcache.v1.storage_backend.redis.codec import EncodeBuffer, put_batches

logger = logging.getLogger(__name__)


class RedisPuts(ShardedConnections):
    """:class:`ShardedConnections` plus the queued, counted puts of the Redis tier."""

    queues_own_puts = True
    _puts: PutTasks[CacheEngineKey]
    _encoder: EncodeBuffer
    _put_log: RateLimitedLog

    @abc.abstractmethod
    def redis_key(self, key: CacheEngineKey) -> str:
        """Redis key of ``key`` (the backend decides the naming)."""

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        return key in self._puts

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> list[Future] | None:
        """Queue ``SET NX`` pipelines; never blocks, and futures never raise (failed puts
        and puts past the queue's bound are dropped and counted)."""
        if len(keys) != len(objs):
            raise ValueError(f"{len(keys)} keys but {len(objs)} objects")
        futures: list[Future] = []
        for batch in put_batches(list(zip(keys, objs)), self.settings.max_batch_bytes):
            future = self._queue_batch(dict(batch), on_complete_callback)
            if future is not None:
                futures.append(future)
        return futures

    def _queue_batch(
        self,
        batch: dict[CacheEngineKey, MemoryObj],
        on_complete_callback: Callable[[CacheEngineKey], None] | None,
    ) -> Future | None:
        def submit(fresh: list[CacheEngineKey]) -> Future:
            chosen = [(key, batch[key]) for key in fresh]
            for _, obj in chosen:
                obj.ref_count_up()  # released once the value is encoded
            return self._executor.submit(self._put_batch, chosen, on_complete_callback)

        try:
            return self._puts.start(list(batch), submit)
        except PutTasksFull as full:
            self.stats.add(puts_dropped=full.keys, puts_queue_full=full.keys)
            self._put_log.log(
                logging.WARNING,
                "queue full",
                "redis put queue full (%d chunks): %d chunks dropped",
                full.limit,
                full.keys,
            )
            return None

    def _put_batch(
        self,
        batch: list[tuple[CacheEngineKey, MemoryObj]],
        on_complete_callback: Callable[[CacheEngineKey], None] | None,
    ) -> None:
        keys = [key for key, _ in batch]
        values: list[memoryview] = []
        try:
            try:
                values = self._encoder.encode(batch)
            finally:
                for _, obj in batch:
                    obj.ref_count_down()
            stored = self._store(keys, values)
        except Exception as exc:
            self._put_log.log(
                logging.ERROR,
                f"put: {type(exc).__name__}",
                "redis put of %d chunks failed: %s: %s",
                len(keys),
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
            stored = None
        finally:
            self._puts.finish(keys)
        if stored is None:
            self.stats.add(puts_dropped=len(keys))
            return
        landed = [i for i, answer in enumerate(stored) if answer is not UNREACHED]
        self.stats.add(
            puts=len(landed),
            puts_dropped=len(keys) - len(landed),
            put_bytes=sum(len(values[i]) for i in landed),
        )
        if on_complete_callback is not None:
            for i in landed:
                on_complete_callback(keys[i])

    def _store(self, keys: list[CacheEngineKey], values: list[memoryview]) -> list[Any] | None:
        """SET NX answers per key (:data:`UNREACHED` for a cluster shard that is down);
        None if nothing could be stored."""
        ttl_ms = int(self.settings.ttl_s * 1000) if self.settings.ttl_s is not None else None
        names = [self.redis_key(key) for key in keys]

        def op(client: Any, indices: Sequence[int]) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for i in indices:
                # NX: the first value of a key wins (keys name content, so a second
                # writer has nothing new to say) and readers never see a value change.
                pipe.set(names[i], values[i], nx=True, px=ttl_ms)
            answers = list(pipe.execute(raise_on_error=False))
            failed = [a for a in answers if isinstance(a, Exception)]
            if failed:
                raise failed[0]
            return answers

        if self.settings.cluster:
            return self._run_sharded(names, op, "put", unreached=UNREACHED)
        return self._run(lambda c: op(c, range(len(keys))), "put")  # type: ignore[no-any-return]

    def _wait_for_pending(self, keys: list[CacheEngineKey]) -> None:
        self._puts.wait_for(keys)

    def wait_for_puts(self) -> None:
        """Block until every submitted put has finished (tests, shutdown, benchmarks)."""
        self._puts.wait_for()
