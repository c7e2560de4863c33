"""lmcache-core's two engine-driven transports (:class:`.base.EngineDrivenContext`).

* :class:`EngineDrivenContextShm`: chunks live in slots of the server's shared-memory
  pool; the worker gathers into / scatters from slot views mapped in its own process.
* :class:`EngineDrivenContextInline`: chunk bytes travel inside the messages (msgpack
  :class:`~lmcache.v1.multiprocess.wire.custom_types.InlineChunks`); lmcache-core's
  replacement for upstream's pickle transport.

:class:`~.engine_driven.EngineDrivenTransferContext` moves chunks of these transports on
its own faster paths (pipelined and framed inline requests); the prepare/commit methods
here serve callers of the generic interface, such as the asynchronous store of
:mod:`.async_engine_driven`.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from typing import Any

import msgspec
import torch

from lmcache.v1.multiprocess.transfer_context.base import (
    EngineDrivenContext,
    EngineDrivenContextMetadata,
)
from lmcache.v1.multiprocess.wire.custom_types import InlineChunks, IPCCacheServerKey
from lmcache.v1.platform.cpu.shm import SHM_DIR
from lmcache.v1.platform.kv_layout import dtype_from_name

__all__ = [
    "EMPTY_INLINE_DATA",
    "create_engine_driven_context",
    "SHM_DIR",
    "EngineDrivenContextInline",
    "EngineDrivenContextShm",
    "map_server_pool",
    "slot_tensors",
]

logger = logging.getLogger(__name__)


def map_server_pool(path: str, size: int) -> torch.Tensor:
    """The server's shared-memory pool as a byte tensor, its page tables filled at once.

    The server touched every page already, but each process faults the pages into its own
    page tables on first access: without ``MAP_POPULATE`` those minor faults (one per 4 KiB)
    landed inside every store into a fresh slot and cost more than the copy itself.
    """
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    with open(path, "r+b") as file:
        if os.fstat(file.fileno()).st_size < size:
            raise OSError(f"{path} is smaller than the pool size {size} the server announced")
        buffer = mmap.mmap(file.fileno(), size, flags=flags)
    # The tensor keeps the mapping alive; it is unmapped when the last view is gone.
    return torch.frombuffer(buffer, dtype=torch.uint8)


def slot_tensors(pool: torch.Tensor, slots: list[dict[str, Any]]) -> list[torch.Tensor]:
    """Views of the pool slots the server described (offset, length, dtype, shape)."""
    tensors = []
    for slot in slots:
        offset, length = int(slot["offset"]), int(slot["length"])
        if offset < 0 or offset + length > pool.numel():
            raise ValueError("the server sent a slot outside its shared-memory pool")
        raw = pool[offset : offset + length]
        tensors.append(raw.view(dtype_from_name(str(slot["dtype"]))).view(slot["shape"]))
    return tensors


class _PendingByKey:
    """Per-request state between a ``prepare_*`` and its ``commit_*``.

    Keyed by the key object's identity: the caller passes the same key to both calls, and
    keys need not be hashable.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[int, tuple[IPCCacheServerKey, Any]] = {}

    def put(self, key: IPCCacheServerKey, value: Any) -> None:
        with self._lock:
            # The key is kept too, so its id stays unique while the entry lives.
            self._items[id(key)] = (key, value)

    def pop(self, key: IPCCacheServerKey) -> tuple[bool, Any]:
        with self._lock:
            item = self._items.pop(id(key), None)
        return (False, None) if item is None else (True, item[1])


# An inline commit of no chunks: the server wants chunk data on that sub-path, even none.
EMPTY_INLINE_DATA = msgspec.msgpack.encode(InlineChunks(chunk_indices=[], chunks=[]))


def _chunks_to_write(
    req_client: Any, key: IPCCacheServerKey, instance_id: int, empty_commit: bytes
) -> Any:
    """The server's ``prepare_store`` context; commits at once when nothing is to write.

    The server expects a ``commit_store`` after every ``prepare_store``, while the
    interface lets a caller skip the commit when no chunk is to be written.
    """
    context = req_client.prepare_store(key, instance_id).context
    if not context.get("chunk_indices"):
        req_client.commit_store(key, instance_id, empty_commit)
    return context


