"""The storage manager: L1 CPU -> L2 disk -> plugin backends, behind one backend interface.

* Puts go to L1 synchronously and are written through to every lower tier in the
  background (tiers that queue their own writes, the disk and Redis tiers, directly;
  others on the manager's writer thread).  The returned futures finish when the lower
  tiers have the data; ``on_complete_callback`` fires once a key is readable through the
  manager.
* Lookups (``batched_contains``) count the leading keys present in *any* tier, advancing
  tier by tier with each tier's batch call rather than probing key by key.
* A hit in a lower tier is promoted into L1.
* With the ``skip_l1`` store policy (upstream's ``--l2-store-policy skip_l1``) L1 is a
  write buffer: a stored key leaves L1 once its write-through finished and a lower tier
  holds it (a key no lower tier took stays in L1; so does one still pinned or read).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig, LMCacheMetadata
from lmcache.v1.memory.base import MemoryAllocatorInterface, MemoryObj
from lmcache.v1.memory.format import MemoryFormat
from lmcache.v1.storage_backend.abstract_backend import (
    AllocatorBackendInterface,
    StorageBackendInterface,
)
from lmcache.v1.storage_backend.l1_settings import STORE_POLICIES
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend
from lmcache.v1.storage_backend.plugins import storage_plugin_launcher
from lmcache.v1.storage_backend.quota import QuotaManager
from lmcache.v1.storage_backend.serde import wrap_with_serde
from lmcache.v1.storage_backend.tier_settings import TierSettings

logger = logging.getLogger(__name__)

L1_NAME = "LocalCPUBackend"
L2_NAME = "LocalDiskBackend"


def create_storage_backends(
    config: LMCacheEngineConfig | TierSettings,
    metadata: LMCacheMetadata | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
    dst_device: str = "cpu",
    memory_allocator: MemoryAllocatorInterface | None = None,
    shm_name: str | None = None,
    quota_manager: QuotaManager | None = None,
) -> OrderedDict[str, StorageBackendInterface]:
    """Backends in lookup order, keyed as upstream ("LocalCPUBackend", "LocalDiskBackend",
    the Redis tiers, the L2 adapter tiers, then plugin names).  The CPU backend is always
    created: every tier allocates from it.  ``config`` is the engine config or the
    :class:`TierSettings` built from either config (the cache server's flags).  L1 and the
    disk tier share ``quota_manager`` (a fresh one when not given; it is L1's
    ``quota_manager``)."""
    settings = (
        config if isinstance(config, TierSettings) else TierSettings.from_engine_config(config)
    )
    engine_config = settings.config
    backends: OrderedDict[str, StorageBackendInterface] = OrderedDict()
    try:
        cpu = LocalCPUBackend(
            engine_config,
            metadata,
            dst_device,
            memory_allocator,
            shm_name,
            settings.l1,
            quota_manager=quota_manager,
        )
        backends[L1_NAME] = cpu
        if settings.disk_enabled:
            disk = LocalDiskBackend(
                engine_config, cpu, metadata, dst_device, quota_manager=cpu.quota_manager
            )
            backends[L2_NAME] = wrap_with_serde(disk, settings.disk_serde, cpu)
        _add_remote_tiers(settings, metadata, loop, cpu, dst_device, backends)
        _add_adapter_tiers(settings, cpu, dst_device, backends)
        storage_plugin_launcher(engine_config, metadata, loop, cpu, dst_device, backends)
    except BaseException:
        _close_quietly(backends)  # a tier that cannot start must not leak the ones before it
        raise
    return backends


def _add_remote_tiers(
    settings: TierSettings,
    metadata: LMCacheMetadata | None,
    loop: asyncio.AbstractEventLoop | None,
    cpu: LocalCPUBackend,
    dst_device: str,
    backends: OrderedDict[str, StorageBackendInterface],
) -> None:
    if not settings.remote:
        return
    from lmcache.v1.storage_backend.redis.backend import RedisBackend  # redis-py only if used

    for tier in settings.remote:
        redis = RedisBackend(
            dst_device, settings.config, metadata, cpu, loop, settings=tier.settings
        )
        backends[tier.name] = redis  # closed on a failed start-up even if wrapping fails
        backends[tier.name] = wrap_with_serde(redis, tier.serde, cpu)
        logger.info("remote tier %s added", tier.name)


def _add_adapter_tiers(
    settings: TierSettings,
    cpu: LocalCPUBackend,
    dst_device: str,
    backends: OrderedDict[str, StorageBackendInterface],
) -> None:
    """A bridged tier per adapter-interface ``--l2-adapter`` (mock, plugin, fault_inject)."""
    if not settings.adapters:
        return
    from lmcache.v1.storage_backend.l2_adapters.bridge import L2AdapterBackend
    from lmcache.v1.storage_backend.l2_adapters.factory import create_l2_adapter_from_registry

    for tier in settings.adapters:
        adapter = create_l2_adapter_from_registry(tier.config)
        try:
            adapter.set_backend_identity(tier.name.split(":", 1)[1], shared=tier.config.shared)
            bridged = L2AdapterBackend(
                adapter, tier.name, cpu, dst_device, eviction=tier.config.eviction_config
            )
            backends[tier.name] = wrap_with_serde(bridged, tier.serde, cpu)
        except BaseException:
            adapter.close()  # not a backend yet, so _close_quietly would not reach it
            raise
        logger.info("L2 adapter tier %s added (%s)", tier.name, type(adapter).__name__)


def _close_quietly(backends: OrderedDict[str, StorageBackendInterface]) -> None:
    for backend in reversed(list(backends.values())):
        try:
            backend.close()
        except Exception:
            logger.exception("closing %s after a failed start-up", backend)


CreateStorageBackends = create_storage_backends


class StorageManager(AllocatorBackendInterface):
    """All tiers as one :class:`AllocatorBackendInterface` (allocation comes from L1)."""

    def __init__(
        self,
        config: LMCacheEngineConfig | None = None,
        metadata: LMCacheMetadata | None = None,
        dst_device: str = "cpu",
        loop: asyncio.AbstractEventLoop | None = None,
        memory_allocator: MemoryAllocatorInterface | None = None,
        shm_name: str | None = None,
        backends: OrderedDict[str, StorageBackendInterface] | None = None,
        store_policy: str = "default",
    ) -> None:
        super().__init__(dst_device=dst_device)
        self.config = config if config is not None else LMCacheEngineConfig()
        self.metadata = metadata
        self.storage_backends = (
            backends
            if backends is not None
            else create_storage_backends(
                self.config, metadata, loop, dst_device, memory_allocator, shm_name
            )
        )
        l1 = self.storage_backends.get(L1_NAME)
        if not isinstance(l1, LocalCPUBackend):
            raise ValueError(f"the backends need a {L1_NAME!r} entry")
        self.local_cpu_backend = l1
        self._l1_stores = l1.use_hot
        self._lower = [b for name, b in self.storage_backends.items() if name != L1_NAME]
        self._tiers: list[StorageBackendInterface] = ([l1] if self._l1_stores else []) + self._lower
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmc-writethrough")
        if store_policy not in STORE_POLICIES:
            raise ValueError(f"unknown store policy {store_policy!r}; one of {STORE_POLICIES}")
        # skip_l1 without a lower tier has nothing to hand a key to: L1 keeps it, as upstream.
        self._skip_l1 = store_policy == "skip_l1" and self._l1_stores and bool(self._lower)
        if store_policy == "skip_l1" and not self._skip_l1:
            logger.warning("store policy skip_l1 without a lower tier: L1 keeps every key")
        self.store_policy = store_policy
        self._pending: set[Future] = set()
        self._pending_lock = threading.Lock()

    # -- allocation (L1) ----------------------------------------------------------------------

    def initialize_allocator(
        self, config: LMCacheEngineConfig, metadata: LMCacheMetadata
    ) -> MemoryAllocatorInterface:
        return self.local_cpu_backend.initialize_allocator(config, metadata)

    def get_memory_allocator(self) -> MemoryAllocatorInterface:
        return self.local_cpu_backend.get_memory_allocator()

    def get_allocator_backend(self) -> LocalCPUBackend:
        return self.local_cpu_backend

    def allocate(
        self,
        shapes: torch.Size | list[torch.Size],
        dtypes: torch.dtype | list[torch.dtype],
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        eviction: bool = True,
        busy_loop: bool = True,
    ) -> MemoryObj | None:
        return self.local_cpu_backend.allocate(shapes, dtypes, fmt, eviction, busy_loop)

    def batched_allocate(
        self,
        shapes: torch.Size | list[torch.Size],
        dtypes: torch.dtype | list[torch.dtype],
        batch_size: int,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        eviction: bool = True,
        busy_loop: bool = True,
    ) -> list[MemoryObj] | None:
        return self.local_cpu_backend.batched_allocate(
            shapes, dtypes, batch_size, fmt, eviction, busy_loop
        )

    def calculate_chunk_budget(self) -> int:
        return self.local_cpu_backend.calculate_chunk_budget()

    # -- puts ---------------------------------------------------------------------------------

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        return any(b.exists_in_put_tasks(key) for b in self._tiers)

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> list[Future] | None:
        if len(keys) != len(objs):
            raise ValueError(f"{len(keys)} keys but {len(objs)} objects")
        callback_left = on_complete_callback
        if self._l1_stores:
            self.local_cpu_backend.batched_submit_put_task(keys, objs, transfer_spec)
            if on_complete_callback is not None:
                for key in keys:
                    on_complete_callback(key)
            callback_left = None
        futures: list[Future] = []
        for backend in self._lower:
            futures.extend(self._write_through(backend, keys, objs, transfer_spec, callback_left))
            callback_left = None
        if self._skip_l1:
            futures.append(self._leave_l1_after(futures, list(keys)))
        return futures or None

    def _leave_l1_after(self, writes: list[Future], keys: list[CacheEngineKey]) -> Future:
        """skip_l1: once ``writes`` are done, drop from L1 each key a lower tier holds.
        The returned future (tracked by :meth:`wait_for_puts`) finishes after that."""
        done: Future = Future()
        with self._pending_lock:
            self._pending.add(done)
        done.add_done_callback(self._forget)
        left = [len(writes)]
        lock = threading.Lock()

        def run() -> None:
            try:
                self._drop_l1_copies(keys)
            finally:
                done.set_result(None)

        def one_finished(_f: Future | None = None) -> None:
            with lock:
                left[0] -= 1
                last = left[0] <= 0
            if last:
                # On the writer thread, not in whichever tier's thread finished last: the
                # check below asks the tiers, which may wait on their own threads.
                try:
                    self._writer.submit(run)
                except RuntimeError:  # shut down: L1 keeps the keys
                    done.set_result(None)

        if not writes:
            left[0] = 1
            one_finished()
        for write in writes:
            write.add_done_callback(one_finished)
        return done

    def _drop_l1_copies(self, keys: list[CacheEngineKey]) -> None:
        for key in keys:
            try:
                held_below = any(b.contains(key) for b in self._lower)
            except Exception:
                logger.exception("skip_l1: cannot ask the lower tiers about %s", key)
                continue
            if held_below:
                self.local_cpu_backend.remove_unpinned(key)

    def _write_through(
        self,
        backend: StorageBackendInterface,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any,
        callback: Callable[[CacheEngineKey], None] | None,
    ) -> list[Future]:
        if backend.queues_own_puts:
            # The disk and Redis tiers queue their own writes (and hold their own
            # references); through the writer thread a hung tier would hold up the others.
            return backend.batched_submit_put_task(keys, objs, transfer_spec, callback) or []
        for obj in objs:
            obj.ref_count_up()  # the writer thread's references

        def write() -> None:
            try:
                inner = backend.batched_submit_put_task(keys, objs, transfer_spec, callback)
                for future in inner or []:
                    future.result()
            except Exception:
                logger.exception("write-through to %s failed", backend)
            finally:
                for obj in objs:
                    obj.ref_count_down()

        future = self._writer.submit(write)
        with self._pending_lock:
            self._pending.add(future)
        future.add_done_callback(self._forget)
        return [future]

    def _forget(self, future: Future) -> None:
        with self._pending_lock:
            self._pending.discard(future)

    def wait_for_puts(self) -> None:
        """Block until every write-through submitted so far has finished."""
        with self._pending_lock:
            pending = list(self._pending)
        for future in pending:
            future.exception()
        for backend in self._lower:
            wait = getattr(backend, "wait_for_puts", None)
            if backend.queues_own_puts and callable(wait):
                wait()

    # -- reads --------------------------------------------------------------------------------

    def _promote(self, keys: Sequence[CacheEngineKey], objs: list[MemoryObj]) -> None:
        if self._l1_stores and keys:
            self.local_cpu_backend.batched_submit_put_task(keys, objs)

    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        for backend in self._tiers:
            obj = backend.get_blocking(key)
            if obj is not None:
                if backend is not self.local_cpu_backend:
                    self._promote([key], [obj])
                return obj
        return None

    def batched_get_blocking(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        results: list[MemoryObj | None] = [None] * len(keys)
        missing = list(range(len(keys)))
        for backend in self._tiers:
            if not missing:
                break
            found = backend.batched_get_blocking([keys[i] for i in missing])
            still_missing = []
            hit_keys, hit_objs = [], []
            for i, obj in zip(missing, found):
                if obj is None:
                    still_missing.append(i)
                else:
                    results[i] = obj
                    hit_keys.append(keys[i])
                    hit_objs.append(obj)
            if backend is not self.local_cpu_backend:
                self._promote(hit_keys, hit_objs)
            missing = still_missing
        return results

    def read_lower_tiers(self, key: CacheEngineKey) -> MemoryObj | None:
        """``key`` read from the first tier below L1 holding it, not promoted (the
        prefetcher inserts it into L1 itself, pinned).  A tier's error propagates."""
        for backend in self._lower:
            if backend.contains(key):
                obj = backend.get_blocking(key)
                if obj is not None:
                    return obj
        return None

    def in_l1(self, key: CacheEngineKey) -> bool:
        return self._l1_stores and self.local_cpu_backend.contains(key)

    def pin_tiers(self, key: CacheEngineKey) -> tuple[StorageBackendInterface, ...]:
        """Pin ``key`` in every tier holding it; returns those tiers (unpin exactly them:
        a copy promoted into L1 later carries no pin of this caller)."""
        return tuple(b for b in self._tiers if b.contains(key, pin=True))

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        if pin:  # protect every copy, so no tier drops it while the caller relies on it
            return any([b.contains(key, pin=True) for b in self._tiers])
        return any(b.contains(key) for b in self._tiers)

    def lookup_location(self, key: CacheEngineKey) -> str | None:
        """Name of the first tier holding ``key``."""
        for name, backend in self.storage_backends.items():
            if (backend is not self.local_cpu_backend or self._l1_stores) and backend.contains(key):
                return name
        return None

    def batched_contains(self, keys: list[CacheEngineKey], pin: bool = False) -> int:
        """Leading keys present in some tier; each tier extends the prefix with one batch call."""
        pos = 0
        progressed = True
        while progressed and pos < len(keys):
            progressed = False
            for backend in self._tiers:
                hits = backend.batched_contains(keys[pos:], pin=pin)
                if hits:
                    pos += hits
                    progressed = True
                    if pos == len(keys):
                        break
        return pos

    # -- pins and removal ---------------------------------------------------------------------

    def pin(self, key: CacheEngineKey) -> bool:
        return any([b.pin(key) for b in self._tiers])

    def unpin(self, key: CacheEngineKey) -> bool:
        return any([b.unpin(key) for b in self._tiers])

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        removed = [b.remove(key, force=force) for b in self._tiers]
        return any(removed)

    # -- tenants ------------------------------------------------------------------------------

    @property
    def quota_manager(self) -> QuotaManager:
        """The tenants' byte quotas, shared by L1 and the disk tier."""
        return self.local_cpu_backend.quota_manager

    def usage_bytes_by_tier(self) -> dict[str, dict[str, int]]:
        """Tier name -> (salt -> resident bytes), for the tiers that count per tenant."""
        usage: dict[str, dict[str, int]] = {}
        for name, backend in self.storage_backends.items():
            counter = getattr(backend, "salt_usage", None)
            if counter is not None:
                usage[name] = counter.bytes_by_salt()
        return usage

    def get_usage_bytes_by_cache_salt(self) -> dict[str, int]:
        """Salt -> its bytes in the tier where it holds the most (upstream's name).

        Quotas apply per tier (each tier evicts by its own usage), and a write-through
        copy sits in several tiers at once, so adding the tiers up would double-count.
        """
        totals: dict[str, int] = {}
        for per_salt in self.usage_bytes_by_tier().values():
            for salt, used in per_salt.items():
                totals[salt] = max(totals.get(salt, 0), used)
        return totals

    def touch_cache(self) -> None:
        for backend in self._tiers:
            backend.touch_cache()

    def cancel_request(self, req_id: str) -> None:
        for backend in self._tiers:
            backend.cancel_request(req_id)

    def close(self) -> None:
        self.wait_for_puts()
        self._writer.shutdown(wait=True)
        for backend in reversed(list(self.storage_backends.values())):
            try:
                backend.close()
            except Exception:
                logger.exception("closing %s failed", backend)
