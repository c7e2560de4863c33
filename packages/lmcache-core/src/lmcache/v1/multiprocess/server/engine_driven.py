"""Engine-driven operations: the worker copies its KV pages; the server lends L1 slots.

``prepare_*`` reserves (store) or pins (retrieve) L1 chunk objects and remembers them in
the pending table until ``commit_*``.  The bytes travel through the server's shared
memory segment (the SHM sub-path: slots are offsets into it) or, without shared memory,
inside the messages (the inline sub-path, :mod:`.inline_codec`).  Upstream LMCache's pickle
sub-path is refused before any data moves.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.multiprocess.server.inline_codec import (
    encode_inline,
    fill_frames,
    fill_inline,
    pinned_frames,
)
from lmcache.v1.multiprocess.server.kv_layout import KVLayout, dtype_name
from lmcache.v1.multiprocess.server.pending import Pending
from lmcache.v1.multiprocess.server.state import Worker
from lmcache.v1.multiprocess.server.tenants import current_tenant
from lmcache.v1.multiprocess.server.workers import WorkerRegistry
from lmcache.v1.multiprocess.wire.chunking import ChunkSpan
from lmcache.v1.multiprocess.wire.custom_types import (
    IPCCacheServerKey,
    PrepareRetrieveResponse,
    PrepareStoreResponse,
    RegisterEngineDrivenContextPayload,
    RegisterEngineDrivenContextResponse,
)
from lmcache.v1.multiprocess.wire.protocol import BulkReply, ErrorCode, ProtocolError
from lmcache.v1.platform.transfer_mode import MPTransferMode

logger = logging.getLogger(__name__)


class EngineDrivenOps(WorkerRegistry):
    """Registration, sub-path choice, ``prepare_*`` and ``commit_*`` of engine-driven workers."""

    def register_kv_cache_engine_driven_context(
        self, payload: RegisterEngineDrivenContextPayload
    ) -> RegisterEngineDrivenContextResponse:
        self._require_mode(MPTransferMode.ENGINE_DRIVEN, "register_kv_cache_engine_driven_context")
        try:
            layout = KVLayout.from_engine_payload(
                payload.num_layers,
                payload.block_size,
                payload.hidden_dim_size,
                payload.dtype_str,
                payload.use_mla,
            )
            layout.check_chunk_size(self.chunk_size)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.BAD_PAYLOAD, str(exc)) from None
        self._check_fits_l1(layout, "register_kv_cache_engine_driven_context")
        self._check_worker_room(payload.instance_id, "register_kv_cache_engine_driven_context")
        self._check_registration(
            payload.instance_id, payload.model_name, "register_kv_cache_engine_driven_context"
        )
        worker = Worker(
            payload.model_name, payload.world_size, layout, MPTransferMode.ENGINE_DRIVEN
        )
        # A tenant is never offered L1's shared memory: mapping it would show every
        # tenant's chunks.  Its worker speaks the inline sub-path.
        offered = self.shm_name if current_tenant() is None else ""
        worker.inline = not offered
        self._replace_worker(payload.instance_id, worker)
        logger.info(
            "registered engine-driven worker %d (%s, world size %d, %d layers, %s)",
            payload.instance_id,
            payload.model_name,
            payload.world_size,
            payload.num_layers,
            payload.dtype_str,
        )
        return RegisterEngineDrivenContextResponse(
            shm_name=offered, pool_size=self._pool_size if offered else 0
        )

    def set_engine_driven_sub_path(self, instance_id: int, sub_path: str) -> bool:
        worker = self._worker(instance_id, MPTransferMode.ENGINE_DRIVEN)
        if sub_path not in ("shm", "inline"):
            raise ProtocolError(ErrorCode.BAD_PAYLOAD, f"unknown sub-path {sub_path!r}")
        if sub_path == "shm" and (not self.shm_name or worker.tenant is not None):
            why = (
                "this server runs without shared memory"
                if not self.shm_name
                else "tenants use the inline sub-path (L1's shared memory holds every tenant)"
            )
            raise ProtocolError(ErrorCode.UNSUPPORTED_TRANSFER_MODE, why)
        worker.inline = sub_path == "inline"
        worker.inline_declared = worker.inline
        return True

    def _refuse_pickle_sub_path(self, worker: Worker, instance_id: int, operation: str) -> None:
        """Without SHM, a worker that never declared the inline sub-path is upstream
        LMCache's pickle sub-path, which we refuse before any data moves."""
        if worker.inline and not worker.inline_declared:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_TRANSFER_MODE,
                f"{operation}: engine-driven worker {instance_id} uses the pickle sub-path "
                f"(this server has no shared memory, --shm-name ''). lmcache-core never "
                f"unpickles: restart the server with shared memory (--shm-name auto, the "
                f"default) for the SHM sub-path, or use lmcache_driven transfer.",
            )

    def unregister_kv_cache_engine_driven_context(self, instance_id: int) -> None:
        self._require_mode(
            MPTransferMode.ENGINE_DRIVEN, "unregister_kv_cache_engine_driven_context"
        )
        self._drop_worker(instance_id, MPTransferMode.ENGINE_DRIVEN)

    def _slots(self, objs: list[MemoryObj], layout: KVLayout) -> list[dict[str, Any]] | None:
        if not self.shm_name:
            return None
        slots = []
        for obj in objs:
            offset = obj.shm_offset
            if offset is None:
                return None
            slots.append(
                {
                    "offset": int(offset),
                    "length": layout.chunk_nbytes(self.chunk_size),
                    "shape": list(layout.transfer_shape(self.chunk_size)),
                    "dtype": dtype_name(layout.dtype),
                }
            )
        return slots

    def prepare_store(self, key: IPCCacheServerKey, instance_id: int) -> PrepareStoreResponse:
        self._require_mode(MPTransferMode.ENGINE_DRIVEN, "prepare_store")
        key = self._admit_key(key, True, "prepare_store")
        worker = self._worker(instance_id, MPTransferMode.ENGINE_DRIVEN)
        self._refuse_pickle_sub_path(worker, instance_id, "prepare_store")
        spans = self._plan(key, worker)
        keys = self._keys(key, spans)
        todo = self._missing(keys)
        objs = self._allocate(worker.layout, len(todo)) if todo else []
        if objs is None:
            raise ProtocolError(
                ErrorCode.OUT_OF_MEMORY, "L1 has no evictable room for the chunks of this store"
            )
        pending = Pending([keys[i] for i in todo], objs, todo)
        self._pending.put(self._pending.stores, (instance_id, self._span_id(spans)), pending)
        context: dict[str, Any] = {"chunk_indices": todo}
        slots = None if worker.inline else self._slots(objs, worker.layout)
        if slots is not None:
            context["slots"] = slots
        return PrepareStoreResponse(context=context)

    def commit_store(self, key: IPCCacheServerKey, instance_id: int, data: bytes = b"") -> bool:
        self._require_mode(MPTransferMode.ENGINE_DRIVEN, "commit_store")
        key = self._admit_key(key, True, "commit_store")
        worker = self._worker(instance_id, MPTransferMode.ENGINE_DRIVEN)
        spans = self._plan(key, worker)
        pending = self._pending.take(self._pending.stores, (instance_id, self._span_id(spans)))
        if pending is None:
            raise ProtocolError(
                ErrorCode.NOT_FOUND, "commit_store without a matching prepare_store (or it expired)"
            )
        try:
            if data:
                fill_inline(
                    pending.objs, pending.indices, data, worker.layout.chunk_nbytes(self.chunk_size)
                )
            elif worker.inline or (
                pending.objs and self._slots(pending.objs, worker.layout) is None
            ):
                raise ProtocolError(
                    ErrorCode.BAD_PAYLOAD, "commit_store: the inline sub-path needs the chunk data"
                )
        except BaseException:
            pending.release()
            raise
        objs, pending.objs = pending.objs, []
        sub_path = "inline" if data else "shm"
        self._commit(pending.keys, objs, [spans[i] for i in pending.indices], worker, sub_path)
        return True

    def commit_store_frames(
        self,
        key: IPCCacheServerKey,
        instance_id: int,
        chunk_indices: list[int],
        frames: list[memoryview],
    ) -> bool:
        """The framed inline ``commit_store``: one data frame per prepared chunk."""
        self._require_mode(MPTransferMode.ENGINE_DRIVEN, "commit_store_frames")
        key = self._admit_key(key, True, "commit_store_frames")
        worker = self._worker(instance_id, MPTransferMode.ENGINE_DRIVEN)
        spans = self._plan(key, worker)
        pending = self._pending.take(self._pending.stores, (instance_id, self._span_id(spans)))
        if pending is None:
            raise ProtocolError(
                ErrorCode.NOT_FOUND,
                "commit_store_frames without a matching prepare_store (or it expired)",
            )
        try:
            nbytes = worker.layout.chunk_nbytes(self.chunk_size)
            fill_frames(pending.objs, pending.indices, chunk_indices, frames, nbytes)
        except BaseException:
            pending.release()
            raise
        objs, pending.objs = pending.objs, []
        self._commit(pending.keys, objs, [spans[i] for i in pending.indices], worker, "inline")
        return True

    def retrieve_frames(self, key: IPCCacheServerKey, instance_id: int) -> BulkReply:
        """The framed inline retrieve in one round trip: every chunk of the range as its own
        frame, viewing the L1 object (pinned until sent), or ``success=False`` on a miss."""
        self._require_mode(MPTransferMode.ENGINE_DRIVEN, "retrieve_frames")
        key = self._admit_key(key, False, "retrieve_frames")
        worker = self._worker(instance_id, MPTransferMode.ENGINE_DRIVEN)
        self._refuse_pickle_sub_path(worker, instance_id, "retrieve_frames")
        spans = self._plan(key, worker)
        objs = self._get_all(self._keys(key, spans))
        if objs is None:
            return BulkReply(PrepareRetrieveResponse(success=False), [])
        pending = Pending([], objs, list(range(len(spans))))
        try:
            for obj in objs:
                self._check_object(obj, worker.layout)
            nbytes = worker.layout.chunk_nbytes(self.chunk_size)
            frames = pinned_frames(objs, nbytes, pending.release)
        except BaseException:
            pending.release()
            raise
        self._count_retrieved(spans, worker, "inline")
        context = {"chunk_indices": pending.indices}
        return BulkReply(PrepareRetrieveResponse(success=True, context=context), frames)

    def prepare_retrieve(self, key: IPCCacheServerKey, instance_id: int) -> PrepareRetrieveResponse:
        self._require_mode(MPTransferMode.ENGINE_DRIVEN, "prepare_retrieve")
        key = self._admit_key(key, False, "prepare_retrieve")
        worker = self._worker(instance_id, MPTransferMode.ENGINE_DRIVEN)
        self._refuse_pickle_sub_path(worker, instance_id, "prepare_retrieve")
        spans = self._plan(key, worker)
        objs = self._get_all(self._keys(key, spans))
        if objs is None:
            return PrepareRetrieveResponse(success=False)
        pending = Pending([], objs, list(range(len(spans))))
        try:
            for obj in objs:
                self._check_object(obj, worker.layout)
            slots = None if worker.inline else self._slots(objs, worker.layout)
            if slots is None:
                data = encode_inline(
                    objs, pending.indices, worker.layout.chunk_nbytes(self.chunk_size)
                )
                pending.release()
                self._count_retrieved(spans, worker, "inline")
                return PrepareRetrieveResponse(success=True, data=data)
        except BaseException:
            pending.release()
            raise
        self._pending.put(self._pending.retrieves, (instance_id, self._span_id(spans)), pending)
        self._count_retrieved(spans, worker, "shm")
        context = {"slots": slots, "chunk_indices": pending.indices}
        return PrepareRetrieveResponse(success=True, context=context)

    def commit_retrieve(self, key: IPCCacheServerKey, instance_id: int) -> bool:
        self._require_mode(MPTransferMode.ENGINE_DRIVEN, "commit_retrieve")
        key = self._admit_key(key, False, "commit_retrieve")
        worker = self._worker(instance_id, MPTransferMode.ENGINE_DRIVEN)
        spans = self._plan(key, worker)
        pending = self._pending.take(self._pending.retrieves, (instance_id, self._span_id(spans)))
        if pending is not None:
            pending.release()
        return True

    @staticmethod
    def _span_id(spans: Sequence[ChunkSpan]) -> tuple[int, ...]:
        return tuple(s.chunk_hash for s in spans)
