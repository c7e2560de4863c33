"""Engine-driven transfer: the worker gathers/scatters its KV blocks itself.

``prepare_*`` / ``commit_*`` around a gather/scatter with
``DeviceOps.multi_layer_block_kv_transfer``.  Sub-path **SHM** gathers into slots of the
server's shared-memory pool (zero extra copies on the server); sub-path **inline** ships
the chunk bytes in the messages (other hosts, no shared memory), each chunk its own ZMQ
frame (see :mod:`.inline_frames`).  This replaces upstream's pickle sub-path.

``register`` builds the transport (:class:`.base.EngineDrivenContext`) through
``hooks.create_engine_driven_context``.  lmcache-core's own transports (:mod:`.transports`)
are driven on the fast paths below; any other transport (a test double, say) goes through
upstream 0.5.6's generic sequence: synchronize, ``prepare_store``,
``gather_paged_kv_to_cpu``, synchronize, ``commit_store`` (and the mirror image for
retrieve).  Those four functions are looked up at call time on
:attr:`EngineDrivenTransferContext.hooks`: this module's own defaults until
:mod:`.worker_transfer` (the seeds' call-site module, where upstream's code replaces
them) installs itself there.  This module never imports it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, ClassVar, Protocol

import msgspec
import torch

from lmcache.v1.multiprocess.transfer_context import inline_frames
from lmcache.v1.multiprocess.transfer_context.base import (
    ChunkLayoutDesc,
    EngineDrivenContext,
    EngineDrivenContextMetadata,
    TransferContext,
    _done,
    _failed,
    _single_group_block_ids,
    _tensor_list,
    gather_paged_kv_to_cpu,
    scatter_cpu_to_paged_kv,
)
from lmcache.v1.multiprocess.transfer_context.inline_frames import (
    StagingBuffers,
    chunk_groups,
    pipelined_retrieve,
    pipelined_store,
    receive_retrieve_frames,
    send_store_frames,
)
from lmcache.v1.multiprocess.transfer_context.transports import (
    EMPTY_INLINE_DATA,
    SHM_DIR,
    EngineDrivenContextInline,
    EngineDrivenContextShm,
    create_engine_driven_context,
    map_server_pool,
    slot_tensors,
)
from lmcache.v1.multiprocess.wire.chunking import (
    ChunkSpan,
    chunk_block_ids,
    plan_chunks,
    range_block_ids,
)
from lmcache.v1.multiprocess.wire.custom_types import (
    EngineType,
    InlineChunks,
    IPCCacheServerKey,
    RegisterEngineDrivenContextPayload,
)
from lmcache.v1.multiprocess.wire.protocol import ErrorCode
from lmcache.v1.platform import synchronize_device
from lmcache.v1.platform.base.device_ops import DeviceOps
from lmcache.v1.platform.kv_layout import dtype_name
from lmcache.v1.platform.ops_types import TransferDirection
from lmcache.v1.platform.transfer_mode import MPTransferMode

logger = logging.getLogger(__name__)

ENV_ENGINE_DRIVEN_SUB_PATH = "LMCACHE_MP_ENGINE_DRIVEN_SUB_PATH"
SUB_PATH_SHM = "shm"
SUB_PATH_INLINE = "inline"
_SHM_DIR = SHM_DIR

__all__ = [
    "ENV_ENGINE_DRIVEN_SUB_PATH",
    "SUB_PATH_INLINE",
    "SUB_PATH_SHM",
    "EngineDrivenTransferContext",
    "map_server_pool",
]


def _requested_sub_path(explicit: str | None) -> str:
    value = (explicit or os.environ.get(ENV_ENGINE_DRIVEN_SUB_PATH, "") or "auto").strip().lower()
    if value not in ("auto", SUB_PATH_SHM, SUB_PATH_INLINE):
        raise ValueError(
            f"unknown engine-driven sub-path {value!r}; valid: auto, {SUB_PATH_SHM}, "
            f"{SUB_PATH_INLINE}"
        )
    return value


class EngineDrivenHooks(Protocol):
    """The functions the engine-driven context calls through (replaceable as a set)."""

    create_engine_driven_context: Callable[..., EngineDrivenContext]
    gather_paged_kv_to_cpu: Callable[..., Any]
    scatter_cpu_to_paged_kv: Callable[..., Any]
    synchronize_device: Callable[..., Any]


class DefaultHooks:
    """lmcache-core's own implementations of :class:`EngineDrivenHooks`."""

    create_engine_driven_context = staticmethod(create_engine_driven_context)
    gather_paged_kv_to_cpu = staticmethod(gather_paged_kv_to_cpu)
    scatter_cpu_to_paged_kv = staticmethod(scatter_cpu_to_paged_kv)
    synchronize_device = staticmethod(synchronize_device)


