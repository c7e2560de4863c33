"""Worker-side transfer contexts: how a worker's KV blocks reach the cache server.

* :class:`LMCacheDrivenTransferContext` registers the worker's KV tensors (wrapped with
  the device's ``DeviceIPCWrapper``) and sends ``store``/``retrieve``; the *server* copies
  straight from/to the worker's memory.
* :class:`EngineDrivenTransferContext` copies itself: ``prepare_*`` / ``commit_*`` around
  a gather/scatter with ``DeviceOps.multi_layer_block_kv_transfer``.  Sub-path **SHM**
  gathers into slots of the server's shared-memory pool (zero extra copies on the
  server); sub-path **inline** ships the chunk bytes inside the messages (other hosts, no
  shared memory).  This replaces upstream's pickle sub-path.

:func:`create_transfer_context` picks one: explicit ``mode`` argument, else
``LMCACHE_MP_TRANSFER_MODE``, else AUTO, which dispatches strictly by device type (``cuda``
-> LMCache-driven, everything else -> engine-driven).
"""

from __future__ import annotations

import abc
import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import msgspec
import torch

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
from lmcache.v1.platform import get_device_spec, serving_device_type
from lmcache.v1.platform.base.event_ipc import EventIPCBackend
from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
from lmcache.v1.platform.base.streams import DeviceLike, IPCEvent
from lmcache.v1.platform.kv_layout import KVLayout, dtype_from_name, dtype_name
from lmcache.v1.platform.ops_types import TransferDirection
from lmcache.v1.platform.transfer_mode import MPTransferMode, resolve_transfer_mode

logger = logging.getLogger(__name__)

MessagingFuture = Future
ENV_ENGINE_DRIVEN_SUB_PATH = "LMCACHE_MP_ENGINE_DRIVEN_SUB_PATH"
SUB_PATH_SHM = "shm"
SUB_PATH_INLINE = "inline"
_SHM_DIR = "/dev/shm"


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


def _failed(exc: BaseException) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_exception(exc)
    return future


def _tensor_list(
    kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
) -> list[torch.Tensor]:
    return list(kv_caches.values()) if isinstance(kv_caches, Mapping) else list(kv_caches)


class TransferContext(abc.ABC):
    """One worker's connection of its KV cache to the server."""

    mode: MPTransferMode

    def __init__(self, instance_id: int, req_client: Any) -> None:
        self.instance_id = instance_id
        self.req_client = req_client
        self.chunk_size = 0
        self.layout: KVLayout | None = None
        self._kv: list[torch.Tensor] = []

    @abc.abstractmethod
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
    ) -> None: ...

    @abc.abstractmethod
    def register_again(self) -> None:
        """Register once more, as the last ``register`` did, with a server that restarted.

        The new server process never knew this worker, so nothing is unregistered first.
        """

    @abc.abstractmethod
    def unregister(self) -> Future[Any] | None: ...

    def create_recorded_event(self) -> IPCEvent | None:
        return None

    @abc.abstractmethod
    def submit_store(
        self,
        request_id: str,
        key: IPCCacheServerKey,
        kv_caches: Any,
        block_ids: list[list[int]],
        event: IPCEvent | None,
        blocks_in_chunk: int,
    ) -> Future[bool]: ...

    @abc.abstractmethod
    def submit_retrieve(
        self,
        request_id: str,
        key: IPCCacheServerKey,
        kv_caches: Any,
        block_ids: list[list[int]],
        event: IPCEvent | None,
        blocks_in_chunk: int,
        skip_first_n_tokens: int = 0,
    ) -> Future[bool]: ...

    def flush_inflight_stores(self) -> None:  # noqa: B027 - nothing in flight by default
        """Stores complete before ``submit_store`` returns; nothing is in flight."""

    def close(self) -> None:
        try:
            self.unregister()
        except Exception:
            logger.debug("unregister during close failed", exc_info=True)

    def _setup(self, kv: list[torch.Tensor], blocks_in_chunk: int) -> KVLayout:
        layout = KVLayout.from_tensors(kv)
        self.layout = layout
        self._kv = kv
        self.chunk_size = blocks_in_chunk * layout.block_size
        return layout


# ----------------------------------------------------------------------------------------
# LMCache-driven
# ----------------------------------------------------------------------------------------


def declared_layout_hints(layout: KVLayout, layout_hints: Any = None) -> dict[str, Any]:
    """The ``layout_hints`` payload of ``register_kv_cache``: always a dict, and naming NHD
    for a 5-D KV cache, since upstream LMCache's server otherwise reads
    ``[2, NB, X, Y, HS]`` as HND (heads before block slots) and mis-slices every block."""
    hints: dict[str, Any] = dict(layout_hints or {})
    if not layout.use_mla:
        hints.setdefault("kv_layout", "NHD")
    return hints


