"""The cache server's shared state and the helpers every operation family uses.

:class:`ServerCore` declares, in one place, everything the operation families
(:mod:`.workers`, :mod:`.lmcache_driven`, :mod:`.engine_driven`, :mod:`.lookup`,
:mod:`.admin`) read and write: settings, storage, the worker registry, the pending
transfers, the lookup sessions, the counters and metrics.  The families are mixins over it
and :class:`~lmcache.v1.multiprocess.server.handler.MPCacheServer` composes them.

Handlers raise :class:`~lmcache.v1.multiprocess.wire.protocol.ProtocolError` for anything the
client must learn about; the transport turns those into typed error replies.  A chunk
becomes visible (lookup / retrieve) only after all its bytes are in L1, so a store that
dies half-way never exposes a partial chunk.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import torch

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.multiprocess.server.kv_events import DEFAULT_KV_EVENT_LOG_SIZE, KVEventLog
from lmcache.v1.multiprocess.server.kv_layout import KVLayout, chunk_memory_format
from lmcache.v1.multiprocess.server.metrics import ServerMetrics
from lmcache.v1.multiprocess.server.pending import PendingTransfers
from lmcache.v1.multiprocess.server.prefetch import DEFAULT_MAX_IN_FLIGHT, Prefetcher, PrefetchJob
from lmcache.v1.multiprocess.server.rate_limited_logs import RefusalLog
from lmcache.v1.multiprocess.server.tenants import Tenant, TenantTable, current_tenant
from lmcache.v1.multiprocess.server.tiers import EvictionCounter, install_eviction_counters
from lmcache.v1.multiprocess.wire.chunking import ChunkSpan, plan_chunks, range_block_ids
from lmcache.v1.multiprocess.wire.curve import CurveServerKeys
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey, ObjectScope, ServerStats
from lmcache.v1.multiprocess.wire.protocol import ErrorCode, ProtocolError
from lmcache.v1.multiprocess.wire.security import AdminPolicy, HTTPSecurity
from lmcache.v1.platform import get_device_spec
from lmcache.v1.platform.base.cache_context import BaseCacheContext
from lmcache.v1.platform.base.event_ipc import EventIPCBackend
from lmcache.v1.platform.cache_context import DeviceSpecLookup
from lmcache.v1.platform.transfer_mode import MPTransferMode
from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface
from lmcache.v1.storage_backend.cache_salt import configs_with_salt
from lmcache.v1.storage_backend.storage_manager import StorageManager

if TYPE_CHECKING:
    from lmcache.v1.multiprocess.server_config import MPServerConfig

# The storage key's dtype field is fixed: chunk objects carry their real dtype and shape,
# which retrieve checks against the worker's layout (lookups know no dtype).
_KEY_DTYPE = torch.uint8
# Metric label of the LMCache-driven path: the server copies straight between its L1 and
# the worker's registered KV cache pages.
DIRECT_SUB_PATH = "direct"


@dataclasses.dataclass
class CacheServerSettings:
    chunk_size: int = 256
    supported_transfer_mode: MPTransferMode = MPTransferMode.AUTO
    instance_id: str = ""  # the server's id (--instance-id), reported by /status
    worker_reap_timeout_seconds: float = 120.0
    pending_transfer_timeout_seconds: float = 60.0
    # A prepared store expires sooner when upstream's write-lock TTL
    # (--l1-write-ttl-seconds) is shorter; None: pending_transfer_timeout_seconds.
    prepared_store_ttl_seconds: float | None = None
    session_ttl_seconds: float = 600.0
    # Background L2 -> L1 promotion of lookup hits (--l2-prefetch-max-in-flight, as
    # upstream); 0 = synchronous (a retrieve reads the lower tiers itself).
    prefetch_max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    # How long a retrieve waits for the prefetch of a chunk it needs before it is a miss.
    prefetch_wait_timeout_seconds: float = 30.0
    # --l2-prefetch-policy retain: prefetched chunks stay in L1 after their session
    # (upstream's default drops them then).
    prefetch_retain: bool = False
    admin: AdminPolicy = dataclasses.field(default_factory=AdminPolicy)
    # KV-event records kept per model (--kv-event-log-size); 0 turns the events off.
    kv_event_log_size: int = DEFAULT_KV_EVENT_LOG_SIZE
    # CurveZMQ keys of the RPC port (--curve-secret-key-file, --authorized-keys); None: open.
    curve: CurveServerKeys | None = None
    # Tenants bound to those keys (--tenants-file); None: every admitted peer may do all.
    tenants: TenantTable | None = None
    # TLS and the read-route token of the HTTP listeners (--http-tls-*, --http-read-token-file).
    http: HTTPSecurity = dataclasses.field(default_factory=HTTPSecurity)


@dataclasses.dataclass
class Worker:
    """One registered worker (either transfer mode)."""

    model_name: str
    world_size: int
    layout: KVLayout
    mode: MPTransferMode
    context: BaseCacheContext | None = None  # the cache context (LMCache-driven)
    events: EventIPCBackend | None = None  # its device's event backend (LMCache-driven)
    inline: bool = False  # engine-driven sub-path
    inline_declared: bool = False  # the worker said it speaks inline (not upstream's pickle)
    tenant: str | None = None  # the tenant that registered it (--tenants-file)
    last_seen: float = dataclasses.field(default_factory=time.monotonic)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


@dataclasses.dataclass
class LookupSession:
    """What one lookup found and pinned, until its request ends (or the session expires)."""

    hit_tokens: int
    hit_chunks: int
    # Each pinned key with the tiers that pinned it (unpinned in exactly those).
    pinned: list[tuple[CacheEngineKey, tuple[StorageBackendInterface, ...]]]
    prefetch: PrefetchJob | None = None  # chunks being promoted into L1 for this session
    created: float = dataclasses.field(default_factory=time.monotonic)


class ServerCore:
    """The cache server's state: L1/L2 storage, registered workers, pending transfers."""

    def __init__(
        self,
        settings: CacheServerSettings,
        storage: StorageManager,
        device_specs: DeviceSpecLookup | None = None,
        unlink_orphaned_segment: Callable[[str], bool] | None = None,
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
        self._workers: dict[int, Worker] = {}
        self._workers_lock = threading.Lock()
        self._pending = PendingTransfers()
        self._lookups: OrderedDict[str, LookupSession] = OrderedDict()
        self._lookups_lock = threading.Lock()
        self.prefetcher: Prefetcher | None = None
        if settings.prefetch_max_in_flight > 0:
            self.prefetcher = Prefetcher(
                storage,
                settings.prefetch_max_in_flight,
                settings.prefetch_wait_timeout_seconds,
                retain=settings.prefetch_retain,
            )
        self.stats = ServerStats(
            supported_transfer_mode=settings.supported_transfer_mode.value,
            shm_name=self.shm_name,
            chunk_size=self.chunk_size,
            server_incarnation=uuid.uuid4().hex,
        )
        self._stats_lock = threading.Lock()
        self.started_at = time.time()
        self._evictions: dict[str, EvictionCounter] = install_eviction_counters(storage)
        self._refusals = RefusalLog()
        self._tenant_refusals = RefusalLog(subject="tenant request")
        self.kv_events = KVEventLog(settings.kv_event_log_size)
        if self.kv_events.enabled:
            storage.local_cpu_backend.add_residency_listener(self.kv_events.on_l1_change)
        # Made by MPCacheServer once every family is in place (they read its state).
        self.metrics: ServerMetrics | None = None
        # The flags the server was built from (MPCacheServer's ``server_config``), reported
        # by ``GET /config``; None for a server built in code without them.
        self.server_config: MPServerConfig | None = None

    # -- helpers ------------------------------------------------------------------------------

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)

    # -- tenants (see .tenants): every check is decided before storage is consulted --------

    def _forbid(self, tenant: Tenant, operation: str, what: str) -> ProtocolError:
        self._tenant_refusals.note(operation, f"tenant {tenant.name}: {what}")
        # The transport names the operation in the reply already.
        return ProtocolError(ErrorCode.FORBIDDEN, f"tenant {tenant.name!r} may not {what}")

    def _check_model(self, model_name: str, operation: str) -> None:
        tenant = current_tenant()
        if tenant is not None and not tenant.may_use_model(model_name):
            raise self._forbid(tenant, operation, f"use model {model_name!r}")

    def _admit_key(self, key: IPCCacheServerKey, write: bool, operation: str) -> IPCCacheServerKey:
        """``key`` as the calling tenant may use it: its model must be the tenant's, its
        salt one the tenant owns (``write``) or may read; a key without a salt gets the
        tenant's default salt.  Unchanged without tenants."""
        tenant = current_tenant()
        if tenant is None:
            return key
        self._check_model(key.model_name, operation)
        salt = tenant.salt_for(key.cache_salt)
        if not (tenant.owns(salt) if write else tenant.may_read(salt)):
            raise self._forbid(tenant, operation, f"{'write' if write else 'read'} salt {salt!r}")
        return key if salt == key.cache_salt else dataclasses.replace(key, cache_salt=salt)

    def _admit_scope(self, scope: ObjectScope, write: bool, operation: str) -> ObjectScope:
        """Named objects under the same rules as keys (:meth:`_admit_key`): the scope's
        model must be the tenant's and its salt one the tenant owns (``write``) or may read;
        a scope without a salt gets the tenant's default salt."""
        tenant = current_tenant()
        if tenant is None:
            return scope
        self._check_model(scope.model_name, operation)
        salt = tenant.salt_for(scope.cache_salt)
        if not (tenant.owns(salt) if write else tenant.may_read(salt)):
            raise self._forbid(tenant, operation, f"{'write' if write else 'read'} salt {salt!r}")
        return (
            scope if salt == scope.cache_salt else msgspec.structs.replace(scope, cache_salt=salt)
        )

    def _owns_worker(self, worker: Worker) -> bool:
        tenant = current_tenant()
        return tenant is None or worker.tenant == tenant.name

    def _session_id(self, request_id: str) -> str:
        """Lookup sessions are per tenant: another tenant's request id names nothing."""
        tenant = current_tenant()
        return request_id if tenant is None else f"{tenant.name}\x00{request_id}"

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

    def _plan(self, key: IPCCacheServerKey, worker: Worker) -> list[ChunkSpan]:
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
            spans = plan_chunks(key, self.chunk_size)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.BAD_PAYLOAD, str(exc)) from None
        self.kv_events.bind_tokens(key, spans, self.chunk_size)
        return spans

    def _storage_key(self, key: IPCCacheServerKey, worker_id: int, chunk_hash: int) -> Any:
        return CacheEngineKey(
            key.model_name,
            key.world_size,
            worker_id,
            chunk_hash,
            _KEY_DTYPE,
            configs_with_salt(key.request_configs, key.cache_salt),
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

    def _commit(
        self,
        keys: list[Any],
        objs: list[MemoryObj],
        spans: Sequence[ChunkSpan],
        worker: Worker,
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
            if worker.tenant is not None:
                self.metrics.add_tenant_bytes(worker.tenant, "stored", nbytes)

    def _count_retrieved(self, spans: Sequence[ChunkSpan], worker: Worker, sub_path: str) -> None:
        tokens = sum(s.num_tokens for s in spans)
        self._count(retrieved_chunks=len(spans), retrieved_tokens=tokens)
        if self.metrics is not None:
            nbytes = tokens * worker.layout.bytes_per_token()
            self.metrics.add_retrieved(worker.mode.value, sub_path, nbytes)
            if worker.tenant is not None:
                self.metrics.add_tenant_bytes(worker.tenant, "retrieved", nbytes)

    def _get_all(self, keys: list[Any]) -> list[MemoryObj] | None:
        # Chunks still on their way into L1 are waited for (only these); a failed or
        # overdue prefetch is a miss rather than a second, synchronous read.
        if self.prefetcher is not None and not self.prefetcher.wait_for(keys):
            return None
        found = self.storage.batched_get_blocking(keys)
        if any(obj is None for obj in found):
            for obj in found:
                if obj is not None:
                    obj.ref_count_down()
            return None
        return [obj for obj in found if obj is not None]

    def _missing(self, keys: list[Any]) -> list[int]:
        return [i for i, k in enumerate(keys) if not self.storage.contains(k)]
