"""Remote tier on Redis (RESP): one node or a Redis Cluster, shared by many servers.

Each chunk is one Redis string: the disk tier's chunk format (see
:mod:`lmcache.v1.storage_backend.chunk_format`: ``LMCD`` prefix, version, checksum
algorithm, JSON header with key, shapes, dtypes and memory format, XXH3-64 -- or CRC-32 --
sums of header and payload) followed by the raw bytes.  Nothing is pickled.  A value whose
checksum, length or embedded key does not match is a miss and is deleted.

Redis key: ``<namespace>:{<chunk hash>}:<CacheEngineKey string>``.  The braces are a
Redis Cluster hash tag: every key of one chunk (all workers, all layers) lands in one
slot, and a chunk's value is a single key, so it never spans slots.

Every batch is one pipeline: a prefix lookup of N keys is N ``EXISTS`` in one round trip
(one per shard in cluster mode; the prefix is computed over the merged answers), gets are
one ``MGET`` (per-shard ``GET`` pipelines in cluster mode), puts are ``SET NX [PX ttl]``
pipelines run on a small thread pool behind a bounded queue (``put_queue_chunks``).  Round
trips are counted by the connections themselves (:attr:`RedisBackend.stats`).

Failures never reach the caller: while Redis is unreachable (its circuit breaker open, the
tier reported degraded) lookups and gets are misses and puts are dropped and counted; one
half-open probe ``retry_interval_s`` after the last failure finds it back, so a hung Redis
holds at most one call per interval for the socket timeout.  At start an unreachable Redis
is an error, or a warning when ``optional``.

Configuration: :class:`~.settings.RedisSettings` (``extra_config["storage_plugin.redis.
<option>"]``, ``remote_url``, or the server's ``--l2-adapter '{"type": "resp", ...}'`` JSON).
Connections and the breaker: :mod:`.connection`; per-shard dispatch: :mod:`.cluster`;
the put path: :mod:`.puts`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lmcache.logging import RateLimitedLog
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig, LMCacheMetadata
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.storage_backend.abstract_backend import (
    AllocatorBackendInterface,
    StoragePluginInterface,
)
from lmcache.v1.storage_backend.chunk_format import (
    CorruptFileError,
    DecodedValue,
    allocate_for_read,
    decode_value,
)
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.put_tasks import PutTasks
from lmcache.v1.storage_backend.redis.breaker import CircuitBreaker, RedisStats
from lmcache.v1.storage_backend.redis.codec import EncodeBuffer
from lmcache.v1.storage_backend.redis.connection import (
    aclose_quietly,
    counting_connection_classes,
)
from lmcache.v1.storage_backend.redis.puts import RedisPuts
from lmcache.v1.storage_backend.redis.settings import RedisSettings

logger = logging.getLogger(__name__)


class RedisBackend(RedisPuts, StoragePluginInterface):
    """The Redis tier.  Reads allocate from ``local_cpu_backend`` (the L1 allocator)."""

    def __init__(
        self,
        dst_device: str = "cpu",
        config: LMCacheEngineConfig | None = None,
        metadata: LMCacheMetadata | None = None,
        local_cpu_backend: LocalCPUBackend | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        settings: RedisSettings | None = None,
    ) -> None:
        super().__init__(dst_device, config, metadata, local_cpu_backend, loop)
        try:
            import redis  # noqa: F401 - fail early with the install hint
        except ImportError:
            raise ImportError(
                "the Redis tier needs redis-py: pip install 'lmcache-core[redis]'"
            ) from None
        if settings is None:
            settings = RedisSettings.from_config(config or LMCacheEngineConfig())
        self.settings = settings
        self.stats = RedisStats()
        self._availability = CircuitBreaker(
            settings.retry_interval_s, self.stats, probe_timeout_s=settings.probe_timeout_s
        )
        self._shard_breakers: dict[str, CircuitBreaker] = {}
        self._classes = counting_connection_classes(self.stats)
        self._prefix = f"{settings.namespace}:"
        self._client_lock = threading.Lock()
        self._client: Any = None
        self._aclient: Any = None
        self._pins: dict[CacheEngineKey, int] = {}
        self._puts = PutTasks(limit=settings.put_queue_chunks)
        self._lock = threading.Lock()
        self._put_log = RateLimitedLog(logger)
        self._error_log = RateLimitedLog(logger)
        self._executor = ThreadPoolExecutor(
            max_workers=settings.put_workers, thread_name_prefix="lmc-redis-put"
        )
        self._encoder = EncodeBuffer()
        self._closed = False
        self._connect_at_start()

    def __str__(self) -> str:
        mode = "cluster" if self.settings.cluster else "node"
        return f"RedisBackend({self.settings.redacted()['url']}, {mode})"

    # -- keys ---------------------------------------------------------------------------------

    def redis_key(self, key: CacheEngineKey) -> str:
        """Redis key of ``key``; the ``{chunk hash}`` hash tag keeps a chunk in one slot."""
        return f"{self._prefix}{{{key.chunk_hash_hex}}}:{key.to_string()}"

    # -- lookups ------------------------------------------------------------------------------

    def _exists_pipeline(self, client: Any, names: list[str]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.exists(name)
        return list(pipe.execute(raise_on_error=False))

    def batched_contains(self, keys: list[CacheEngineKey], pin: bool = False) -> int:
        """Leading stored keys: N ``EXISTS`` in one pipeline (one round trip per shard)."""
        if not keys:
            return 0
        names = [self.redis_key(k) for k in keys]
        if self.settings.cluster:
            answers = self._run_sharded(
                names, lambda c, idx: self._exists_pipeline(c, [names[i] for i in idx]), "lookup"
            )
        else:
            answers = self._run(lambda c: self._exists_pipeline(c, names), "lookup")
        return self._prefix_hits(keys, answers, pin)

    def _prefix_hits(self, keys: list[CacheEngineKey], answers: list[Any] | None, pin: bool) -> int:
        if answers is None:
            return 0
        hits = 0
        for answer in answers:
            if not (isinstance(answer, int) and answer > 0):
                break
            hits += 1
        if pin and hits:
            with self._lock:
                for key in keys[:hits]:
                    self._pins[key] = self._pins.get(key, 0) + 1
        return hits

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        return self.batched_contains([key], pin=pin) == 1

    # -- gets ---------------------------------------------------------------------------------

    def _fetch(self, client: Any, names: list[str]) -> list[Any]:
        if not self.settings.cluster:
            return list(client.mget(names))
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.get(name)
        return list(pipe.execute(raise_on_error=False))

    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        return self.batched_get_blocking([key])[0]

    def batched_get_blocking(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        if not keys:
            return []
        self._wait_for_pending(keys)
        names = [self.redis_key(k) for k in keys]
        if self.settings.cluster:
            values = self._run_sharded(
                names, lambda c, idx: self._fetch(c, [names[i] for i in idx]), "get"
            )
        else:
            values = self._run(lambda c: self._fetch(c, names), "get")
        return self._materialize(keys, values)

    def _materialize(
        self, keys: list[CacheEngineKey], values: list[Any] | None
    ) -> list[MemoryObj | None]:
        if values is None:
            self.stats.add(misses=len(keys))
            return [None] * len(keys)
        results: list[MemoryObj | None] = []
        corrupt: list[str] = []
        for key, value in zip(keys, values):
            obj = None
            if isinstance(value, bytes):
                try:
                    obj = self._to_memory_obj(decode_value(key, value))
                except CorruptFileError as exc:
                    logger.warning("corrupt redis value for %s (%s): deleted", key, exc)
                    corrupt.append(self.redis_key(key))
            results.append(obj)
        hits = sum(obj is not None for obj in results)
        self.stats.add(hits=hits, misses=len(keys) - hits, corrupt=len(corrupt))
        if corrupt:
            self._run(lambda c: self._delete_names(c, corrupt), "delete")
        return results

    def _to_memory_obj(self, value: DecodedValue) -> MemoryObj | None:
        obj = allocate_for_read(self.local_cpu_backend, value.shapes, value.dtypes, value.fmt)
        if obj is None:
            logger.warning("no memory to read a %d-byte chunk from redis", len(value.payload))
            return None
        if value.used_size is not None:
            obj.set_used_size(int(value.used_size))
        obj.byte_array[:] = value.payload
        return obj

    # -- asyncio path -------------------------------------------------------------------------

    async def batched_async_contains(
        self, lookup_id: str, keys: list[CacheEngineKey], pin: bool = False
    ) -> int:
        if not keys:
            return 0
        names = [self.redis_key(k) for k in keys]

        async def op(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.exists(name)
            return list(await pipe.execute(raise_on_error=False))

        return self._prefix_hits(keys, await self._run_async(op, "lookup"), pin)

    async def batched_get_non_blocking(
        self, lookup_id: str, keys: list[CacheEngineKey], transfer_spec: Any = None
    ) -> list[MemoryObj]:
        if not keys:
            return []
        names = [self.redis_key(k) for k in keys]

        async def op(client: Any) -> list[Any]:
            if not self.settings.cluster:
                return list(await client.mget(names))
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.get(name)
            return list(await pipe.execute(raise_on_error=False))

        results = self._materialize(keys, await self._run_async(op, "get"))
        objs: list[MemoryObj] = []
        for obj in results:
            if obj is None:
                break
            objs.append(obj)
        for obj in results[len(objs) :]:
            if obj is not None:
                obj.ref_count_down()
        return objs

    # -- pins and removal ---------------------------------------------------------------------

    def pin(self, key: CacheEngineKey) -> bool:
        """Pins are local to this process: they stop :meth:`remove` without ``force``;
        Redis itself may still expire (TTL) or evict (maxmemory) the entry."""
        return self.contains(key, pin=True)

    def unpin(self, key: CacheEngineKey) -> bool:
        with self._lock:
            count = self._pins.get(key, 0)
            if count == 0:
                return False
            if count == 1:
                del self._pins[key]
            else:
                self._pins[key] = count - 1
            return True

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        return self.batched_remove([key], force=force) == 1

    def batched_remove(self, keys: list[CacheEngineKey], force: bool = True) -> int:
        self._wait_for_pending(keys)
        with self._lock:
            if not force:
                keys = [k for k in keys if not self._pins.get(k)]
            for key in keys:
                self._pins.pop(key, None)
        if not keys:
            return 0
        names = [self.redis_key(k) for k in keys]
        answers = self._run(lambda c: self._delete_names(c, names), "delete")
        return sum(int(a) for a in answers or [] if isinstance(a, int))

    @staticmethod
    def _delete_names(client: Any, names: list[str]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.delete(name)
        return list(pipe.execute(raise_on_error=False))

    # -- misc ---------------------------------------------------------------------------------

    def get_allocator_backend(self) -> AllocatorBackendInterface:
        if self.local_cpu_backend is None:
            raise RuntimeError("RedisBackend was built without a LocalCPUBackend")
        return self.local_cpu_backend

    def close(self) -> None:
        if self._closed:
            return
        self.wait_for_puts()
        self._closed = True
        self._executor.shutdown(wait=True)
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                logger.debug("closing the redis client failed", exc_info=True)
        aclient, self._aclient = self._aclient, None
        if aclient is not None and self.loop is not None and not self.loop.is_closed():
            if self.loop.is_running():
                asyncio.run_coroutine_threadsafe(aclose_quietly(aclient), self.loop)
            else:
                self.loop.run_until_complete(aclose_quietly(aclient))
