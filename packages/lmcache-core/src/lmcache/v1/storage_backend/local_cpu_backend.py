"""L1: memory objects kept in host memory, bounded by the allocator's buffer.

Objects stored here live in this backend's allocator; objects from elsewhere are copied in
on put.  Eviction follows the configured policy but never touches an object that is
pinned or still referenced by a reader (``MemoryObj.can_evict``); the tier counts its
evictions (:attr:`LocalCPUBackend.evictions`).  When nothing can be
evicted, ``allocate(..., busy_loop=True)`` sleeps on the allocator's free notification
(re-checking at least every 50 ms for unpins) until ``blocking_timeout_secs`` runs out;
under ``noop``, which never evicts, it returns ``None`` at once.  The tier counts its bytes
per tenant (:attr:`LocalCPUBackend.salt_usage`) for quotas and ``IsolatedLRU``.

With :class:`~lmcache.v1.storage_backend.l1_settings.L1Settings` (the cache server passes
upstream's storage-manager flags) L1 also evicts ahead of need, as upstream's L1 eviction
controller: a notifier thread checks the usage every ``notifier_interval_ms`` (and at once
after a put that crosses the watermark); at ``eviction_trigger_watermark`` x capacity it
evicts ``eviction_ratio`` of the used bytes in policy order.  A pin older than
``read_ttl_seconds`` no longer protects its object (upstream's read-lock TTL).  On-demand
eviction when an allocation fails stays as the last resort.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import torch

from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig, LMCacheMetadata
from lmcache.v1.memory.allocator import HostMemoryAllocator
from lmcache.v1.memory.base import MemoryAllocatorInterface, MemoryObj
from lmcache.v1.memory.format import MemoryFormat, normalize_shapes_dtypes, part_offsets
from lmcache.v1.storage_backend.abstract_backend import AllocatorBackendInterface
from lmcache.v1.storage_backend.cache_policy import get_cache_policy
from lmcache.v1.storage_backend.l1_settings import L1Settings
from lmcache.v1.storage_backend.quota import QuotaManager, SaltUsage

logger = logging.getLogger(__name__)

_RECHECK_INTERVAL_S = 0.05


class LocalCPUBackend(AllocatorBackendInterface):
    """Host-memory tier and the allocator every other tier reads into.

    ``memory_allocator`` lets a caller (the MP server) supply its own allocator, e.g. one
    over shared memory; otherwise one of ``config.max_local_cpu_size`` GB is created, in
    shared memory when ``shm_name`` (or ``extra_config["local_cpu.shm_name"]``) is given.
    With ``config.local_cpu`` false the backend only allocates and stores nothing.
    ``quota_manager`` is the tenants' quota registry (shared by the tiers; a private one
    when not given); :attr:`salt_usage` counts this tier's bytes per tenant.
    """

    def __init__(
        self,
        config: LMCacheEngineConfig | None = None,
        metadata: LMCacheMetadata | None = None,
        dst_device: str = "cpu",
        memory_allocator: MemoryAllocatorInterface | None = None,
        shm_name: str | None = None,
        l1_settings: L1Settings | None = None,
        *,
        quota_manager: QuotaManager | None = None,
    ) -> None:
        super().__init__(dst_device=dst_device)
        self.config = config if config is not None else LMCacheEngineConfig()
        self.metadata = metadata
        self.use_hot = self.config.local_cpu
        self._shm_name = shm_name
        self.l1_settings = l1_settings.validate() if l1_settings is not None else None
        self._owns_allocator = memory_allocator is None
        self.memory_allocator: MemoryAllocatorInterface = (
            memory_allocator
            if memory_allocator is not None
            else self.initialize_allocator(self.config, metadata)
        )
        self._hot: dict[CacheEngineKey, MemoryObj] = {}
        self.quota_manager = quota_manager if quota_manager is not None else QuotaManager()
        self.salt_usage = SaltUsage()
        self._policy = get_cache_policy(
            self.config.cache_policy, quotas=self.quota_manager, usage=self.salt_usage
        )
        self._evictions = 0
        self._lock = threading.Lock()
        self._timeout_s = float(self.config.blocking_timeout_secs)
        self._closed = False
        # Called with (key, present) under the lock whenever a key enters or leaves this
        # tier (see add_residency_listener).
        self._residency_listeners: list[Callable[[CacheEngineKey, bool], None]] = []
        # When each pinned key was last pinned: a pin past read_ttl_seconds has expired.
        self._pinned_at: dict[CacheEngineKey, float] = {}
        self._read_ttl = self.l1_settings.read_ttl_seconds if self.l1_settings else None
        self.watermark_evictions = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._notifier: threading.Thread | None = None
        if self.l1_settings is not None:
            self._start_notifier()

    # -- allocator ----------------------------------------------------------------------------

    def initialize_allocator(
        self, config: LMCacheEngineConfig, metadata: LMCacheMetadata | None
    ) -> MemoryAllocatorInterface:
        settings = self.l1_settings
        if settings is None:
            return HostMemoryAllocator.from_config(config, shm_name=self._shm_name)
        size = int(config.max_local_cpu_size * 1024**3)
        allocator = HostMemoryAllocator.from_config(
            config,
            shm_name=self._shm_name,
            align_bytes=settings.align_bytes,
            init_size=settings.init_size_bytes(size),
            use_hugepages=settings.use_hugepages,
        )
        allocator.start_growing()
        return allocator

    def get_memory_allocator(self) -> MemoryAllocatorInterface:
        return self.memory_allocator

    def get_allocator_backend(self) -> LocalCPUBackend:
        return self

    def allocate(
        self,
        shapes: torch.Size | list[torch.Size],
        dtypes: torch.dtype | list[torch.dtype],
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        eviction: bool = True,
        busy_loop: bool = True,
    ) -> MemoryObj | None:
        obj = self.memory_allocator.allocate(shapes, dtypes, fmt)
        if obj is not None or not eviction:
            return obj
        shape_list, dtype_list = normalize_shapes_dtypes(shapes, dtypes)
        nbytes = part_offsets(shape_list, dtype_list)[-1]
        if nbytes > self.memory_allocator.capacity_bytes:
            logger.warning(
                "allocation of %d bytes exceeds the CPU tier (%d bytes)",
                nbytes,
                self.memory_allocator.capacity_bytes,
            )
            return None
        deadline = time.monotonic() + self._timeout_s
        while True:
            obj = self._evict_and_allocate(shapes, dtypes, fmt, nbytes)
            if obj is not None:
                return obj
            remaining = deadline - time.monotonic()
            # A policy that never evicts (noop) refuses at once: waiting would only stall.
            if not busy_loop or remaining <= 0 or self._closed or not self._policy.evicts:
                if busy_loop and self._policy.evicts:
                    logger.warning(
                        "no evictable memory for %d bytes after %.1fs (pinned or in use)",
                        nbytes,
                        self._timeout_s,
                    )
                return None
            self.memory_allocator.wait_for_free(min(_RECHECK_INTERVAL_S, remaining))

    def _evict_and_allocate(
        self,
        shapes: torch.Size | list[torch.Size],
        dtypes: torch.dtype | list[torch.dtype],
        fmt: MemoryFormat,
        nbytes: int,
    ) -> MemoryObj | None:
        with self._lock:
            while True:
                obj = self.memory_allocator.allocate(shapes, dtypes, fmt)
                if obj is not None:
                    return obj
                victims = self._pick_victims(nbytes)
                if not victims:
                    return None
                for key in victims:
                    self._drop_locked(key, evicted=True)
                self._evictions += len(victims)

    def _pick_victims(self, nbytes: int, ahead_of_need: bool = False) -> list[CacheEngineKey]:
        victims: list[CacheEngineKey] = []
        freed = 0
        now = time.monotonic()
        order = (
            self._policy.ahead_of_need_candidates() if ahead_of_need else self._policy.candidates()
        )
        for key in order:
            obj = self._hot[key]
            if self._evictable(key, obj, now):
                victims.append(key)
                freed += obj.get_physical_size()
                if freed >= nbytes:
                    break
        return victims

    def _evictable(self, key: CacheEngineKey, obj: MemoryObj, now: float) -> bool:
        """Unpinned and unread -- or pinned only by pins all older than the read TTL
        (upstream's TTL read lock: a lookup that never retrieves cannot hold L1 forever).
        An object a reader still references is never taken."""
        if obj.can_evict:
            return True
        if self._read_ttl is None or obj.get_ref_count() > 1:
            return False
        pinned_at = self._pinned_at.get(key)
        return pinned_at is not None and now - pinned_at >= self._read_ttl

    def _note_pinned(self, key: CacheEngineKey) -> None:
        if self._read_ttl is not None:
            self._pinned_at[key] = time.monotonic()

    def _pin_locked(self, key: CacheEngineKey, obj: MemoryObj) -> bool:
        """Pin under the tier's lock.  With a read TTL a pin taken after the last one
        expired starts over at one holder, as upstream's TTL lock does: holders that never
        unpinned are forgotten, so the new holder's unpin makes the object evictable."""
        if self._read_ttl is not None:
            now = time.monotonic()
            last = self._pinned_at.get(key)
            if last is not None and now - last >= self._read_ttl:
                obj.metadata.pin_count = 0
            self._pinned_at[key] = now
        return obj.pin()

    # -- watermark eviction (L1Settings) ------------------------------------------------------

    def _start_notifier(self) -> None:
        self._notifier = threading.Thread(
            target=self._notifier_loop, name="lmc-l1-evict", daemon=True
        )
        self._notifier.start()

    def _notifier_loop(self) -> None:
        assert self.l1_settings is not None
        interval = self.l1_settings.notifier_interval_s
        while not self._stop.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.evict_to_watermark()
            except Exception:  # the notifier must outlive one bad pass
                logger.exception("L1 watermark eviction failed")

    def over_watermark(self) -> bool:
        settings = self.l1_settings
        if settings is None:
            return False
        return self.used_bytes >= settings.eviction_trigger_watermark * self.capacity_bytes

    def evict_to_watermark(self) -> int:
        """At or above the trigger watermark, evict ``eviction_ratio`` of the used bytes
        (policy order, evictable objects only); returns how many objects went."""
        settings = self.l1_settings
        if settings is None or not self.over_watermark():
            return 0
        target = int(self.used_bytes * settings.eviction_ratio)
        with self._lock:
            victims = self._pick_victims(max(1, target), ahead_of_need=True)
            for key in victims:
                self._drop_locked(key, evicted=True)
            self._evictions += len(victims)
            self.watermark_evictions += len(victims)
        if victims:
            logger.debug("L1 over its watermark: evicted %d objects", len(victims))
        return len(victims)

    def _drop_locked(self, key: CacheEngineKey, evicted: bool = False) -> MemoryObj:
        obj = self._hot.pop(key)
        self._pinned_at.pop(key, None)
        self.salt_usage.remove(key)
        if evicted:
            self._policy.on_evict(key)
        else:
            self._policy.on_remove(key)
        obj.ref_count_down()
        self._notify_residency(key, False)
        return obj

    def add_residency_listener(self, listener: Callable[[CacheEngineKey, bool], None]) -> None:
        """Call ``listener(key, present)`` whenever a key enters (True) or leaves (False)
        this tier, by any path (put, eviction, removal).  It runs under the tier's lock, so
        it must be cheap and must not call back into storage; its errors are logged."""
        with self._lock:
            self._residency_listeners.append(listener)

    def _notify_residency(self, key: CacheEngineKey, present: bool) -> None:
        for listener in self._residency_listeners:
            try:
                listener(key, present)
            except Exception:  # an observer must never break a put or an eviction
                logger.exception("residency listener failed for %s", key)

    def batched_allocate(
        self,
        shapes: torch.Size | list[torch.Size],
        dtypes: torch.dtype | list[torch.dtype],
        batch_size: int,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        eviction: bool = True,
        busy_loop: bool = True,
    ) -> list[MemoryObj] | None:
        objs: list[MemoryObj] = []
        for _ in range(batch_size):
            obj = self.allocate(shapes, dtypes, fmt, eviction=eviction, busy_loop=busy_loop)
            if obj is None:
                for allocated in objs:
                    allocated.ref_count_down()
                return None
            objs.append(obj)
        return objs

    def calculate_chunk_budget(self) -> int:
        if self.metadata is None:
            return super().calculate_chunk_budget()
        return self.memory_allocator.capacity_bytes // max(1, self.metadata.chunk_bytes())

    # -- storage ------------------------------------------------------------------------------

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        with self._lock:
            obj = self._hot.get(key)
            if obj is None:
                return False
            if pin:
                self._pin_locked(key, obj)
            return True

    def batched_contains(self, keys: list[CacheEngineKey], pin: bool = False) -> int:
        hot = self._hot
        hits = 0
        with self._lock:
            for key in keys:
                obj = hot.get(key)
                if obj is None:
                    break
                if pin:
                    self._pin_locked(key, obj)
                hits += 1
        return hits

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        return False  # puts complete synchronously

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> list[Future] | None:
        if len(keys) != len(objs):
            raise ValueError(f"{len(keys)} keys but {len(objs)} objects")
        for key, obj in zip(keys, objs):
            if self.use_hot:
                self._insert(key, obj)
            if on_complete_callback is not None:
                on_complete_callback(key)
        return None

    def _insert(self, key: CacheEngineKey, obj: MemoryObj) -> None:
        if obj.parent() is not self.memory_allocator:
            with self._lock:
                if key in self._hot:
                    return
            copy = self._copy_in(obj)
            if copy is None:
                logger.warning("CPU tier full: put of %s dropped", key)
                return
            obj, owned = copy, True
        else:
            owned = False
        with self._lock:
            if key in self._hot:
                if owned:
                    obj.ref_count_down()
                return
            if not owned:
                obj.ref_count_up()
            self._hot[key] = obj
            self.salt_usage.add(key, obj.get_physical_size())
            self._policy.on_put(key)
            if obj.metadata.pin_count:
                self._note_pinned(key)  # pinned by its writer (e.g. the prefetcher)
            self._notify_residency(key, True)
        if self.l1_settings is not None and self.over_watermark():
            self._wake.set()  # evict now, not at the next tick

    def _copy_in(self, src: MemoryObj) -> MemoryObj | None:
        """A copy of a foreign object in this tier's allocator (so the byte bound holds)."""
        size = src.get_size()
        src_raw = src.raw_tensor
        if src_raw is None:
            return None
        if src.metadata.shapes is None and src.get_dtype() is not None:
            dst = self.allocate(src.get_shape(), src.get_dtypes()[0], src.get_memory_format())
        else:
            dst = self.allocate(src.get_shapes(), src.get_dtypes(), src.get_memory_format())
        if dst is None:
            return None
        dst_raw = dst.raw_tensor
        assert dst_raw is not None
        dst_raw[:size].copy_(src_raw[:size])
        if src.metadata.used_size is not None:
            dst.set_used_size(src.metadata.used_size)
        return dst

    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        with self._lock:
            obj = self._hot.get(key)
            if obj is None:
                return None
            obj.ref_count_up()
            self._policy.on_hit(key)
            return obj

    def batched_get_blocking(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        results: list[MemoryObj | None] = []
        with self._lock:
            for key in keys:
                obj = self._hot.get(key)
                if obj is not None:
                    obj.ref_count_up()
                    self._policy.on_hit(key)
                results.append(obj)
        return results

    def pin(self, key: CacheEngineKey) -> bool:
        with self._lock:
            obj = self._hot.get(key)
            if obj is None:
                return False
            return self._pin_locked(key, obj)

    def unpin(self, key: CacheEngineKey) -> bool:
        with self._lock:
            obj = self._hot.get(key)
            return obj.unpin() if obj is not None else False

    def remove_unpinned(self, key: CacheEngineKey) -> bool:
        """Remove ``key`` unless something pins it.  Readers that still reference the
        object keep its memory until they let go (the tier only drops its reference)."""
        with self._lock:
            obj = self._hot.get(key)
            if obj is None or obj.metadata.pin_count > 0:
                return False
            self._drop_locked(key)
            return True

    def remove_object(self, key: CacheEngineKey, obj: MemoryObj) -> bool:
        """Remove ``key`` only while ``obj`` itself is its object and nobody pins or reads
        it (a chunk put here for one reader, e.g. a prefetch, leaves without taking a newer
        copy with it)."""
        with self._lock:
            if self._hot.get(key) is not obj or not obj.can_evict:
                return False
            self._drop_locked(key)
            return True

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        with self._lock:
            obj = self._hot.get(key)
            if obj is None or (not force and not obj.can_evict):
                return False
            self._drop_locked(key)
            return True

    # -- introspection ------------------------------------------------------------------------

    def get_keys(self) -> list[CacheEngineKey]:
        with self._lock:
            return list(self._hot)

    def __len__(self) -> int:
        return len(self._hot)

    @property
    def used_bytes(self) -> int:
        return self.memory_allocator.used_bytes

    @property
    def capacity_bytes(self) -> int:
        return self.memory_allocator.capacity_bytes

    @property
    def evictions(self) -> int:
        """Objects evicted to make room since the tier started; removals and ``close``
        are not evictions."""
        return self._evictions

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._notifier is not None and self._notifier is not threading.current_thread():
            self._notifier.join()
        with self._lock:
            self._closed = True
            for key in list(self._hot):
                self._drop_locked(key)
        if self._owns_allocator:
            self.memory_allocator.close()
