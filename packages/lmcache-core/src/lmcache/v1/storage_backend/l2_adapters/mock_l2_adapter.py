"""The ``mock`` adapter: objects kept in this process's memory, at a simulated bandwidth.

For tests and demos of the adapter machinery (upstream's ``mock`` type): a store copies
each object (so the caller may free its buffer), skips keys already stored and keys that
do not fit ``max_size_gb``; lookups lock what they find; loads copy back.  Each task is
reported done ``bytes / mock_bandwidth_gb`` seconds after it was taken up; tasks overlap
(each waits for its own bytes only), as in upstream's mock.  JSON:
``{"type": "mock", "max_size_gb": 1, "mock_bandwidth_gb": 10}``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.memory.objects import TensorMemoryObj
from lmcache.v1.platform.notifiers import create_event_notifier
from lmcache.v1.storage_backend.l2_adapters.base import L2AdapterInterface, L2TaskId
from lmcache.v1.storage_backend.l2_adapters.bitmap import Bitmap
from lmcache.v1.storage_backend.l2_adapters.config import (
    L2AdapterConfigBase,
    register_l2_adapter_type,
)
from lmcache.v1.storage_backend.l2_adapters.factory import register_l2_adapter_factory
from lmcache.v1.storage_backend.l2_adapters.types import L2StoreResult

if TYPE_CHECKING:
    from lmcache.v1.storage_backend.l2_adapters.types import (
        L1MemoryDesc,
        MemoryLayoutDesc,
        ObjectKey,
    )

logger = logging.getLogger(__name__)

_GB = 1024**3


def object_bytes(obj: MemoryObj) -> torch.Tensor:
    """The logical bytes of ``obj`` as a flat uint8 view (no copy)."""
    raw = obj.raw_tensor
    if raw is None:
        raise ValueError(f"{type(obj).__name__} has no tensor to copy")
    return raw.reshape(-1).view(torch.uint8)[: obj.get_size()]


def clone_tensor_memory_obj(obj: MemoryObj) -> TensorMemoryObj:
    """A standalone copy of ``obj``'s bytes and layout (no allocator behind it)."""
    raw = object_bytes(obj).clone()
    meta = obj.metadata
    layout = type(meta)(
        shape=meta.shape,
        dtype=meta.dtype,
        address=0,
        phy_size=raw.numel(),
        ref_count=1,
        fmt=meta.fmt,
        shapes=meta.shapes,
        dtypes=meta.dtypes,
        used_size=meta.used_size,
    )
    return TensorMemoryObj(raw, layout, parent_allocator=None)


def _positive_number(d: dict, name: str) -> float:
    value = d.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{name} must be a positive number")
    return float(value)


class MockL2AdapterConfig(L2AdapterConfigBase):
    """``max_size_gb`` (capacity) and ``mock_bandwidth_gb`` (GB/s), both required, > 0."""

    def __init__(self, max_size_gb: float, mock_bandwidth_gb: float) -> None:
        self.max_size_gb = max_size_gb
        self.mock_bandwidth_gb = mock_bandwidth_gb

    @classmethod
    def from_dict(cls, d: dict) -> MockL2AdapterConfig:
        return cls(
            max_size_gb=_positive_number(d, "max_size_gb"),
            mock_bandwidth_gb=_positive_number(d, "mock_bandwidth_gb"),
        )

    @classmethod
    def help(cls) -> str:
        return (
            "Mock L2 adapter config fields:\n"
            "- max_size_gb (float): capacity in GB (required, >0)\n"
            "- mock_bandwidth_gb (float): simulated bandwidth in GB/s (required, >0)"
        )