class LMCacheDrivenTransferContext(TransferContext):
    """The server reads/writes the worker's registered KV cache directly (zero-copy)."""

    mode = MPTransferMode.LMCACHE_DRIVEN

    def __init__(self, instance_id: int, req_client: Any, device_type: str) -> None:
        super().__init__(instance_id, req_client)
        self.device_type = device_type
        self._wrappers: list[DeviceIPCWrapper] = []
        self._events: Any = None
        self._registered = False
        self._registration: tuple[Any, ...] = ()

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
        from lmcache.v1.platform.kv_wrap import wrap_kv_caches

        kv = _tensor_list(kv_caches)
        self._events = require_event_ipc(self.device_type, kv[0].device)
        layout = self._setup(kv, blocks_in_chunk)
        self._wrappers = wrap_kv_caches(kv, self.device_type)
        self._registration = (
            self.instance_id,
            self._wrappers,
            model_name,
            world_size,
            engine_type.value,
            declared_layout_hints(layout, layout_hints),
            list(engine_group_infos),
        )
        self.register_again()

    def register_again(self) -> None:
        # The wrappers name the same (still mapped) memory: a new server maps it afresh.
        if not self._registration:
            raise RuntimeError("register_again before register")
        self.req_client.register_kv_cache(*self._registration)
        self._registered = True

    def unregister(self) -> Future[Any] | None:
        if not self._registered:
            return None
        self._registered = False
        self.req_client.unregister_kv_cache(self.instance_id)
        return _done(None)

    def create_recorded_event(self) -> IPCEvent | None:
        device = self._kv[0].device if self._kv else self.device_type
        event = self._events.create_event(device)
        self._events.record_event(event, None)
        return event

    def _handle(self, event: IPCEvent | None) -> bytes:
        if event is None:
            event = self.create_recorded_event()
        device = self._kv[0].device if self._kv else self.device_type
        return bytes(self._events.export_event(event, device))

    def _await_server_event(self, handle: bytes) -> None:
        if handle:
            device = self._kv[0].device if self._kv else self.device_type
            self._events.synchronize_event(self._events.import_event(handle, device), device)

    def submit_store(
        self,
        request_id: str,
        key: IPCCacheServerKey,
        kv_caches: Any,
        block_ids: list[list[int]],
        event: IPCEvent | None,
        blocks_in_chunk: int,
    ) -> Future[bool]:
        try:
            handle, ok = self.req_client.store(
                key, self.instance_id, block_ids, self._handle(event)
            )
            self._await_server_event(handle)
            return _done(bool(ok))
        except Exception as exc:
            return _failed(exc)

    def submit_retrieve(
        self,
        request_id: str,
        key: IPCCacheServerKey,
        kv_caches: Any,
        block_ids: list[list[int]],
        event: IPCEvent | None,
        blocks_in_chunk: int,
        skip_first_n_tokens: int = 0,
    ) -> Future[bool]:
        try:
            handle, ok = self.req_client.retrieve(
                key, self.instance_id, block_ids, self._handle(event), skip_first_n_tokens
            )
            self._await_server_event(handle)
            return _done(bool(ok))
        except Exception as exc:
            return _failed(exc)

    def close(self) -> None:
        super().close()
        from lmcache.v1.platform.cpu.shm import CpuShmTensorWrapper, unlink_segment

        names = {w.shm_name for w in self._wrappers if isinstance(w, CpuShmTensorWrapper)}
        for wrapper in self._wrappers:
            wrapper.close()
        self._wrappers = []
        # The segments stay mapped (and valid) in this process; only the names go.
        for name in names - {""}:
            unlink_segment(name)


# ----------------------------------------------------------------------------------------
# Engine-driven
# ----------------------------------------------------------------------------------------


def _requested_sub_path(explicit: str | None) -> str:
    value = (explicit or os.environ.get(ENV_ENGINE_DRIVEN_SUB_PATH, "") or "auto").strip().lower()
    if value not in ("auto", SUB_PATH_SHM, SUB_PATH_INLINE):
        raise ValueError(
            f"unknown engine-driven sub-path {value!r}; valid: auto, {SUB_PATH_SHM}, "
            f"{SUB_PATH_INLINE}"
        )
    return value


