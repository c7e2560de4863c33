"""The storage backend contract.

``StorageBackendInterface`` is what every tier implements; ``AllocatorBackendInterface``
adds memory allocation (the CPU tier, which every other tier allocates from);
``StoragePluginInterface`` (alias ``ConfigurableStorageBackendInterface``) fixes the
constructor of backends loaded by name from the configuration.

Reference counts follow :mod:`lmcache.v1.memory.base`: ``get_blocking`` returns an
object carrying one reference owned by the caller, who calls ``ref_count_down()`` when done.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import torch

from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig, LMCacheMetadata
from lmcache.v1.memory.base import MemoryAllocatorInterface, MemoryObj
from lmcache.v1.memory.format import MemoryFormat


class StorageBackendInterface(metaclass=abc.ABCMeta):
    """Basic cache operations every storage tier provides."""

    queues_own_puts: bool = False
    """True for a tier whose ``batched_submit_put_task`` only queues the write in the
    background (taking its own references) and never blocks; the storage manager then
    calls it from the caller's thread instead of its write-through thread."""

    def __init__(self, dst_device: str = "cuda") -> None:
        self.dst_device = dst_device

    def __str__(self) -> str:
        return type(self).__name__

    @abc.abstractmethod
    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        """Whether ``key`` is stored; with ``pin`` a hit is also pinned."""

    @abc.abstractmethod
    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        """Whether a put of ``key`` was submitted and has not finished."""

    @abc.abstractmethod
    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> list[Future] | None:
        """Store ``objs`` under ``keys``; futures for asynchronous puts, else None."""

    @abc.abstractmethod
    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        """The object stored under ``key`` (one reference for the caller), or None."""

    def batched_get_blocking(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        return [self.get_blocking(key) for key in keys]

    @abc.abstractmethod
    def pin(self, key: CacheEngineKey) -> bool:
        """Protect ``key`` from eviction; False if absent."""

    @abc.abstractmethod
    def unpin(self, key: CacheEngineKey) -> bool:
        """Undo one :meth:`pin`; False if absent or not pinned."""

    @abc.abstractmethod
    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        """Drop ``key``; without ``force`` pinned or in-use entries stay.  True if removed."""

    def batched_remove(self, keys: list[CacheEngineKey], force: bool = True) -> int:
        return sum(1 for key in keys if self.remove(key, force=force))

    def batched_contains(self, keys: list[CacheEngineKey], pin: bool = False) -> int:
        """Number of leading ``keys`` that are stored (a prefix hit count)."""
        hits = 0
        for key in keys:
            if not self.contains(key, pin=pin):
                break
            hits += 1
        return hits

    async def async_batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> list[Future] | None:
        return self.batched_submit_put_task(keys, objs, transfer_spec, on_complete_callback)

    def get_non_blocking(self, key: CacheEngineKey, location: str | None = None) -> Future | None:
        """A future resolving to the object, or None on a miss."""
        obj = self.get_blocking(key)
        if obj is None:
            return None
        future: Future = Future()
        future.set_result(obj)
        return future

    async def batched_async_contains(
        self, lookup_id: str, keys: list[CacheEngineKey], pin: bool = False
    ) -> int:
        return self.batched_contains(keys, pin=pin)

    async def batched_get_non_blocking(
        self, lookup_id: str, keys: list[CacheEngineKey], transfer_spec: Any = None
    ) -> list[MemoryObj]:
        """The objects of the leading hits of ``keys`` (stops at the first miss)."""
        results = self.batched_get_blocking(keys)
        objs: list[MemoryObj] = []
        for obj in results:
            if obj is None:
                break
            objs.append(obj)
        # References taken for hits after the first miss are not handed out.
        for obj in results[len(objs) :]:
            if obj is not None:
                obj.ref_count_down()
        return objs

    def touch_cache(self) -> None:  # noqa: B027 - optional hook
        """Refresh recency of recently used keys; a no-op unless a tier batches touches."""

    def cancel_request(self, req_id: str) -> None:  # noqa: B027 - optional hook
        """Forget per-request state (e.g. lookup pins); a no-op by default."""

    @abc.abstractmethod
    def get_allocator_backend(self) -> AllocatorBackendInterface:
        """The backend whose allocator provides memory for this one's results."""

    @abc.abstractmethod
    def close(self) -> None: ...


class AllocatorBackendInterface(StorageBackendInterface):
    """A storage backend that also allocates the memory objects it stores."""

    @abc.abstractmethod
    def initialize_allocator(
        self, config: LMCacheEngineConfig, metadata: LMCacheMetadata
    ) -> MemoryAllocatorInterface: ...

    @abc.abstractmethod
    def get_memory_allocator(self) -> MemoryAllocatorInterface: ...

    @abc.abstractmethod
    def allocate(
        self,
        shapes: torch.Size | list[torch.Size],
        dtypes: torch.dtype | list[torch.dtype],
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        eviction: bool = True,
        busy_loop: bool = True,
    ) -> MemoryObj | None: ...

    @abc.abstractmethod
    def batched_allocate(
        self,
        shapes: torch.Size | list[torch.Size],
        dtypes: torch.dtype | list[torch.dtype],
        batch_size: int,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        eviction: bool = True,
        busy_loop: bool = True,
    ) -> list[MemoryObj] | None: ...

    def calculate_chunk_budget(self) -> int:
        """How many full chunks fit in this backend's memory (needs the model metadata)."""
        raise NotImplementedError(f"{type(self).__name__} does not know its chunk size")


class StoragePluginInterface(StorageBackendInterface):
    """Base class of backends constructed by name from the configuration."""

    def __init__(
        self,
        dst_device: str = "cuda",
        config: LMCacheEngineConfig | None = None,
        metadata: LMCacheMetadata | None = None,
        # Typed by the interface, not by ``LocalCPUBackend``: the interfaces module must not
        # depend on a tier that implements it (the L1 tier is what callers pass).
        local_cpu_backend: AllocatorBackendInterface | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(dst_device=dst_device)
        self.config = config
        self.metadata = metadata
        self.local_cpu_backend = local_cpu_backend
        self.loop = loop


ConfigurableStorageBackendInterface = StoragePluginInterface