class _Clock:
    """One thread running submitted work in order and firing completions when due."""

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition()
        self._work: list[Callable[[], None]] = []
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], None]) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("adapter is closed")
            self._work.append(work)
            self._cond.notify()

    def at(self, when: float, done: Callable[[], None]) -> None:
        """Run ``done`` at monotonic time ``when`` (called from the clock's own work)."""
        with self._cond:
            heapq.heappush(self._due, (when, next(self._seq), done))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def _next(self) -> Callable[[], None] | None:
        with self._cond:
            while not self._closed:
                if self._work:
                    return self._work.pop(0)
                now = time.monotonic()
                if self._due and self._due[0][0] <= now:
                    return heapq.heappop(self._due)[2]
                timeout = self._due[0][0] - now if self._due else None
                self._cond.wait(timeout)
            return None

    def _run(self) -> None:
        while (job := self._next()) is not None:
            try:
                job()
            except Exception:
                logger.exception("mock L2 adapter task failed")


class MockL2Adapter(L2AdapterInterface):
    """In-memory objects with a capacity and a simulated bandwidth (see the module doc)."""

    def __init__(self, config: MockL2AdapterConfig) -> None:
        super().__init__(max_capacity_bytes=int(config.max_size_gb * _GB))
        self._config = config
        self._bandwidth = config.mock_bandwidth_gb * _GB
        self._store_efd = create_event_notifier()
        self._lookup_efd = create_event_notifier()
        self._load_efd = create_event_notifier()
        self._objects: dict[ObjectKey, TensorMemoryObj] = {}
        self._locks: Counter[ObjectKey] = Counter()
        self._used_bytes = 0
        self._task_ids = itertools.count()
        self._done_stores: dict[L2TaskId, L2StoreResult] = {}
        self._done_lookups: dict[L2TaskId, Bitmap] = {}
        self._done_loads: dict[L2TaskId, Bitmap] = {}
        self._lock = threading.Lock()
        self._clock = _Clock("lmc-mock-l2")

    def get_store_event_fd(self) -> int:
        return self._store_efd.fileno()

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._lookup_efd.fileno()

    def get_load_event_fd(self) -> int:
        return self._load_efd.fileno()

    def _delay(self, nbytes: int, started: float) -> float:
        """When a transfer of ``nbytes`` taken up at ``started`` is done."""
        return started + nbytes / self._bandwidth

    # -- store ----------------------------------------------------------------------------

    def submit_store_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2TaskId:
        if len(keys) != len(objects):
            raise ValueError(f"{len(keys)} keys but {len(objects)} objects")
        task_id = next(self._task_ids)
        self._clock.submit(lambda: self._store(task_id, list(keys), list(objects)))
        return task_id

    def _store(self, task_id: L2TaskId, keys: list[ObjectKey], objects: list[MemoryObj]) -> None:
        started = time.monotonic()
        stored: list[ObjectKey] = []
        sizes: list[int] = []
        success = True
        try:
            for key, obj in zip(keys, objects, strict=True):
                size = obj.get_size()
                with self._lock:
                    if key in self._objects:
                        continue
                    if self._used_bytes + size > self._max_capacity_bytes:
                        logger.warning(
                            "mock L2 adapter full (%d of %d bytes); %s not stored",
                            self._used_bytes,
                            self._max_capacity_bytes,
                            key,
                        )
                        continue
                    self._objects[key] = clone_tensor_memory_obj(obj)
                    self._used_bytes += size
                stored.append(key)
                sizes.append(size)
        except Exception:
            logger.exception("mock L2 adapter store task %d failed", task_id)
            success = False
        nbytes = sum(sizes)

        def done() -> None:
            with self._lock:
                self._done_stores[task_id] = L2StoreResult(success, nbytes)
            if stored:
                self._notify_keys_stored(stored, sizes)
            self._store_efd.notify()

        self._clock.at(self._delay(nbytes, started), done)

    def pop_completed_store_tasks(self) -> dict[L2TaskId, L2StoreResult]:
        with self._lock:
            done, self._done_stores = self._done_stores, {}
        return done

    # -- lookup and lock ------------------------------------------------------------------

    def submit_lookup_and_lock_task(
        self, keys: list[ObjectKey], group_layout_descs: dict[int, MemoryLayoutDesc]
    ) -> L2TaskId:
        task_id = next(self._task_ids)
        self._clock.submit(lambda: self._lookup(task_id, list(keys)))
        return task_id

    def _lookup(self, task_id: L2TaskId, keys: list[ObjectKey]) -> None:
        found = Bitmap(len(keys))
        with self._lock:
            for i, key in enumerate(keys):
                if key in self._objects:
                    found.set(i)
                    self._locks[key] += 1
            self._done_lookups[task_id] = found
        self._lookup_efd.notify()

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._done_lookups.pop(task_id, None)

    def submit_unlock(self, keys: list[ObjectKey]) -> None:
        keys = list(keys)
        self._clock.submit(lambda: self._unlock(keys))

    def _unlock(self, keys: list[ObjectKey]) -> None:
        with self._lock:
            for key in keys:
                if self._locks[key] <= 1:
                    self._locks.pop(key, None)
                else:
                    self._locks[key] -= 1

    # -- load -----------------------------------------------------------------------------

    def submit_load_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2TaskId:
        if len(keys) != len(objects):
            raise ValueError(f"{len(keys)} keys but {len(objects)} objects")
        task_id = next(self._task_ids)
        self._clock.submit(lambda: self._load(task_id, list(keys), list(objects)))
        return task_id

    def _load(self, task_id: L2TaskId, keys: list[ObjectKey], objects: list[MemoryObj]) -> None:
        started = time.monotonic()
        loaded = Bitmap(len(keys))
        hits: list[ObjectKey] = []
        nbytes = 0
        for i, (key, dst) in enumerate(zip(keys, objects, strict=True)):
            with self._lock:
                src = self._objects.get(key)
            if src is None:
                continue
            src_bytes, dst_bytes = object_bytes(src), object_bytes(dst)
            if src_bytes.numel() != dst_bytes.numel():
                logger.warning(
                    "mock L2 adapter: %s holds %d bytes, the load buffer %d; not loaded",
                    key,
                    src_bytes.numel(),
                    dst_bytes.numel(),
                )
                continue
            dst_bytes.copy_(src_bytes)
            loaded.set(i)
            hits.append(key)
            nbytes += src_bytes.numel()

        def done() -> None:
            if hits:
                self._notify_keys_accessed(hits)
            with self._lock:
                self._done_loads[task_id] = loaded
            self._load_efd.notify()

        self._clock.at(self._delay(nbytes, started), done)

    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._done_loads.pop(task_id, None)

    # -- eviction, status, cleanup --------------------------------------------------------

    def delete(self, keys: list[ObjectKey]) -> None:
        deleted: list[ObjectKey] = []
        sizes: list[int] = []
        with self._lock:
            for key in keys:
                obj = self._objects.pop(key, None)
                if obj is None:
                    continue
                size = obj.get_size()
                self._used_bytes -= size
                deleted.append(key)
                sizes.append(size)
        if deleted:
            self._notify_keys_deleted(deleted, sizes)

    def report_status(self) -> dict:
        with self._lock:
            return {
                "is_healthy": True,
                "type": "MockL2Adapter",
                "stored_object_count": len(self._objects),
                "locked_key_count": len(self._locks),
                "current_size_bytes": self._used_bytes,
                "max_capacity_bytes": self._max_capacity_bytes,
            }

    def debug_get_stored_object_count(self) -> int:
        with self._lock:
            return len(self._objects)

    def debug_get_locked_key_count(self) -> int:
        with self._lock:
            return len(self._locks)

    def debug_has_key(self, key: ObjectKey) -> bool:
        with self._lock:
            return key in self._objects

    def close(self) -> None:
        self._clock.close()
        for notifier in (self._store_efd, self._lookup_efd, self._load_efd):
            notifier.close()


def _create_mock_adapter(
    config: L2AdapterConfigBase, l1_memory_desc: L1MemoryDesc | None = None
) -> L2AdapterInterface:
    if not isinstance(config, MockL2AdapterConfig):
        raise TypeError(f"mock adapter needs a MockL2AdapterConfig, got {type(config).__name__}")
    return MockL2Adapter(config)


register_l2_adapter_type("mock", MockL2AdapterConfig)
register_l2_adapter_factory("mock", _create_mock_adapter)