class EngineDrivenContextShm(EngineDrivenContext):
    """Chunks in the server's shared-memory pool ``shm_name`` (mapped here)."""

    def __init__(
        self,
        metadata: EngineDrivenContextMetadata,
        req_client: Any,
        mq_timeout: float,
        shm_name: str,
        pool_size: int,
    ) -> None:
        super().__init__(metadata, req_client, mq_timeout)
        self.shm_name = shm_name
        self.pool: torch.Tensor | None = map_server_pool(
            os.path.join(SHM_DIR, shm_name.lstrip("/")), pool_size
        )
        self._reading = _PendingByKey()

    def _pool(self) -> torch.Tensor:
        if self.pool is None:
            raise RuntimeError("the shared-memory transport is closed")
        return self.pool

    def prepare_store(
        self, key: IPCCacheServerKey, instance_id: int
    ) -> tuple[list[torch.Tensor], list[int]]:
        context = _chunks_to_write(self.req_client, key, instance_id, b"")
        indices = [int(i) for i in context.get("chunk_indices", [])]
        if not indices:
            return [], []
        return slot_tensors(self._pool(), context["slots"]), indices

    def commit_store(
        self, key: IPCCacheServerKey, instance_id: int, chunks: list[torch.Tensor]
    ) -> bool:
        # The chunks are the server's own slots: nothing to send but the commit.
        return bool(self.req_client.commit_store(key, instance_id, b""))

    def prepare_retrieve(
        self, key: IPCCacheServerKey, instance_id: int
    ) -> list[torch.Tensor] | None:
        response = self.req_client.prepare_retrieve(key, instance_id)
        if not response.success:
            return None
        self._reading.put(key, True)
        return slot_tensors(self._pool(), response.context["slots"])

    def commit_retrieve(self, key: IPCCacheServerKey, instance_id: int) -> bool:
        # Only a hit holds slots on the server; a miss has nothing to release.
        found, _ = self._reading.pop(key)
        return bool(self.req_client.commit_retrieve(key, instance_id)) if found else True

    def close(self) -> None:
        self.pool = None


class EngineDrivenContextInline(EngineDrivenContext):
    """Chunk bytes inside the ``commit_store`` / ``prepare_retrieve`` messages (msgpack)."""

    def __init__(
        self, metadata: EngineDrivenContextMetadata, req_client: Any, mq_timeout: float
    ) -> None:
        super().__init__(metadata, req_client, mq_timeout)
        self._writing = _PendingByKey()

    def prepare_store(
        self, key: IPCCacheServerKey, instance_id: int
    ) -> tuple[list[torch.Tensor], list[int]]:
        context = _chunks_to_write(self.req_client, key, instance_id, EMPTY_INLINE_DATA)
        indices = [int(i) for i in context.get("chunk_indices", [])]
        if not indices:
            return [], []
        self._writing.put(key, indices)
        shape, dtype = self.layout_desc.shapes[0], self.layout_desc.dtypes[0]
        return [torch.empty(shape, dtype=dtype) for _ in indices], indices

    def commit_store(
        self, key: IPCCacheServerKey, instance_id: int, chunks: list[torch.Tensor]
    ) -> bool:
        found, indices = self._writing.pop(key)
        if not found:
            raise RuntimeError("commit_store without a prepare_store for this key")
        if len(chunks) < len(indices):
            raise ValueError(f"{len(indices)} chunks were to be written, got {len(chunks)}")
        data = msgspec.msgpack.encode(
            InlineChunks(
                chunk_indices=indices,
                chunks=[
                    t.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
                    for t in chunks[: len(indices)]
                ],
            )
        )
        return bool(self.req_client.commit_store(key, instance_id, data))

    def prepare_retrieve(
        self, key: IPCCacheServerKey, instance_id: int
    ) -> list[torch.Tensor] | None:
        response = self.req_client.prepare_retrieve(key, instance_id)
        if not response.success:
            return None
        if not response.data:
            return []
        decoded = msgspec.msgpack.decode(response.data, type=InlineChunks)
        shape, dtype = self.layout_desc.shapes[0], self.layout_desc.dtypes[0]
        # bytearray: a writable copy, as torch tensors over read-only bytes are not allowed.
        return [torch.frombuffer(bytearray(raw), dtype=dtype).view(shape) for raw in decoded.chunks]

    def commit_retrieve(self, key: IPCCacheServerKey, instance_id: int) -> bool:
        # The chunks came inside the reply: the server holds nothing for this request.
        return True

    def close(self) -> None:
        return None


def create_engine_driven_context(
    metadata: EngineDrivenContextMetadata,
    req_client: Any,
    mq_timeout: float,
    shm_name: str,
    pool_size: int,
    *,
    use_pickle: bool = False,
    require_shm: bool = False,
) -> EngineDrivenContext:
    """The transport for a server offering shared memory ``shm_name`` of ``pool_size`` bytes.

    The SHM transport when the server offers a pool this process can map; otherwise the
    inline one (chunk bytes inside the messages), which stands in for upstream's pickle
    transport: ``use_pickle`` forces it.  ``require_shm`` turns every fallback to inline
    into a ``ValueError``.
    """
    if require_shm and use_pickle:
        raise ValueError("use_pickle and require_shm exclude each other")
    if use_pickle:
        return EngineDrivenContextInline(metadata, req_client, mq_timeout)
    if not shm_name or pool_size <= 0:
        if require_shm:
            raise ValueError(
                "engine-driven sub-path 'shm' was forced, but the server offers no shared "
                "memory (it runs with --shm-name '')"
            )
        return EngineDrivenContextInline(metadata, req_client, mq_timeout)
    try:
        return EngineDrivenContextShm(metadata, req_client, mq_timeout, shm_name, pool_size)
    except (OSError, RuntimeError) as exc:
        if require_shm:
            raise ValueError(f"cannot map the server's shared memory {shm_name!r}: {exc}") from exc
        logger.warning(
            "cannot map the server's shared memory %r (%s); using the inline sub-path",
            shm_name,
            exc,
        )
        return EngineDrivenContextInline(metadata, req_client, mq_timeout)