class EngineDrivenTransferContext(TransferContext):
    """The worker gathers/scatters KV blocks itself (``multi_layer_block_kv_transfer``)."""

    mode = MPTransferMode.ENGINE_DRIVEN

    def __init__(self, instance_id: int, req_client: Any, sub_path: str | None = None) -> None:
        super().__init__(instance_id, req_client)
        self._requested = _requested_sub_path(sub_path)
        self.sub_path = ""
        self._pool: torch.Tensor | None = None
        self._registered = False
        self._ops: Any = None
        self._payload: RegisterEngineDrivenContextPayload | None = None

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

        kv = _tensor_list(kv_caches)
        layout = self._setup(kv, blocks_in_chunk)
        self._ops = resolve_device_ops(kv[0].device.type)
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
        if self._payload is None:
            raise RuntimeError("register_again before register")
        self._pool = None
        response = self.req_client.register_kv_cache_engine_driven_context(self._payload)
        self._registered = True
        self.sub_path = self._choose_sub_path(response.shm_name, response.pool_size)
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

    def _choose_sub_path(self, shm_name: str, pool_size: int) -> str:
        if self._requested == SUB_PATH_INLINE:
            return SUB_PATH_INLINE
        if not shm_name or pool_size <= 0:
            if self._requested == SUB_PATH_SHM:
                raise ValueError(
                    "engine-driven sub-path 'shm' was forced, but the server offers no shared "
                    "memory (it runs with --shm-name '')"
                )
            return SUB_PATH_INLINE
        try:
            path = os.path.join(_SHM_DIR, shm_name.lstrip("/"))
            self._pool = torch.from_file(path, shared=True, size=pool_size, dtype=torch.uint8)
        except (OSError, RuntimeError) as exc:
            if self._requested == SUB_PATH_SHM:
                raise ValueError(
                    f"cannot map the server's shared memory {shm_name!r}: {exc}"
                ) from exc
            logger.warning(
                "cannot map the server's shared memory %r (%s); using the inline sub-path",
                shm_name,
                exc,
            )
            return SUB_PATH_INLINE
        return SUB_PATH_SHM

    def unregister(self) -> Future[Any] | None:
        if not self._registered:
            return None
        self._registered = False
        self._pool = None
        self.req_client.unregister_kv_cache_engine_driven_context(self.instance_id)
        return _done(None)

    def _slot_tensors(self, slots: list[dict[str, Any]]) -> list[torch.Tensor]:
        assert self._pool is not None
        tensors = []
        for slot in slots:
            offset, length = int(slot["offset"]), int(slot["length"])
            if offset < 0 or offset + length > self._pool.numel():
                raise ValueError("the server sent a slot outside its shared-memory pool")
            raw = self._pool[offset : offset + length]
            tensors.append(raw.view(dtype_from_name(str(slot["dtype"]))).view(slot["shape"]))
        return tensors

    def _transfer(
        self,
        objects: list[torch.Tensor],
        ids: list[int],
        direction: TransferDirection,
        skip_blocks: int = 0,
    ) -> None:
        assert self.layout is not None
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
        event: IPCEvent | None,
        blocks_in_chunk: int,
    ) -> Future[bool]:
        try:
            return _done(self._store(key, block_ids))
        except Exception as exc:
            return _failed(exc)

    def _store(self, key: IPCCacheServerKey, block_ids: list[list[int]]) -> bool:
        assert self.layout is not None
        spans, ids = self._plan(key, block_ids)
        context = self.req_client.prepare_store(key, self.instance_id).context
        indices = [int(i) for i in context.get("chunk_indices", [])]
        if not indices:
            return bool(self.req_client.commit_store(key, self.instance_id, b""))
        todo = [spans[i] for i in indices]
        selected = chunk_block_ids(ids, todo, self.chunk_size, self.layout.block_size)
        if self.sub_path == SUB_PATH_SHM:
            self._transfer(self._slot_tensors(context["slots"]), selected, TransferDirection.D2H)
            return bool(self.req_client.commit_store(key, self.instance_id, b""))
        shape = self.layout.transfer_shape(self.chunk_size)
        staging = [torch.zeros(shape, dtype=self.layout.dtype) for _ in todo]
        self._transfer(staging, selected, TransferDirection.D2H)
        data = msgspec.msgpack.encode(
            InlineChunks(
                chunk_indices=indices,
                chunks=[t.view(torch.uint8).reshape(-1).numpy().tobytes() for t in staging],
            )
        )
        return bool(self.req_client.commit_store(key, self.instance_id, data))

    def submit_retrieve(
        self,
        request_id: str,
        key: IPCCacheServerKey,
        kv_caches: Any,
        block_ids: list[list[int]],
        event: IPCEvent | None,
        blocks_in_chunk: int,
        skip_first_n_tokens: int = 0,
    ) -> Future[bool]:
        try:
            return _done(self._retrieve(key, block_ids, skip_first_n_tokens))
        except Exception as exc:
            return _failed(exc)

    def _retrieve(self, key: IPCCacheServerKey, block_ids: list[list[int]], skip: int) -> bool:
        assert self.layout is not None
        _spans, ids = self._plan(key, block_ids)
        response = self.req_client.prepare_retrieve(key, self.instance_id)
        if not response.success:
            return False
        skip_blocks = max(0, int(skip)) // self.layout.block_size
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


