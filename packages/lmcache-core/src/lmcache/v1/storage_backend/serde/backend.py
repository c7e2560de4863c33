"""An L2 tier with a serde: any :class:`StorageBackendInterface` wrapped so that what it
stores is the serde's output.

* Puts: the wrapper takes a reference to each object and queues the encoding on its own
  threads (``max_workers``), then hands the encoded chunk to the inner tier.  Nothing runs
  on the caller's thread but the queueing: serde work is off the request path, and an L1
  hit never reaches this tier at all.
* Reads: the inner tier's object is decoded into memory from L1's allocator.  Bytes the
  serde cannot decode (another serde or none wrote them, they were altered, or the key is
  wrong) are a miss; the entry is removed and counted in ``serde_errors``, never returned.
* Keys: chunks are stored under the caller's key tagged ``lmcache.tag.serde=<spec>``
  (:meth:`ChunkSerde.stored_key`), so a tier read without this serde -- or with another --
  finds nothing instead of foreign bytes, and a folder or Redis shared between
  configurations keeps them apart.

Everything else (pins, removal, usage, health, evictions) is the inner tier's; attributes
the wrapper does not define are read from it, so the server's tier reports keep working.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

import torch

from lmcache.logging import RateLimitedLog
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory.base import MemoryObj, MemoryObjMetadata
from lmcache.v1.memory.format import MemoryFormat
from lmcache.v1.memory.objects import TensorMemoryObj
from lmcache.v1.storage_backend.abstract_backend import (
    AllocatorBackendInterface,
    StorageBackendInterface,
)
from lmcache.v1.storage_backend.chunk_format import allocate_for_read
from lmcache.v1.storage_backend.put_tasks import PutTasks, PutTasksFull
from lmcache.v1.storage_backend.serde.base import SerdeError, byte_tensor
from lmcache.v1.storage_backend.serde.chunk_serde import ChunkSerde

logger = logging.getLogger(__name__)

MAX_QUEUED = 1024
"""Chunks waiting for the serde at most (each holds a reference to its L1 copy); a put
beyond it is dropped for this tier (logged, counted in ``dropped_puts``): the tier falls
behind, L1 keeps serving."""


def blob_object(blob: bytes | bytearray) -> TensorMemoryObj:
    """``blob`` as a standalone memory object (uint8, ``BINARY``) a tier can store; a
    ``bytearray`` is used in place (the object then owns it), ``bytes`` are copied."""
    raw = (
        torch.frombuffer(blob, dtype=torch.uint8)
        if isinstance(blob, bytearray) and blob
        else byte_tensor(blob)
    )
    meta = MemoryObjMetadata(
        shape=torch.Size([len(blob)]),
        dtype=torch.uint8,
        address=0,
        phy_size=len(blob),
        ref_count=1,
        fmt=MemoryFormat.BINARY,
    )
    return TensorMemoryObj(raw, meta)


class SerdeBackend(StorageBackendInterface):
    """``inner`` with ``serde`` applied to every chunk it stores (see the module doc)."""

    queues_own_puts = True

    def __init__(
        self,
        inner: StorageBackendInterface,
        serde: ChunkSerde,
        local_cpu_backend: AllocatorBackendInterface | None = None,
        max_workers: int = 1,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        super().__init__(dst_device=inner.dst_device)
        self.inner = inner
        self.serde = serde
        self.local_cpu_backend = local_cpu_backend
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="lmc-serde")
        self._puts: PutTasks[CacheEngineKey] = PutTasks(limit=max_queued)
        self.serde_errors = 0
        self.dropped_puts = 0
        self.serialized = 0
        self.deserialized = 0
        self._log = RateLimitedLog(logger)

    def __str__(self) -> str:
        return f"{self.inner}[serde {self.serde.spec}]"

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the wrapper lacks: the inner tier's reports (used_bytes,
        # evictions, health_problems, path, ...).
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def _stored(self, key: CacheEngineKey) -> CacheEngineKey:
        return self.serde.stored_key(key)

    # -- puts ---------------------------------------------------------------------------------

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        return key in self._puts or self.inner.exists_in_put_tasks(self._stored(key))

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> list[Future] | None:
        if len(keys) != len(objs):
            raise ValueError(f"{len(keys)} keys but {len(objs)} objects")
        futures: list[Future] = []
        for key, obj in zip(keys, objs):
            try:
                future = self._puts.start(
                    [key], partial(self._queue, key, obj, on_complete_callback)
                )
            except PutTasksFull as full:
                self.dropped_puts += 1
                self._log.log(
                    logging.WARNING, "full", "%s: %d chunks queued, put dropped", self, full.limit
                )
                continue
            if future is not None:
                futures.append(future)
        return futures

    def _queue(
        self,
        key: CacheEngineKey,
        obj: MemoryObj,
        callback: Callable[[CacheEngineKey], None] | None,
        _fresh: list[CacheEngineKey],
    ) -> Future:
        obj.ref_count_up()  # ours until the encoding is done
        return self._executor.submit(self._encode_and_store, key, obj, callback)

    def _encode_and_store(
        self,
        key: CacheEngineKey,
        obj: MemoryObj,
        callback: Callable[[CacheEngineKey], None] | None,
    ) -> None:
        try:
            try:
                # Asked here, not on the caller's thread: for Redis it is a round trip.
                if self.inner.contains(self._stored(key)):
                    return
                blob = self.serde.encode(key, obj)
            finally:
                obj.ref_count_down()
            self.serialized += 1
            stored = blob_object(blob)
            inner_callback = None if callback is None else (lambda _stored_key: callback(key))
            try:
                inner = self.inner.batched_submit_put_task(
                    [self._stored(key)], [stored], None, inner_callback
                )
                for future in inner or []:
                    future.result()
            finally:
                stored.ref_count_down()
        except SerdeError as exc:
            self._log.log(logging.WARNING, "encode", "%s: chunk not stored: %s", self, exc)
        except Exception:
            logger.exception("%s: put of %s failed", self, key)
            raise
        finally:
            self._puts.finish([key])

    def wait_for_puts(self) -> None:
        self._puts.wait_for()
        wait = getattr(self.inner, "wait_for_puts", None)
        if callable(wait):
            wait()

    # -- reads --------------------------------------------------------------------------------

    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        self._puts.wait_for([key])
        stored_key = self._stored(key)
        blob = self.inner.get_blocking(stored_key)
        if blob is None:
            return None
        try:
            obj = self.serde.decode(key, blob.byte_array, self._allocate)
        except SerdeError as exc:
            self.serde_errors += 1
            self._log.log(
                logging.WARNING, "decode", "%s: stored chunk unreadable, removed: %s", self, exc
            )
            self.inner.remove(stored_key)
            return None
        finally:
            blob.ref_count_down()
        if obj is not None:
            self.deserialized += 1
        return obj

    def batched_get_blocking(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        return [self.get_blocking(key) for key in keys]

    def _allocate(
        self, shapes: list[torch.Size], dtypes: list[torch.dtype], fmt: MemoryFormat
    ) -> MemoryObj | None:
        return allocate_for_read(self.local_cpu_backend, shapes, dtypes, fmt)

    # -- keys, pins and removal: the inner tier's, under the stored key ------------------------

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        return self.inner.contains(self._stored(key), pin=pin)

    def batched_contains(self, keys: list[CacheEngineKey], pin: bool = False) -> int:
        return self.inner.batched_contains([self._stored(k) for k in keys], pin=pin)

    def pin(self, key: CacheEngineKey) -> bool:
        return self.inner.pin(self._stored(key))

    def unpin(self, key: CacheEngineKey) -> bool:
        return self.inner.unpin(self._stored(key))

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        self._puts.wait_for([key])
        return self.inner.remove(self._stored(key), force=force)

    def batched_remove(self, keys: list[CacheEngineKey], force: bool = True) -> int:
        return sum(1 for key in keys if self.remove(key, force=force))

    def touch_cache(self) -> None:
        self.inner.touch_cache()

    def cancel_request(self, req_id: str) -> None:
        self.inner.cancel_request(req_id)

    def get_allocator_backend(self) -> AllocatorBackendInterface:
        return self.inner.get_allocator_backend()

    def close(self) -> None:
        self._puts.wait_for()
        self._executor.shutdown(wait=True)
        self.inner.close()
