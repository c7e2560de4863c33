"""LMCache-driven operations: the server copies between L1 and the worker's KV pages.

The worker registers its KV cache as ``DeviceIPCWrapper``s; the device they declare
resolves (through the registry) to a ``DeviceSpec`` whose cache context does every copy
and whose event backend orders it after the worker's event.  Nothing here names a device.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.multiprocess.server.kv_layout import KVLayout, dtype_name
from lmcache.v1.multiprocess.server.state import DIRECT_SUB_PATH, Worker
from lmcache.v1.multiprocess.server.workers import WorkerRegistry
from lmcache.v1.multiprocess.wire.chunking import chunk_block_ids
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.wire.protocol import ErrorCode, ProtocolError
from lmcache.v1.platform.base.cache_context import BaseCacheContext
from lmcache.v1.platform.base.event_ipc import EventIPCBackend
from lmcache.v1.platform.base.streams import IPCEvent
from lmcache.v1.platform.cache_context import (
    LMCacheDrivenUnsupportedError,
    check_event_support,
    declared_device_type,
    resolve_lmcache_driven_device,
)
from lmcache.v1.platform.kv_layout import HONORED_KV_LAYOUTS, declared_kv_layout
from lmcache.v1.platform.ops_types import TransferDirection
from lmcache.v1.platform.transfer_mode import MPTransferMode

logger = logging.getLogger(__name__)


def _close_wrappers(kv_cache: list[Any]) -> None:
    for wrapper in kv_cache:
        wrapper.close()


def _declared_layout(layout_hints: Any) -> str | None:
    """The declared ``kv_layout``, refused up front if no cache context could read it."""
    try:
        kv_layout = declared_kv_layout(layout_hints)
    except TypeError as exc:
        raise ProtocolError(ErrorCode.BAD_PAYLOAD, f"register_kv_cache: {exc}") from None
    _check_layout_honored(kv_layout, HONORED_KV_LAYOUTS, "this server")
    return kv_layout


def _check_layout_honored(kv_layout: str | None, honored: frozenset[str], reader: str) -> None:
    """Refuse a declared KV layout ``reader`` would misread (never mis-slice blocks)."""
    if kv_layout is not None and kv_layout not in honored:
        raise ProtocolError(
            ErrorCode.SHAPE_MISMATCH,
            f"register_kv_cache: KV layout {kv_layout!r} is not supported by {reader} "
            f"(it reads {sorted(honored)}); per-layer caches are read as [2, num_blocks, "
            f"block_size, num_heads, head_size] (NHD) or [2, num_blocks, num_heads, "
            f"block_size, head_size] (HND) or MLA [num_blocks, block_size, head_size]",
        )


def _context_honors(kv_layout: str | None, context: BaseCacheContext) -> None:
    honored = getattr(type(context), "honored_kv_layouts", frozenset({"NHD"}))
    _check_layout_honored(kv_layout, honored, f"the {context.device_type} cache context")


class LMCacheDrivenOps(WorkerRegistry):
    """``register_kv_cache``, ``unregister_kv_cache``, ``store`` and ``retrieve``."""

    def register_kv_cache(
        self,
        instance_id: int,
        kv_cache: list[Any],
        model_name: str,
        world_size: int,
        engine_type: Any = None,
        layout_hints: Any = None,
        engine_group_infos: Any = None,
    ) -> None:
        self._require_mode(MPTransferMode.LMCACHE_DRIVEN, "register_kv_cache")
        if not kv_cache:
            raise ProtocolError(ErrorCode.BAD_PAYLOAD, "register_kv_cache: empty KV cache list")
        self._check_worker_room(instance_id, "register_kv_cache")
        self._check_registration(instance_id, model_name, "register_kv_cache")
        kv_layout = _declared_layout(layout_hints)
        context, events = self._map_kv_cache(kv_cache, layout_hints)
        try:
            self._check_segments_free(context, "register_kv_cache")
            _context_honors(kv_layout, context)
            layout = context.layout
            self._check_fits_l1(layout, "register_kv_cache")
        except ValueError as exc:
            context.close()
            raise ProtocolError(ErrorCode.SHAPE_MISMATCH, f"register_kv_cache: {exc}") from None
        except ProtocolError:
            context.close()
            raise
        worker = Worker(model_name, world_size, layout, MPTransferMode.LMCACHE_DRIVEN, context)
        worker.events = events
        self._replace_worker(instance_id, worker)
        logger.info(
            "registered LMCache-driven worker %d (%s, world size %d, %d layers of %s, "
            "declared layout %s, %s, %s)",
            instance_id,
            model_name,
            world_size,
            layout.num_layers,
            list(getattr(kv_cache[0], "shape", ())),
            kv_layout or "none",
            dtype_name(layout.dtype),
            context.device_type,
        )

    def _map_kv_cache(
        self, kv_cache: list[Any], layout_hints: Any
    ) -> tuple[BaseCacheContext, EventIPCBackend]:
        """The cache context and event backend of the device the wrappers declare."""
        try:
            device_type = declared_device_type(kv_cache)
            device = resolve_lmcache_driven_device(device_type, self._device_specs)
            context = device.create_cache_context(kv_cache, self.chunk_size, layout_hints)
        except LMCacheDrivenUnsupportedError as exc:
            _close_wrappers(kv_cache)
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_TRANSFER_MODE, f"register_kv_cache: {exc}"
            ) from None
        except Exception as exc:  # whatever the descriptors hold, nothing stays mapped
            _close_wrappers(kv_cache)
            raise ProtocolError(
                ErrorCode.BAD_PAYLOAD,
                f"cannot map the registered KV cache: {type(exc).__name__}: {exc}",
            ) from None
        try:
            check_event_support(device, context)
        except LMCacheDrivenUnsupportedError as exc:
            context.close()
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_TRANSFER_MODE, f"register_kv_cache: {exc}"
            ) from None
        return context, device.events

    def unregister_kv_cache(self, instance_id: int) -> None:
        self._require_mode(MPTransferMode.LMCACHE_DRIVEN, "unregister_kv_cache")
        self._drop_worker(instance_id, MPTransferMode.LMCACHE_DRIVEN)

    def store(
        self, key: IPCCacheServerKey, instance_id: int, block_ids: list[list[int]], handle: bytes
    ) -> tuple[bytes, bool]:
        self._require_mode(MPTransferMode.LMCACHE_DRIVEN, "store")
        key = self._admit_key(key, True, "store")
        worker = self._worker(instance_id, MPTransferMode.LMCACHE_DRIVEN)
        spans = self._plan(key, worker)
        ids = self._block_ids(key, block_ids, worker.layout)
        worker_event = self._import_worker_event(worker, handle)
        keys = self._keys(key, spans)
        todo = self._missing(keys)
        if not todo:
            return b"", True
        spans_todo = [spans[i] for i in todo]
        objs = self._allocate(worker.layout, len(todo))
        if objs is None:
            logger.warning("store: L1 is full of pinned chunks; %d chunks not stored", len(todo))
            return b"", False
        try:
            with worker.lock:
                if worker.context is None or not worker.context.kv_tensors:
                    raise ProtocolError(ErrorCode.UNKNOWN_WORKER, "worker was unregistered")
                self._block_transfer(
                    worker,
                    objs,
                    chunk_block_ids(ids, spans_todo, self.chunk_size, worker.layout.block_size),
                    TransferDirection.D2H,
                    0,
                    worker_event,
                )
        except BaseException:
            for obj in objs:
                obj.ref_count_down()
            raise
        self._commit([keys[i] for i in todo], objs, spans_todo, worker, DIRECT_SUB_PATH)
        return b"", True

    def retrieve(
        self,
        key: IPCCacheServerKey,
        instance_id: int,
        block_ids: list[list[int]],
        handle: bytes,
        skip_first_n_tokens: int = 0,
    ) -> tuple[bytes, bool]:
        self._require_mode(MPTransferMode.LMCACHE_DRIVEN, "retrieve")
        key = self._admit_key(key, False, "retrieve")
        worker = self._worker(instance_id, MPTransferMode.LMCACHE_DRIVEN)
        spans = self._plan(key, worker)
        ids = self._block_ids(key, block_ids, worker.layout)
        worker_event = self._import_worker_event(worker, handle)
        objs = self._get_all(self._keys(key, spans))
        if objs is None:
            return b"", False
        try:
            for obj in objs:
                self._check_object(obj, worker.layout)
            skip_blocks = max(0, int(skip_first_n_tokens)) // worker.layout.block_size
            with worker.lock:
                if worker.context is None or not worker.context.kv_tensors:
                    raise ProtocolError(ErrorCode.UNKNOWN_WORKER, "worker was unregistered")
                self._block_transfer(
                    worker, objs, ids, TransferDirection.H2D, skip_blocks, worker_event
                )
        finally:
            for obj in objs:
                obj.ref_count_down()
        self._count_retrieved(spans, worker, DIRECT_SUB_PATH)
        return b"", True

    def _import_worker_event(self, worker: Worker, handle: bytes) -> IPCEvent | None:
        """The worker's event (through its device's backend) the copy must follow, if any."""
        if not handle or worker.events is None or worker.context is None:
            return None
        try:
            return worker.events.import_event(handle, worker.context.device)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.BAD_PAYLOAD, f"bad event handle: {exc}") from None

    def _block_transfer(
        self,
        worker: Worker,
        objs: list[MemoryObj],
        ids: list[int],
        direction: TransferDirection,
        skip_blocks: int,
        worker_event: IPCEvent | None,
    ) -> None:
        """The worker's cache context copies (after ``worker_event``); we wait for its event."""
        context, events = worker.context, worker.events
        assert context is not None and events is not None
        token = context.hold_imported_event(worker_event) if worker_event is not None else None
        try:
            done = context.transfer_blocks(
                direction,
                [self._transfer_view(o, worker.layout) for o in objs],
                ids,
                skip_blocks,
                worker_event,
            )
            # The objects are committed or released right after: the copy must be complete.
            if done is not None:
                events.synchronize_event(done, context.device)
        except (ValueError, IndexError, RuntimeError) as exc:
            raise ProtocolError(ErrorCode.SHAPE_MISMATCH, f"block transfer failed: {exc}") from None
        finally:
            if token is not None:
                context.release_imported_event(token)

    def _transfer_view(self, obj: MemoryObj, layout: KVLayout) -> torch.Tensor:
        tensor = obj.tensor
        assert tensor is not None
        return tensor.view(layout.transfer_shape(self.chunk_size))