# ----------------------------------------------------------------------------------------
# Factory
# ----------------------------------------------------------------------------------------


def require_event_ipc(device_type: str, device: DeviceLike) -> EventIPCBackend:
    """The device's event-IPC backend, or ``ValueError`` naming what is missing."""
    spec = get_device_spec(device_type)
    backend_name = spec.backend_name if spec is not None else device_type
    backend = spec.event_ipc_backend if spec is not None else None
    if backend is None:
        raise ValueError(
            f"MP transfer mode 'lmcache_driven' needs event IPC, but backend {backend_name!r} "
            f"(device type {device_type!r}) declares none (DeviceSpec.event_ipc_backend is "
            f"None). Use mode 'engine_driven' instead."
        )
    try:
        backend.check_event_support(device)
    except RuntimeError as exc:
        raise ValueError(
            f"MP transfer mode 'lmcache_driven' needs event IPC, but backend {backend_name!r} "
            f"cannot provide it for {device!r}: {exc}. Use mode 'engine_driven' instead."
        ) from exc
    return backend


def _build_lmcache_driven_context(
    device_type: str, instance_id: int, req_client: Any
) -> LMCacheDrivenTransferContext:
    """The two hard checks (wrapper with ``wrap``; handle transfer), then the context."""
    spec = get_device_spec(device_type)
    backend_name = spec.backend_name if spec is not None else device_type
    wrapper_cls = spec.ipc_wrapper_cls if spec is not None else None
    wrap = getattr(wrapper_cls, "wrap", None)
    overridden = wrap is not None and getattr(wrap, "__func__", None) is not getattr(
        DeviceIPCWrapper.wrap, "__func__", None
    )
    if wrapper_cls is None or not overridden:
        raise ValueError(
            f"MP transfer mode 'lmcache_driven' is not supported for device type "
            f"{device_type!r} (backend {backend_name!r}): no KV-cache wrapper factory is "
            f"registered (DeviceSpec.ipc_wrapper_cls must name a DeviceIPCWrapper subclass "
            f"with a wrap classmethod). Use mode 'engine_driven' instead."
        )
    assert spec is not None
    if not spec.is_handle_transfer_available():
        raise ValueError(
            f"MP transfer mode 'lmcache_driven' is not supported for device type "
            f"{device_type!r} (backend {backend_name!r}): IPC handle transfer is unavailable "
            f"(DeviceSpec.is_handle_transfer_available() returned False). Use mode "
            f"'engine_driven' instead."
        )
    return LMCacheDrivenTransferContext(instance_id, req_client, device_type)


def create_transfer_context(
    kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
    *,
    instance_id: int,
    req_client: Any,
    mode: str | MPTransferMode | None = None,
    **kwargs: Any,
) -> TransferContext:
    """The transfer context for ``kv_caches`` (see the module docstring for the rules).

    ``sub_path`` (``auto`` / ``shm`` / ``inline``, or ``LMCACHE_MP_ENGINE_DRIVEN_SUB_PATH``)
    forces the engine-driven sub-path.
    """
    tensors = _tensor_list(kv_caches)
    if not tensors:
        raise ValueError("create_transfer_context needs at least one KV-cache tensor")
    device_types = {t.device.type for t in tensors}
    if len(device_types) != 1:
        raise ValueError(f"KV-cache tensors span several device types: {sorted(device_types)}")
    (device_type,) = device_types
    device_type = serving_device_type(device_type)
    resolved = resolve_transfer_mode(mode)
    if resolved is MPTransferMode.AUTO:
        resolved = (
            MPTransferMode.LMCACHE_DRIVEN if device_type == "cuda" else MPTransferMode.ENGINE_DRIVEN
        )
    logger.info("Creating transfer context (device_type=%s, mode=%s)", device_type, resolved.value)
    if resolved is MPTransferMode.LMCACHE_DRIVEN:
        return _build_lmcache_driven_context(device_type, instance_id, req_client)
    return EngineDrivenTransferContext(instance_id, req_client, sub_path=kwargs.get("sub_path"))
