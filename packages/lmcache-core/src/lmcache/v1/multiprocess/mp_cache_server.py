"""``MPCacheServer``: what the cache server does for each operation (transport-free).

Handlers raise :class:`~lmcache.v1.multiprocess.protocol.ProtocolError` for anything the
client must learn about; the transport turns those into typed error replies.  A chunk
becomes visible (lookup / retrieve) only after all its bytes are in L1, so a store that
dies half-way never exposes a partial chunk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import torch

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.multiprocess.chunking import (
    ChunkSpan,
    chunk_block_ids,
    plan_chunks,
    prefix_chunks,
    range_block_ids,
)
from lmcache.v1.multiprocess.custom_types import (
    BlockAllocationRecord,
    InlineChunks,
    IPCCacheServerKey,
    PrepareRetrieveResponse,
    PrepareStoreResponse,
    RegisterEngineDrivenContextPayload,
    RegisterEngineDrivenContextResponse,
    ServerStats,
)
from lmcache.v1.multiprocess.kv_layout import KVLayout, chunk_memory_format, dtype_name
from lmcache.v1.multiprocess.metrics import ServerMetrics
from lmcache.v1.multiprocess.protocol import PROTOCOL_VERSION, ErrorCode, ProtocolError
from lmcache.v1.multiprocess.security import AdminPolicy, TokenCheck
from lmcache.v1.multiprocess.tiers import (
    describe_tiers,
    install_eviction_counters,
    tier_problems,
)
from lmcache.v1.platform import get_device_spec
from lmcache.v1.platform.base.cache_context import BaseCacheContext
from lmcache.v1.platform.base.event_ipc import EventIPCBackend
from lmcache.v1.platform.cache_context import (
    DeviceSpecLookup,
    LMCacheDrivenUnsupportedError,
    check_event_support,
    declared_device_type,
    resolve_lmcache_driven_device,
)
from lmcache.v1.platform.ops_types import TransferDirection
from lmcache.v1.platform.transfer_mode import MPTransferMode
from lmcache.v1.storage_backend.storage_manager import StorageManager

logger = logging.getLogger(__name__)

# The storage key's dtype field is fixed: chunk objects carry their real dtype and shape,
# which retrieve checks against the worker's layout (lookups know no dtype).
_KEY_DTYPE = torch.uint8
_MAX_LOOKUP_SESSIONS = 65536
# Refused admin requests are logged at most this often (a peer may send them in a loop).
_REFUSAL_LOG_INTERVAL_S = 60.0
# A peer can name any instance id or token range: these cap what it can make the server
# remember between reaps (registered workers; prepared but uncommitted transfers).
MAX_REGISTERED_WORKERS = 4096
MAX_PENDING_TRANSFERS = 65536
# Metric label of the LMCache-driven path: the server copies straight between its L1 and
# the worker's registered KV cache pages.
DIRECT_SUB_PATH = "direct"


@dataclasses.dataclass
class _Worker:
    model_name: str
    world_size: int
    layout: KVLayout
    mode: MPTransferMode
    context: BaseCacheContext | None = None  # the cache context (LMCache-driven)
    events: EventIPCBackend | None = None  # its device's event backend (LMCache-driven)
    inline: bool = False  # engine-driven sub-path
    inline_declared: bool = False  # the worker said it speaks inline (not upstream's pickle)
    last_seen: float = dataclasses.field(default_factory=time.monotonic)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


@dataclasses.dataclass
class _Pending:
    keys: list[CacheEngineKey]
    objs: list[MemoryObj]
    indices: list[int]
    created: float = dataclasses.field(default_factory=time.monotonic)

    def release(self) -> None:
        for obj in self.objs:
            obj.ref_count_down()
        self.objs = []


@dataclasses.dataclass
class _LookupSession:
    hit_tokens: int
    hit_chunks: int
    pinned: list[CacheEngineKey]
    created: float = dataclasses.field(default_factory=time.monotonic)


@dataclasses.dataclass
class CacheServerSettings:
    chunk_size: int = 256
    supported_transfer_mode: MPTransferMode = MPTransferMode.AUTO
    instance_id: str = ""  # the server's id (--instance-id), reported by /status
    worker_reap_timeout_seconds: float = 120.0
    pending_transfer_timeout_seconds: float = 60.0
    session_ttl_seconds: float = 600.0
    admin: AdminPolicy = dataclasses.field(default_factory=AdminPolicy)


# Upstream's ``LayoutHints["kv_layout"]`` names for the layouts we understand from shapes.
_SUPPORTED_KV_LAYOUTS = frozenset({"NHD"})


def _close_wrappers(kv_cache: list[Any]) -> None:
    for wrapper in kv_cache:
        wrapper.close()


def _check_layout_hints(layout_hints: Any) -> None:
    """Refuse a declared KV layout we would misread (we infer ``[2, NB, BS, NH, HS]``)."""
    kv_layout = layout_hints.get("kv_layout") if isinstance(layout_hints, dict) else None
    if kv_layout is not None and not isinstance(kv_layout, str):
        raise ProtocolError(
            ErrorCode.BAD_PAYLOAD,
            f"register_kv_cache: layout_hints kv_layout must be a string, got "
            f"{type(kv_layout).__name__}",
        )
    if kv_layout is not None and kv_layout not in _SUPPORTED_KV_LAYOUTS:
        raise ProtocolError(
            ErrorCode.SHAPE_MISMATCH,
            f"register_kv_cache: KV layout {kv_layout!r} is not supported; this server "
            f"reads per-layer KV caches as NHD ([2, num_blocks, block_size, num_heads, "
            f"head_size]) or MLA ([num_blocks, block_size, head_size])",
        )


class _RefusalLog:
    """Warns about refused admin requests, at most once per interval (never the token)."""

    def __init__(self, interval_s: float = _REFUSAL_LOG_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._next_at = 0.0
        self._suppressed = 0

    def note(self, operation: str, reason: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now < self._next_at:
                self._suppressed += 1
                return
            suppressed, self._suppressed = self._suppressed, 0
            self._next_at = now + self._interval_s
        logger.warning(
            "refused admin request %s (%s)%s",
            operation,
            reason,
            f"; {suppressed} more refused in the last {self._interval_s:.0f}s"
            if suppressed
            else "",
        )


class MPCacheServer:
    """The cache server's state: L1/L2 storage, registered workers, pending transfers."""

    def __init__(
        self,
        settings: CacheServerSettings,
        storage: StorageManager,
        device_specs: DeviceSpecLookup | None = None,
        unlink_orphaned_segment: Callable[[str], bool] | None = None,
        enable_metrics: bool = True,
    ) -> None:
        """``unlink_orphaned_segment`` is called for each segment of a reaped worker; it
        must remove only segments whose creator is provably gone (any peer can register
        any segment, so the registration proves nothing)."""
        self.settings = settings
        self.chunk_size = settings.chunk_size
        self.storage = storage
        # LMCache-driven workers are served by the DeviceSpec of the device they declare.
        self._device_specs: DeviceSpecLookup = device_specs or get_device_spec
        self._unlink_orphaned_segment = unlink_orphaned_segment
        allocator = storage.get_memory_allocator()
        self.shm_name: str = getattr(allocator, "shm_name", None) or ""
        self._pool_size = int(allocator.capacity_bytes) if self.shm_name else 0
        self._workers: dict[int, _Worker] = {}
        self._workers_lock = threading.Lock()
        self._pending_stores: dict[tuple[int, tuple[int, ...]], _Pending] = {}
        self._pending_retrieves: dict[tuple[int, tuple[int, ...]], _Pending] = {}
        self._pending_lock = threading.Lock()
        self._lookups: OrderedDict[str, _LookupSession] = OrderedDict()
        self._lookups_lock = threading.Lock()
        self.stats = ServerStats(
            supported_transfer_mode=settings.supported_transfer_mode.value,
            shm_name=self.shm_name,
            chunk_size=self.chunk_size,
        )
        self._stats_lock = threading.Lock()
        self.started_at = time.time()
        self._evictions = install_eviction_counters(storage)
        self._refusals = _RefusalLog()
        self.metrics: ServerMetrics | None = (
            ServerMetrics(self.metrics_state) if enable_metrics else None
        )

    # -- helpers ------------------------------------------------------------------------------

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)

    def _require_mode(self, mode: MPTransferMode, operation: str) -> None:
        supported = self.settings.supported_transfer_mode
        if supported is not MPTransferMode.AUTO and supported is not mode:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_TRANSFER_MODE,
                f"{operation}: this server runs with --supported-transfer-mode "
                f"{supported.value}; the {mode.value} transfer mode is refused. Restart the "
                f"server with --supported-transfer-mode {mode.value} (or auto), or switch the "
                f"worker's mode (LMCACHE_MP_TRANSFER_MODE).",
            )

    def _worker(self, instance_id: int, mode: MPTransferMode) -> _Worker:
        with self._workers_lock:
            worker = self._workers.get(instance_id)
        if worker is None or worker.mode is not mode:
            raise ProtocolError(
                ErrorCode.UNKNOWN_WORKER,
                f"no {mode.value} KV cache is registered for instance id {instance_id} "
                f"(never registered, unregistered, or reaped after "
                f"{self.settings.worker_reap_timeout_seconds:.0f}s without contact); "
                f"register it again",
            )
        worker.last_seen = time.monotonic()
        return worker

    def _plan(self, key: IPCCacheServerKey, worker: _Worker) -> list[ChunkSpan]:
        if key.model_name != worker.model_name or key.world_size != worker.world_size:
            raise ProtocolError(
                ErrorCode.BAD_PAYLOAD,
                f"key is for model {key.model_name!r} world size {key.world_size}, but the "
                f"worker registered {worker.model_name!r} world size {worker.world_size}",
            )
        if key.worker_id is None or not 0 <= key.worker_id < max(1, key.world_size):
            raise ProtocolError(
                ErrorCode.BAD_PAYLOAD,
                f"key worker_id {key.worker_id!r} is not a rank of world size {key.world_size}",
            )
        try:
            return plan_chunks(key, self.chunk_size)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.BAD_PAYLOAD, str(exc)) from None

    def _storage_key(self, key: IPCCacheServerKey, worker_id: int, chunk_hash: int) -> Any:
        return CacheEngineKey(
            key.model_name,
            key.world_size,
            worker_id,
            chunk_hash,
            _KEY_DTYPE,
            key.request_configs or {},
        )

    def _keys(self, key: IPCCacheServerKey, spans: Sequence[ChunkSpan]) -> list[Any]:
        assert key.worker_id is not None
        return [self._storage_key(key, key.worker_id, s.chunk_hash) for s in spans]

    def _allocate(self, layout: KVLayout, count: int) -> list[MemoryObj] | None:
        shape = layout.object_shape(self.chunk_size)
        objs: list[MemoryObj] = []
        for _ in range(count):
            obj = self.storage.allocate(shape, layout.dtype, chunk_memory_format(layout))
            if obj is None:
                for allocated in objs:
                    allocated.ref_count_down()
                return None
            objs.append(obj)
        return objs

    def _transfer_view(self, obj: MemoryObj, layout: KVLayout) -> torch.Tensor:
        tensor = obj.tensor
        assert tensor is not None
        return tensor.view(layout.transfer_shape(self.chunk_size))

    def _check_object(self, obj: MemoryObj, layout: KVLayout) -> None:
        expected = layout.object_shape(self.chunk_size)
        if tuple(obj.get_shape()) != tuple(expected) or obj.get_dtype() != layout.dtype:
            raise ProtocolError(
                ErrorCode.SHAPE_MISMATCH,
                f"stored chunk is {tuple(obj.get_shape())} {obj.get_dtype()}, but this worker's "
                f"KV layout needs {tuple(expected)} {layout.dtype}",
            )

    def _block_ids(
        self, key: IPCCacheServerKey, block_ids: list[list[int]], layout: KVLayout
    ) -> list[int]:
        if not block_ids:
            raise ProtocolError(ErrorCode.BAD_PAYLOAD, "block_ids has no KV group")
        try:
            ids = range_block_ids(block_ids[0], key.start, key.end, layout.block_size)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.SHAPE_MISMATCH, str(exc)) from None
        if layout.num_blocks and any(not 0 <= b < layout.num_blocks for b in ids):
            raise ProtocolError(
                ErrorCode.SHAPE_MISMATCH,
                f"block ids out of range for a KV cache of {layout.num_blocks} blocks",
            )
        return ids

    def _commit(
        self,
        keys: list[Any],
        objs: list[MemoryObj],
        spans: Sequence[ChunkSpan],
        worker: _Worker,
        sub_path: str,
    ) -> None:
        """Make chunks visible (all bytes are in place), then drop our references."""
        try:
            self.storage.batched_submit_put_task(keys, objs)
        finally:
            for obj in objs:
                obj.ref_count_down()
        tokens = sum(s.num_tokens for s in spans)
        self._count(stored_chunks=len(spans), stored_tokens=tokens)
        if self.metrics is not None:
            nbytes = tokens * worker.layout.bytes_per_token()
            self.metrics.add_stored(worker.mode.value, sub_path, nbytes)

    def _get_all(self, keys: list[Any]) -> list[MemoryObj] | None:
        found = self.storage.batched_get_blocking(keys)
        if any(obj is None for obj in found):
            for obj in found:
                if obj is not None:
                    obj.ref_count_down()
            return None
        return [obj for obj in found if obj is not None]

    def _missing(self, keys: list[Any]) -> list[int]:
        return [i for i, k in enumerate(keys) if not self.storage.contains(k)]

    # -- LMCache-driven -----------------------------------------------------------------------

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
        _check_layout_hints(layout_hints)
        context, events = self._map_kv_cache(kv_cache)
        try:
            layout = context.layout
            self._check_fits_l1(layout, "register_kv_cache")
        except ValueError as exc:
            context.close()
            raise ProtocolError(ErrorCode.SHAPE_MISMATCH, f"register_kv_cache: {exc}") from None
        except ProtocolError:
            context.close()
            raise
        worker = _Worker(model_name, world_size, layout, MPTransferMode.LMCACHE_DRIVEN, context)
        worker.events = events
        self._replace_worker(instance_id, worker)
        logger.info(
            "registered LMCache-driven worker %d (%s, world size %d, %d layers, %s, %s)",
            instance_id,
            model_name,
            world_size,
            layout.num_layers,
            dtype_name(layout.dtype),
            context.device_type,
        )

    def _map_kv_cache(self, kv_cache: list[Any]) -> tuple[BaseCacheContext, EventIPCBackend]:
        """The cache context and event backend of the device the wrappers declare."""
        try:
            device_type = declared_device_type(kv_cache)
            device = resolve_lmcache_driven_device(device_type, self._device_specs)
            context = device.create_cache_context(kv_cache, self.chunk_size)
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

    def _check_worker_room(self, instance_id: int, operation: str) -> None:
        with self._workers_lock:
            full = instance_id not in self._workers and len(self._workers) >= (
                MAX_REGISTERED_WORKERS
            )
        if full:
            raise ProtocolError(
                ErrorCode.OUT_OF_MEMORY,
                f"{operation}: {MAX_REGISTERED_WORKERS} workers are already registered; "
                f"unregister idle ones (or wait for the reaper) before registering more",
            )

    def _replace_worker(self, instance_id: int, worker: _Worker) -> None:
        with self._workers_lock:
            old = self._workers.pop(instance_id, None)
            self._workers[instance_id] = worker
        if old is not None:
            self._release_worker(instance_id, old, unlink=False)

    def _drop_worker(self, instance_id: int, mode: MPTransferMode, unlink: bool = False) -> bool:
        with self._workers_lock:
            worker = self._workers.get(instance_id)
            if worker is None or worker.mode is not mode:
                return False
            del self._workers[instance_id]
        self._release_worker(instance_id, worker, unlink)
        return True

    def _release_worker(self, instance_id: int, worker: _Worker, unlink: bool) -> None:
        self._drop_pending(lambda iid: iid == instance_id)
        if worker.context is None:
            return
        with worker.lock:  # wait for an in-flight copy into its pages
            names = list(getattr(worker.context, "shm_names", []))
            worker.context.close()
        if unlink and self._unlink_orphaned_segment is not None:
            for name in set(names):
                self._unlink_orphaned_segment(name)

    def store(
        self, key: IPCCacheServerKey, instance_id: int, block_ids: list[list[int]], handle: bytes
    ) -> tuple[bytes, bool]:
        self._require_mode(MPTransferMode.LMCACHE_DRIVEN, "store")
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

    def _import_worker_event(self, worker: _Worker, handle: bytes) -> Any:
        """The worker's event (through its device's backend) the copy must follow, if any."""
        if not handle or worker.events is None or worker.context is None:
            return None
        try:
            return worker.events.import_event(handle, worker.context.device)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.BAD_PAYLOAD, f"bad event handle: {exc}") from None

    def _block_transfer(
        self,
        worker: _Worker,
        objs: list[MemoryObj],
        ids: list[int],
        direction: TransferDirection,
        skip_blocks: int,
        worker_event: Any,
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

    # -- engine-driven ------------------------------------------------------------------------

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
        worker = _Worker(
            payload.model_name, payload.world_size, layout, MPTransferMode.ENGINE_DRIVEN
        )
        worker.inline = not self.shm_name
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
            shm_name=self.shm_name, pool_size=self._pool_size
        )

    def _check_fits_l1(self, layout: KVLayout, operation: str) -> None:
        """Refuse a layout whose chunk cannot fit L1 at all (every store would fail)."""
        nbytes = layout.chunk_nbytes(self.chunk_size)
        capacity = int(self.storage.get_memory_allocator().capacity_bytes)
        if nbytes > capacity:
            raise ProtocolError(
                ErrorCode.BAD_PAYLOAD,
                f"{operation}: one chunk of this KV layout is {nbytes} bytes, more than the "
                f"whole L1 tier ({capacity} bytes): check num_layers, hidden_dim_size and "
                f"dtype, or give the server a larger --l1-size-gb",
            )

    def set_engine_driven_sub_path(self, instance_id: int, sub_path: str) -> bool:
        worker = self._worker(instance_id, MPTransferMode.ENGINE_DRIVEN)
        if sub_path not in ("shm", "inline"):
            raise ProtocolError(ErrorCode.BAD_PAYLOAD, f"unknown sub-path {sub_path!r}")
        if sub_path == "shm" and not self.shm_name:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_TRANSFER_MODE, "this server runs without shared memory"
            )
        worker.inline = sub_path == "inline"
        worker.inline_declared = worker.inline
        return True

    def _refuse_pickle_sub_path(self, worker: _Worker, instance_id: int, operation: str) -> None:
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
        pending = _Pending([keys[i] for i in todo], objs, todo)
        self._put_pending(self._pending_stores, (instance_id, self._span_id(spans)), pending)
        context: dict[str, Any] = {"chunk_indices": todo}
        slots = None if worker.inline else self._slots(objs, worker.layout)
        if slots is not None:
            context["slots"] = slots
        return PrepareStoreResponse(context=context)

    def commit_store(self, key: IPCCacheServerKey, instance_id: int, data: bytes = b"") -> bool:
        self._require_mode(MPTransferMode.ENGINE_DRIVEN, "commit_store")
        worker = self._worker(instance_id, MPTransferMode.ENGINE_DRIVEN)
        spans = self._plan(key, worker)
        pending = self._take_pending(self._pending_stores, (instance_id, self._span_id(spans)))
        if pending is None:
            raise ProtocolError(
                ErrorCode.NOT_FOUND, "commit_store without a matching prepare_store (or it expired)"
            )
        try:
            if data:
                self._fill_inline(pending, data, worker.layout)
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

    def _fill_inline(self, pending: _Pending, data: bytes, layout: KVLayout) -> None:
        if data[:1] == b"\x80":
            raise ProtocolError(
                ErrorCode.BAD_PAYLOAD,
                "pickled commit_store data is refused (lmcache-core never unpickles; upstream "
                "LMCache's pickle sub-path is unsupported): use the SHM sub-path or "
                "lmcache-core's inline format",
            )
        try:
            chunks = msgspec.msgpack.decode(data, type=InlineChunks)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ProtocolError(ErrorCode.BAD_PAYLOAD, f"bad inline chunk data: {exc}") from None
        if chunks.chunk_indices != pending.indices or len(chunks.chunks) != len(pending.objs):
            raise ProtocolError(
                ErrorCode.BAD_PAYLOAD,
                f"inline data holds chunks {chunks.chunk_indices}, prepare_store asked for "
                f"{pending.indices}",
            )
        nbytes = layout.chunk_nbytes(self.chunk_size)
        for raw, obj in zip(chunks.chunks, pending.objs):
            if len(raw) != nbytes:
                raise ProtocolError(
                    ErrorCode.SHAPE_MISMATCH,
                    f"inline chunk has {len(raw)} bytes, expected {nbytes}",
                )
            target = obj.raw_tensor
            assert target is not None
            target[:nbytes].copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))

    def prepare_retrieve(self, key: IPCCacheServerKey, instance_id: int) -> PrepareRetrieveResponse:
        self._require_mode(MPTransferMode.ENGINE_DRIVEN, "prepare_retrieve")
        worker = self._worker(instance_id, MPTransferMode.ENGINE_DRIVEN)
        self._refuse_pickle_sub_path(worker, instance_id, "prepare_retrieve")
        spans = self._plan(key, worker)
        objs = self._get_all(self._keys(key, spans))
        if objs is None:
            return PrepareRetrieveResponse(success=False)
        pending = _Pending([], objs, list(range(len(spans))))
        try:
            for obj in objs:
                self._check_object(obj, worker.layout)
            slots = None if worker.inline else self._slots(objs, worker.layout)
            if slots is None:
                data = self._inline_data(objs, worker.layout, pending.indices)
                pending.release()
                self._count_retrieved(spans, worker, "inline")
                return PrepareRetrieveResponse(success=True, data=data)
        except BaseException:
            pending.release()
            raise
        self._put_pending(self._pending_retrieves, (instance_id, self._span_id(spans)), pending)
        self._count_retrieved(spans, worker, "shm")
        context = {"slots": slots, "chunk_indices": pending.indices}
        return PrepareRetrieveResponse(success=True, context=context)

    def _count_retrieved(self, spans: Sequence[ChunkSpan], worker: _Worker, sub_path: str) -> None:
        tokens = sum(s.num_tokens for s in spans)
        self._count(retrieved_chunks=len(spans), retrieved_tokens=tokens)
        if self.metrics is not None:
            nbytes = tokens * worker.layout.bytes_per_token()
            self.metrics.add_retrieved(worker.mode.value, sub_path, nbytes)

    def _inline_data(self, objs: list[MemoryObj], layout: KVLayout, indices: list[int]) -> bytes:
        nbytes = layout.chunk_nbytes(self.chunk_size)
        chunks = []
        for obj in objs:
            raw = obj.raw_tensor
            assert raw is not None
            chunks.append(raw[:nbytes].numpy().tobytes())
        return msgspec.msgpack.encode(InlineChunks(chunk_indices=indices, chunks=chunks))

    def commit_retrieve(self, key: IPCCacheServerKey, instance_id: int) -> bool:
        self._require_mode(MPTransferMode.ENGINE_DRIVEN, "commit_retrieve")
        worker = self._worker(instance_id, MPTransferMode.ENGINE_DRIVEN)
        spans = self._plan(key, worker)
        pending = self._take_pending(self._pending_retrieves, (instance_id, self._span_id(spans)))
        if pending is not None:
            pending.release()
        return True

    @staticmethod
    def _span_id(spans: Sequence[ChunkSpan]) -> tuple[int, ...]:
        return tuple(s.chunk_hash for s in spans)

    def _put_pending(
        self,
        table: dict[tuple[int, tuple[int, ...]], _Pending],
        ident: tuple[int, tuple[int, ...]],
        pending: _Pending,
    ) -> None:
        with self._pending_lock:
            full = ident not in table and len(table) >= MAX_PENDING_TRANSFERS
            old = None if full else table.pop(ident, None)
            if not full:
                table[ident] = pending
        if full:
            pending.release()
            raise ProtocolError(
                ErrorCode.OUT_OF_MEMORY,
                f"{MAX_PENDING_TRANSFERS} prepared transfers are waiting for their commit; "
                f"commit them or wait for --pending-transfer-timeout-seconds",
            )
        if old is not None:
            old.release()

    def _take_pending(
        self, table: dict[tuple[int, tuple[int, ...]], _Pending], ident: tuple[int, tuple[int, ...]]
    ) -> _Pending | None:
        with self._pending_lock:
            return table.pop(ident, None)

    def _drop_pending(
        self, predicate: Callable[[int], bool], older_than: float | None = None
    ) -> int:
        dropped = []
        with self._pending_lock:
            for table in (self._pending_stores, self._pending_retrieves):
                for ident in list(table):
                    pending = table[ident]
                    expired = older_than is None or pending.created < older_than
                    if predicate(ident[0]) and expired:
                        dropped.append(table.pop(ident))
        for pending in dropped:
            pending.release()
        return len(dropped)

    # -- lookup -------------------------------------------------------------------------------

    def lookup(self, key: IPCCacheServerKey, tp_size: int) -> None:
        try:
            spans = prefix_chunks(key, self.chunk_size)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.BAD_PAYLOAD, str(exc)) from None
        # Keys are built rank by rank and only for the prefix still hit, so the work is
        # bounded by what is stored, not by tp_size x chunks (tp_size is bounded on the wire).
        hits = len(spans)
        per_rank: list[list[Any]] = []
        for rank in range(max(1, int(tp_size))):
            if hits == 0:
                break
            keys = [self._storage_key(key, rank, s.chunk_hash) for s in spans[:hits]]
            hits = min(hits, self.storage.batched_contains(keys))
            per_rank.append(keys)
        pinned = [k for keys in per_rank for k in keys[:hits] if self.storage.contains(k, pin=True)]
        hit_tokens = sum(s.num_tokens for s in spans[:hits])
        self._count(lookup_hit_tokens=hit_tokens)
        if self.metrics is not None:
            miss_tokens = sum(s.num_tokens for s in spans[hits:])
            self.metrics.add_lookup(hit_tokens, miss_tokens)
        self._remember_lookup(key.request_id, _LookupSession(hit_tokens, hits, pinned))

    def _remember_lookup(self, request_id: str, session: _LookupSession) -> None:
        evicted = []
        with self._lookups_lock:
            old = self._lookups.pop(request_id, None)
            if old is not None:
                evicted.append(old)
            self._lookups[request_id] = session
            while len(self._lookups) > _MAX_LOOKUP_SESSIONS:
                evicted.append(self._lookups.popitem(last=False)[1])
        for stale in evicted:
            self._unpin(stale)

    def _unpin(self, session: _LookupSession) -> None:
        pinned, session.pinned = session.pinned, []
        for k in pinned:
            self.storage.unpin(k)

    def query_prefetch_status(self, request_id: str) -> int | None:
        """Hit **chunks** of the lookup (upstream's unit: its scheduler multiplies by the
        chunk size); a trailing partial chunk counts as one."""
        with self._lookups_lock:
            session = self._lookups.get(request_id)
        return None if session is None else session.hit_chunks

    def wait_prefetch_status(self, request_id: str, timeout: float) -> int | None:
        # Lookups finish before their reply, so there is never anything to wait for.
        return self.query_prefetch_status(request_id)

    def free_lookup_locks(self, key: IPCCacheServerKey, tp_size: int) -> None:
        with self._lookups_lock:
            session = self._lookups.get(key.request_id)
        if session is not None:
            self._unpin(session)

    def end_session(self, request_id: str) -> None:
        with self._lookups_lock:
            session = self._lookups.pop(request_id, None)
        if session is not None:
            self._unpin(session)

    # -- management ---------------------------------------------------------------------------

    def clear(self, force: bool = False, admin_token: str | None = None) -> None:
        """Remove every cached object (an admin operation: see ``authorize_admin``)."""
        self.authorize_admin("clear", admin_token)
        removed = self.remove_all(force)
        logger.info("clear (admin request) removed %d objects (force=%s)", removed, force)

    def authorize_admin(self, operation: str, presented_token: str | None) -> None:
        """Refuse a wire admin operation unless --enable-admin-ops is on and the token
        (when one is configured) matches; raises ``ProtocolError``."""
        policy = self.settings.admin
        if not policy.wire_enabled:
            self._refusals.note(operation, "admin operations are off")
            raise ProtocolError(
                ErrorCode.FORBIDDEN,
                f"{operation} is an admin operation (it affects every worker's data) and this "
                f"server refuses admin operations; start it with --enable-admin-ops (and an "
                f"admin token, --admin-token-file) to allow them",
            )
        check = policy.check_token(presented_token)
        if check is TokenCheck.OK:
            return
        self._refusals.note(operation, f"{check.value} admin token")
        if check is TokenCheck.MISSING:
            message = (
                f"{operation} needs the server's admin token and none was presented; pass "
                f"it to MPClient(admin_token=...) or set LMCACHE_ADMIN_TOKEN"
            )
        else:
            message = f"{operation}: the admin token presented is wrong"
        raise ProtocolError(ErrorCode.UNAUTHORIZED, message)

    def check_admin_token(self, presented_token: str | None) -> TokenCheck:
        """The token check alone (the HTTP frontend has its own enable flag)."""
        check = self.settings.admin.check_token(presented_token)
        if check is not TokenCheck.OK:
            self._refusals.note("HTTP /cache/clear", f"{check.value} admin token")
        return check

    def remove_all(self, force: bool = False) -> int:
        """Remove every L1 object (and its lower-tier copies); returns how many went."""
        l1 = self.storage.local_cpu_backend
        removed = 0
        with contextlib.ExitStack() as stack:
            for counter in self._evictions.values():
                stack.enter_context(counter.explicit())
            for k in l1.get_keys():
                removed += bool(self.storage.remove(k, force=force))
        return removed

    def get_chunk_size(self) -> int:
        return self.chunk_size

    def ping(self, instance_id: int | None = None) -> bool:
        if instance_id is None:
            return True
        with self._workers_lock:
            worker = self._workers.get(instance_id)
        if worker is None:
            return False
        worker.last_seen = time.monotonic()
        return True

    def report_block_allocation(
        self, instance_id: int, model_name: str, records: list[BlockAllocationRecord]
    ) -> None:
        """Accepted and ignored: upstream's vLLM scheduler reports engine block allocations
        (fire-and-forget) for features we do not have (lazy offload, KV events)."""
        logger.debug("%d block-allocation records from %d ignored", len(records), instance_id)

    def noop(self) -> str:
        return "noop"

    def get_experimental(self) -> list[str]:
        return []

    def protocol_handshake(self, client_version: int) -> tuple[int, bool]:
        if client_version != PROTOCOL_VERSION:
            raise ProtocolError(
                ErrorCode.VERSION_MISMATCH,
                f"client speaks MP protocol version {client_version}, this server speaks "
                f"{PROTOCOL_VERSION}: upgrade the older side",
            )
        return PROTOCOL_VERSION, True

    def get_stats(self) -> ServerStats:
        l1 = self.storage.local_cpu_backend
        with self._workers_lock:
            modes = [w.mode for w in self._workers.values()]
        with self._pending_lock:
            pending = len(self._pending_stores) + len(self._pending_retrieves)
        with self._stats_lock:
            stats = msgspec.structs.replace(self.stats)
        stats.l1_chunks = len(l1)
        stats.l1_used_bytes = int(l1.used_bytes)
        stats.l1_capacity_bytes = int(l1.capacity_bytes)
        stats.lmcache_driven_workers = modes.count(MPTransferMode.LMCACHE_DRIVEN)
        stats.engine_driven_workers = modes.count(MPTransferMode.ENGINE_DRIVEN)
        stats.pending_prepares = pending
        return stats

    # -- observability ------------------------------------------------------------------------

    def health_problems(self) -> list[str]:
        """Why the server cannot serve (empty when healthy): broken or unreachable tiers."""
        return tier_problems(self.storage)

    def worker_counts(self) -> dict[str, int]:
        with self._workers_lock:
            modes = [w.mode.value for w in self._workers.values()]
        return {
            m.value: modes.count(m.value) for m in MPTransferMode if m is not MPTransferMode.AUTO
        }

    def pinned_objects(self) -> int:
        with self._lookups_lock:
            return sum(len(s.pinned) for s in self._lookups.values())

    def tiers(self) -> list[dict[str, Any]]:
        return describe_tiers(self.storage, self._evictions)

    def metrics_state(self) -> dict[str, Any]:
        """What the metrics read at scrape time."""
        return {
            "tiers": self.tiers(),
            "workers": self.worker_counts(),
            "pinned_objects": self.pinned_objects(),
            "healthy": not self.health_problems(),
        }

    def status(self) -> dict[str, Any]:
        """The ``/status`` document."""
        from lmcache import __version__

        stats = self.get_stats()
        with self._workers_lock:
            workers = [
                {
                    "instance_id": iid,
                    "model_name": w.model_name,
                    "world_size": w.world_size,
                    "transfer_mode": w.mode.value,
                    "sub_path": (
                        DIRECT_SUB_PATH
                        if w.mode is MPTransferMode.LMCACHE_DRIVEN
                        else ("inline" if w.inline else "shm")
                    ),
                    "idle_seconds": round(time.monotonic() - w.last_seen, 3),
                }
                for iid, w in self._workers.items()
            ]
        supported = self.settings.supported_transfer_mode
        modes = (
            [MPTransferMode.LMCACHE_DRIVEN.value, MPTransferMode.ENGINE_DRIVEN.value]
            if supported is MPTransferMode.AUTO
            else [supported.value]
        )
        problems = self.health_problems()
        return {
            "version": __version__,
            "instance_id": self.settings.instance_id,
            "uptime_seconds": round(time.time() - self.started_at, 3),
            "chunk_size": self.chunk_size,
            "healthy": not problems,
            "problems": problems,
            "supported_transfer_mode": supported.value,
            "transfer_modes": modes,
            "shm_name": self.shm_name,
            "metrics_enabled": self.metrics is not None,
            "tiers": self.tiers(),
            "workers": workers,
            "pinned_objects": self.pinned_objects(),
            "pending_prepares": stats.pending_prepares,
            "counters": {
                "stored_tokens": stats.stored_tokens,
                "retrieved_tokens": stats.retrieved_tokens,
                "stored_chunks": stats.stored_chunks,
                "retrieved_chunks": stats.retrieved_chunks,
                "lookup_hit_tokens": stats.lookup_hit_tokens,
                "errors": stats.errors,
                "dropped_replies": stats.dropped_replies,
            },
        }

    # -- housekeeping -------------------------------------------------------------------------

    def reap(self, now: float | None = None) -> None:
        """Drop expired pending transfers, silent workers and stale lookup sessions."""
        now = time.monotonic() if now is None else now
        self._drop_pending(
            lambda _iid: True, older_than=now - self.settings.pending_transfer_timeout_seconds
        )
        timeout = self.settings.worker_reap_timeout_seconds
        if timeout > 0:
            with self._workers_lock:
                stale = [
                    (i, w.mode) for i, w in self._workers.items() if now - w.last_seen > timeout
                ]
            for instance_id, mode in stale:
                if self._drop_worker(instance_id, mode, unlink=True):
                    logger.warning(
                        "reaped worker %d: no contact for %.0fs; its shared memory is unmapped "
                        "(and unlinked where the segment's creator is gone)",
                        instance_id,
                        timeout,
                    )
        ttl = self.settings.session_ttl_seconds
        expired = []
        with self._lookups_lock:
            for request_id in list(self._lookups):
                if now - self._lookups[request_id].created > ttl:
                    expired.append(self._lookups.pop(request_id))
        for session in expired:
            self._unpin(session)

    def close(self) -> None:
        with self._workers_lock:
            workers = list(self._workers.items())
            self._workers.clear()
        for instance_id, worker in workers:
            self._release_worker(instance_id, worker, unlink=False)
        self._drop_pending(lambda _iid: True)
        with self._lookups_lock:
            sessions = list(self._lookups.values())
            self._lookups.clear()
        for session in sessions:
            self._unpin(session)
        try:
            self.storage.close()
        finally:
            if self.metrics is not None:
                self.metrics.close()