def _pool_offer(response: Any) -> tuple[str, int]:
    """The shared memory a registration reply offers (none unless it names one)."""
    shm_name = getattr(response, "shm_name", "")
    pool_size = getattr(response, "pool_size", 0)
    if not isinstance(shm_name, str) or not isinstance(pool_size, int):
        return "", 0
    return shm_name, pool_size


class EngineDrivenTransferContext(TransferContext):
    """The worker gathers/scatters KV blocks itself (``multi_layer_block_kv_transfer``)."""

    mode = MPTransferMode.ENGINE_DRIVEN
    # Looked up at call time (see the module docstring); worker_transfer installs itself.
    hooks: ClassVar[EngineDrivenHooks] = DefaultHooks()

    def __init__(self, instance_id: int, req_client: Any, sub_path: str | None = None) -> None:
        super().__init__(instance_id, req_client)
        self._requested = _requested_sub_path(sub_path)
        self.sub_path = ""
        self._pool: torch.Tensor | None = None
        self._registered = False
        self._ops: DeviceOps | None = None
        self._payload: RegisterEngineDrivenContextPayload | None = None
        # The framed inline operations, until a server answers that it lacks them.
        self._framed = True
        self._staging: StagingBuffers | None = None
        self._engine_driven_context: EngineDrivenContext | None = None
        self._metadata: EngineDrivenContextMetadata | None = None
        self._mq_timeout = 0.0
        self._layout_hints: Any = None
        self._engine_type = EngineType.VLLM

    @property
    def engine_driven_context(self) -> EngineDrivenContext:
        """The transport ``register`` set up."""
        if self._engine_driven_context is None:
            raise RuntimeError("the engine-driven context is not registered; call register()")
        return self._engine_driven_context

    def register(
        self,
        kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
        model_name: str,
        world_size: int,
        blocks_in_chunk: int,
        mq_timeout: float,
        layout_hints: Any = None,
        engine_group_infos: Sequence[Any] = (),
        engine_type: EngineType = EngineType.VLLM,
    ) -> None:
        from lmcache.v1.platform import resolve_device_ops

        if len(engine_group_infos) > 1:
            raise ValueError("engine-driven transfer handles one KV-cache group")
        kv = _tensor_list(kv_caches)
        layout = self._setup(kv, blocks_in_chunk, layout_hints)
        self._ops = resolve_device_ops(kv[0].device.type)
        self._mq_timeout = mq_timeout
        self._layout_hints = layout_hints
        self._engine_type = engine_type
        self._metadata = EngineDrivenContextMetadata(
            layout_desc=ChunkLayoutDesc(
                shapes=[layout.transfer_shape(self.chunk_size)], dtypes=[layout.dtype]
            ),
            block_size=layout.block_size,
            use_mla=layout.use_mla,
        )
        self._payload = RegisterEngineDrivenContextPayload(
            instance_id=self.instance_id,
            model_name=model_name,
            world_size=world_size,
            block_size=layout.block_size,
            num_layers=layout.num_layers,
            hidden_dim_size=layout.hidden_dim_size,
            dtype_str=dtype_name(layout.dtype),
            use_mla=layout.use_mla,
        )
        self.register_again()

    def register_again(self) -> None:
        # A new server has a new shared-memory pool: the sub-path is chosen (and the pool
        # mapped) afresh.
        if self._payload is None or self._metadata is None:
            raise RuntimeError("register_again before register")
        self._close_transport()
        response = self.req_client.register_kv_cache_engine_driven_context(self._payload)
        self._registered = True
        shm_name, pool_size = _pool_offer(response)
        transport = self.hooks.create_engine_driven_context(
            self._metadata,
            self.req_client,
            self._mq_timeout,
            shm_name=shm_name,
            pool_size=pool_size,
            use_pickle=self._requested == SUB_PATH_INLINE,
            require_shm=self._requested == SUB_PATH_SHM,
        )
        self._engine_driven_context = transport
        if isinstance(transport, EngineDrivenContextShm):
            self.sub_path = SUB_PATH_SHM
            self._pool = transport.pool
        elif isinstance(transport, EngineDrivenContextInline):
            self.sub_path = SUB_PATH_INLINE
        else:
            self.sub_path = ""
            logger.info("engine-driven transport: %s", type(transport).__name__)
            return
        if self.sub_path == SUB_PATH_INLINE:
            if getattr(self.req_client, "server_is_upstream", False):
                self.unregister()
                raise ValueError(
                    "the engine-driven inline sub-path is lmcache-core's own; this upstream "
                    "LMCache server offers no shared memory (started without --shm-name), "
                    "so it expects pickled chunks, which lmcache-core never sends. Start it "
                    "with --shm-name <name> (SHM sub-path) or use mode 'lmcache_driven'."
                )
            # Without this declaration the server takes the worker for upstream's pickle
            # sub-path and refuses it.
            self.req_client.call("set_engine_driven_sub_path", self.instance_id, SUB_PATH_INLINE)
        logger.info(
            "engine-driven sub-path: %s", "SHM" if self.sub_path == SUB_PATH_SHM else "inline"
        )

    def unregister(self) -> Future[Any] | None:
        if not self._registered:
            return None
        self._registered = False
        self._close_transport()
        self.req_client.unregister_kv_cache_engine_driven_context(self.instance_id)
        return _done(None)

    def close(self) -> None:
        super().close()
        # A transport set up without a registration (tests do) is released as well.
        self._close_transport()

    def _close_transport(self) -> None:
        transport, self._engine_driven_context = self._engine_driven_context, None
        self._pool = None
        if transport is not None:
            try:
                transport.close()
            except Exception:
                logger.warning("closing the engine-driven transport failed", exc_info=True)

    def _native_transport(self) -> bool:
        """Whether the transport is lmcache-core's own (driven on the fast paths here)."""
        return isinstance(
            self._engine_driven_context, (EngineDrivenContextShm, EngineDrivenContextInline)
        )

    def _slot_tensors(self, slots: list[dict[str, Any]]) -> list[torch.Tensor]:
        assert self._pool is not None
        return slot_tensors(self._pool, slots)

    def _transfer(
        self,
        objects: list[torch.Tensor],
        ids: list[int],
        direction: TransferDirection,
        skip_blocks: int = 0,
    ) -> None:
        if self.layout is None or self._ops is None:
            raise RuntimeError("the KV cache is not registered")
        self._ops.multi_layer_block_kv_transfer(
            self._kv,
            objects,
            ids,
            self._kv[0].device,
            direction,
            self.layout.shape_desc(),
            self.chunk_size,
            self.layout.engine_kv_format,
            skip_blocks,
        )

    def _plan(
        self, key: IPCCacheServerKey, block_ids: list[list[int]]
    ) -> tuple[list[ChunkSpan], list[int]]:
        assert self.layout is not None
        spans = plan_chunks(key, self.chunk_size)
        ids = range_block_ids(block_ids[0], key.start, key.end, self.layout.block_size)
        return spans, ids

    def submit_store(
        self,
        request_id: str,
        key: IPCCacheServerKey,
        kv_caches: Any,
        block_ids: list[list[int]],
        event: Any,
        blocks_in_chunk: int,
    ) -> Future[bool]:
        try:
            if self._native_transport():
                return _done(self._store(key, block_ids))
            return _done(self._store_generic(key, kv_caches, block_ids, blocks_in_chunk))
        except Exception as exc:
            return _failed(exc)

    def _kv_for(self, kv_caches: Any) -> Mapping[str, torch.Tensor] | Sequence[torch.Tensor]:
        kv: Mapping[str, torch.Tensor] | Sequence[torch.Tensor] = (
            kv_caches if kv_caches else self._kv
        )
        if not kv:
            raise RuntimeError("the KV cache is not registered")
        return kv

    def _generic_ids(
        self, key: IPCCacheServerKey, block_ids: list[list[int]], blocks_in_chunk: int
    ) -> tuple[list[int], int]:
        """The block ids of the key's chunks, and the blocks per chunk.

        Upstream's callers pass the range's own block ids; lmcache-core's pass the whole
        block table (and ``blocks_in_chunk=0``): with a registered layout and a real key,
        both become the range's ids.
        """
        ids = _single_group_block_ids(block_ids)
        if self.layout is None:
            return ids, blocks_in_chunk
        if isinstance(key, IPCCacheServerKey):
            ids = range_block_ids(ids, key.start, key.end, self.layout.block_size)
        return ids, blocks_in_chunk or self.chunk_size // self.layout.block_size

    def _store_generic(
        self,
        key: IPCCacheServerKey,
        kv_caches: Any,
        block_ids: list[list[int]],
        blocks_in_chunk: int,
    ) -> bool:
        """Upstream's synchronous sequence around any :class:`.base.EngineDrivenContext`."""
        transport = self.engine_driven_context
        wt = self.hooks
        kv = self._kv_for(kv_caches)
        device = _tensor_list(kv)[0].device
        # No engine event on this path: the forward pass must be finished before the gather.
        wt.synchronize_device(device)
        prepared = transport.prepare_store(key, self.instance_id)
        buffers, indices = prepared if prepared is not None else (None, None)
        if indices is not None and not indices:
            return True
        ids, blocks_in_chunk = self._generic_ids(key, block_ids, blocks_in_chunk)
        chunks = wt.gather_paged_kv_to_cpu(
            kv,
            ids,
            blocks_in_chunk,
            layout_hints=self._layout_hints,
            out=buffers,
            chunk_indices=indices,
            engine_type=self._engine_type,
        )
        # The gather may still be copying, whatever the buffers are: commit_store reads them.
        wt.synchronize_device(device)
        return bool(transport.commit_store(key, self.instance_id, chunks))

    def _store(self, key: IPCCacheServerKey, block_ids: list[list[int]]) -> bool:
        assert self.layout is not None
        spans, ids = self._plan(key, block_ids)
        if self._pipelined_inline(spans):
            try:
                gather = self._gather_scatter(TransferDirection.D2H)
                return pipelined_store(
                    self.req_client, key, self.instance_id, self.layout, self.chunk_size,
                    spans, ids, self._staging_buffers(), gather,
                )  # fmt: skip
            except Exception as exc:  # the client's ServerError (worker sits above us)
                self._note_unframed_server(exc)  # an earlier lmcache-core: msgpack below
        context = self.req_client.prepare_store(key, self.instance_id).context
        indices = [int(i) for i in context.get("chunk_indices", [])]
        if not indices:
            # Every chunk is stored already; the inline sub-path still wants chunk data.
            empty = EMPTY_INLINE_DATA if self.sub_path == SUB_PATH_INLINE else b""
            return bool(self.req_client.commit_store(key, self.instance_id, empty))
        todo = [spans[i] for i in indices]
        selected = chunk_block_ids(ids, todo, self.chunk_size, self.layout.block_size)
        if self.sub_path == SUB_PATH_SHM:
            self._transfer(self._slot_tensors(context["slots"]), selected, TransferDirection.D2H)
            return bool(self.req_client.commit_store(key, self.instance_id, b""))
        if self._framed_inline():
            staging = self._staging_buffers()
            self._transfer(staging.take(len(todo)), selected, TransferDirection.D2H)
            try:
                return send_store_frames(
                    self.req_client, key, self.instance_id, indices, staging, len(todo)
                )
            except Exception as exc:  # the client's ServerError (worker sits above us)
                self._note_unframed_server(exc)  # an earlier lmcache-core: msgpack below
        return self._store_msgpack(key, indices, selected)

    def _store_msgpack(
        self, key: IPCCacheServerKey, indices: list[int], selected: list[int]
    ) -> bool:
        """The inline sub-path of servers without ``commit_store_frames``."""
        assert self.layout is not None
        shape = self.layout.transfer_shape(self.chunk_size)
        staging = [torch.empty(shape, dtype=self.layout.dtype) for _ in indices]
        self._transfer(staging, selected, TransferDirection.D2H)
        data = msgspec.msgpack.encode(
            InlineChunks(
                chunk_indices=indices,
                chunks=[t.view(torch.uint8).reshape(-1).numpy().tobytes() for t in staging],
            )
        )
        return bool(self.req_client.commit_store(key, self.instance_id, data))

    def _framed_inline(self) -> bool:
        return self._framed and hasattr(self.req_client, "call_bulk")

    def _pipelined_inline(self, spans: list[ChunkSpan]) -> bool:
        """Inline transfers of more than one chunk group go as pipelined requests."""
        assert self.layout is not None
        if self.sub_path != SUB_PATH_INLINE or not self._framed_inline():
            return False
        if not hasattr(self.req_client, "call_bulk_pipelined"):
            return False
        nbytes = self.layout.chunk_nbytes(self.chunk_size)
        return len(chunk_groups(len(spans), nbytes, inline_frames.PIPELINE_GROUP_BYTES)) > 1

    def _gather_scatter(
        self, direction: TransferDirection
    ) -> Callable[[list[torch.Tensor], list[int], int], None]:
        def transfer(objects: list[torch.Tensor], ids: list[int], skip_blocks: int) -> None:
            self._transfer(objects, ids, direction, skip_blocks)

        return transfer

    def _staging_buffers(self) -> StagingBuffers:
        assert self.layout is not None
        if self._staging is None:
            shape = tuple(self.layout.transfer_shape(self.chunk_size))
            self._staging = StagingBuffers(shape, self.layout.dtype)
        return self._staging

    def _note_unframed_server(self, exc: Exception) -> None:
        """An ``unknown_operation`` reply means a server without the framed operations:
        fall back to the msgpack inline format for good; anything else is raised."""
        if getattr(exc, "code", None) != ErrorCode.UNKNOWN_OPERATION.value:
            raise exc
        logger.info("the server has no framed inline operations; using msgpack inline data")
        self._framed = False

    def submit_retrieve(
        self,
        request_id: str,
        key: IPCCacheServerKey,
        kv_caches: Any,
        block_ids: list[list[int]],
        event: Any,
        blocks_in_chunk: int,
        skip_first_n_tokens: int = 0,
    ) -> Future[bool]:
        try:
            if self._native_transport():
                return _done(self._retrieve(key, block_ids, skip_first_n_tokens))
            return _done(
                self._retrieve_generic(
                    key, kv_caches, block_ids, event, blocks_in_chunk, skip_first_n_tokens
                )
            )
        except Exception as exc:
            return _failed(exc)

    def _retrieve_generic(
        self,
        key: IPCCacheServerKey,
        kv_caches: Any,
        block_ids: list[list[int]],
        event: Any,
        blocks_in_chunk: int,
        skip: int,
    ) -> bool:
        transport = self.engine_driven_context
        wt = self.hooks
        kv = self._kv_for(kv_caches)
        device = _tensor_list(kv)[0].device
        chunks = transport.prepare_retrieve(key, self.instance_id)
        try:
            if chunks is None:
                return False
            ids, blocks_in_chunk = self._generic_ids(key, block_ids, blocks_in_chunk)
            if event is not None:
                event.wait()  # the engine's KV pages are free to be written
            try:
                wt.scatter_cpu_to_paged_kv(
                    kv,
                    ids,
                    chunks,
                    blocks_in_chunk,
                    skip_first_n_tokens=skip,
                    layout_hints=self._layout_hints,
                    engine_type=self._engine_type,
                )
            except (RuntimeError, ValueError, TypeError, IndexError):
                logger.exception("scattering retrieved chunks into the KV cache failed")
                return False
            finally:
                # The server may reuse the chunks' memory once commit_retrieve is sent.
                wt.synchronize_device(device)
            return True
        finally:
            transport.commit_retrieve(key, self.instance_id)

    def _retrieve(self, key: IPCCacheServerKey, block_ids: list[list[int]], skip: int) -> bool:
        assert self.layout is not None
        spans, ids = self._plan(key, block_ids)
        skip_blocks = max(0, int(skip)) // self.layout.block_size
        if self._pipelined_inline(spans):
            try:
                return pipelined_retrieve(
                    self.req_client, key, self.instance_id, self.layout, self.chunk_size,
                    spans, ids, skip_blocks, self._gather_scatter(TransferDirection.H2D),
                )  # fmt: skip
            except Exception as exc:  # the client's ServerError (worker sits above us)
                self._note_unframed_server(exc)
        if self.sub_path == SUB_PATH_INLINE and self._framed_inline():
            try:
                objects = receive_retrieve_frames(
                    self.req_client, key, self.instance_id, self.layout, self.chunk_size,
                    len(spans),
                )  # fmt: skip
            except Exception as exc:  # the client's ServerError (worker sits above us)
                self._note_unframed_server(exc)
            else:
                if objects is None:
                    return False
                self._transfer(objects, ids, TransferDirection.H2D, skip_blocks)
                return True
        response = self.req_client.prepare_retrieve(key, self.instance_id)
        if not response.success:
            return False
        try:
            if response.data:
                chunks = msgspec.msgpack.decode(response.data, type=InlineChunks)
                shape = self.layout.transfer_shape(self.chunk_size)
                objects = [
                    torch.frombuffer(bytearray(raw), dtype=self.layout.dtype).view(shape)
                    for raw in chunks.chunks
                ]
            else:
                objects = self._slot_tensors(response.context["slots"])
            self._transfer(objects, ids, TransferDirection.H2D, skip_blocks)
        finally:
            if not response.data:
                self.req_client.commit_retrieve(key, self.instance_id)
        return True
