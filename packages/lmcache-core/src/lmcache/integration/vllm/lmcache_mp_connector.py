"""``LMCacheMPConnector``: vLLM's KV connector for the LMCache multiprocess cache server.

Enable it with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "LMCacheMPConnector",
        "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"lmcache.mp.host": "tcp://localhost",
                                      "lmcache.mp.port": "5555"}}'

Scheduler role: asks the server how long a prefix of each new request it holds (one
non-blocking lookup per request; ``None`` while the answer is pending), and after every
step tells the workers which token ranges to load before the forward and which to store
after it.  Worker role: registers the paged KV cache with the server in the chosen
transfer mode and performs those loads and stores.  Loads are synchronous (they finish
before the forward that needs them); stores finish inside ``wait_for_save``, so vLLM may
free a finished request's blocks at once.

The server being down at start-up is an error that says how to start one; the server
dying later turns every lookup into a miss and every store into a no-op, never a hang.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from lmcache.integration.vllm.mp_client import (
    GuardedClient,
    HeartbeatThread,
    ServerHealth,
    connect,
)
from lmcache.integration.vllm.mp_config import MPConnectorConfig, parse_extra_config
from lmcache.integration.vllm.scheduler_state import (
    LMCacheMPRequestMetadata,
    LMCacheMPRequestState,
    LMCacheMPRequestTracker,
    LoadStoreOp,
    blocks_of_range,
    load_op,
    store_range,
    usable_hit_tokens,
)
from lmcache.integration.vllm.vllm_kv_layout import DetectedLayout, transfer_views
from lmcache.v1.multiprocess.wire.chunking import hit_chunks_to_tokens
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.worker.client import MPClientError
from lmcache.v1.platform.ops_types import EngineKVFormat
from lmcache.v1.platform.transfer_mode import MPTransferMode

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)

# Short bounds for the per-request calls (a live server answers in milliseconds); the
# configured mq_timeout bounds start-up calls (handshake, chunk size, registration).
LOOKUP_TIMEOUT_S = 5.0
TRANSFER_TIMEOUT_S = 30.0

__all__ = [
    "LMCacheMPConnector",
    "LMCacheMPConnectorMetadata",
    "LMCacheMPRequestMetadata",
    "LoadStoreOp",
]


@dataclasses.dataclass
class LMCacheMPConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's work for the workers: loads before the forward, stores after it."""

    loads: list[LMCacheMPRequestMetadata] = dataclasses.field(default_factory=list)
    stores: list[LMCacheMPRequestMetadata] = dataclasses.field(default_factory=list)


def _model_name(vllm_config: VllmConfig) -> str:
    model_config = vllm_config.model_config
    served = getattr(model_config, "served_model_name", None)
    if isinstance(served, (list, tuple)) and served:
        served = served[0]
    return str(served or model_config.model)


def _tp_size(vllm_config: VllmConfig) -> int:
    parallel = vllm_config.parallel_config
    if int(getattr(parallel, "pipeline_parallel_size", 1)) > 1:
        raise ValueError("LMCacheMPConnector does not support pipeline parallelism")
    return int(parallel.tensor_parallel_size)


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except (AssertionError, ImportError, RuntimeError):
        return 0


class LMCacheMPConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
    """See the module docstring."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.config: MPConnectorConfig = parse_extra_config(extra)
        if len(self.config.server_urls) != 1:
            raise ValueError(
                "lmcache.mp.server_urls: this version supports exactly one server, got "
                f"{list(self.config.server_urls)}"
            )
        self.server_url = self.config.server_urls[0]
        self.model_name = _model_name(vllm_config)
        self.world_size = _tp_size(vllm_config)
        self.block_size = int(vllm_config.cache_config.block_size)
        self.health = ServerHealth()
        self._heartbeat: HeartbeatThread | None = None
        self._client = GuardedClient(
            connect(self.server_url, self.config.mq_timeout, self.config.start_server_hint),
            self.health,
        )
        self.chunk_size = int(self._client.run("get_chunk_size", lambda c: c.get_chunk_size()))
        if self.chunk_size % self.block_size:
            raise ValueError(
                f"the LMCache server's chunk size ({self.chunk_size}) must be a multiple of "
                f"vLLM's block size ({self.block_size}); restart the server with "
                f"--chunk-size {self._suggested_chunk_size()}"
            )
        # scheduler state
        self._trackers: dict[str, LMCacheMPRequestTracker] = {}
        self._requests: dict[str, Request] = {}
        # worker state
        self._transfer: Any = None
        self._layout: DetectedLayout | None = None
        self._kv_views: dict[str, torch.Tensor] = {}
        self._rank = 0
        self._instance_id = 0
        self._load_errors: set[int] = set()
        logger.info(
            "LMCacheMPConnector (%s) connected to %s: chunk size %d, block size %d, world size %d",
            role.name.lower(),
            self.server_url,
            self.chunk_size,
            self.block_size,
            self.world_size,
        )

    def _suggested_chunk_size(self) -> int:
        return max(self.block_size, self.chunk_size // self.block_size * self.block_size)

    @property
    def requires_kv_delivery(self) -> bool:
        # A best-effort cache: a store lost to preemption is just a future miss.
        return False

    # ==================================================================================
    # Scheduler side
    # ==================================================================================

    def _tracker(self, request: Request) -> LMCacheMPRequestTracker:
        tracker = self._trackers.get(request.request_id)
        if tracker is None:
            tracker = LMCacheMPRequestTracker(
                request_id=request.request_id,
                prompt_len=len(request.prompt_token_ids or ()),
                cache_salt=getattr(request, "cache_salt", None) or "",
            )
            self._trackers[request.request_id] = tracker
            self._requests[request.request_id] = request
        return tracker

    def _lookup_key(self, request: Request, tracker: LMCacheMPRequestTracker) -> IPCCacheServerKey:
        return IPCCacheServerKey.from_token_ids(
            self.model_name,
            self.world_size,
            None,
            list(request.prompt_token_ids or ()),
            request_id=request.request_id,
            cache_salt=tracker.cache_salt,
        )

    def _poll_lookup(self, request: Request, tracker: LMCacheMPRequestTracker) -> int | None:
        """The server's hit count, None while pending; a failure counts as a miss."""
        try:
            if not tracker.lookup_submitted:
                key = self._lookup_key(request, tracker)
                self._client.run(
                    "lookup",
                    lambda c: c.call("lookup", key, self.world_size, timeout=LOOKUP_TIMEOUT_S),
                )
                tracker.lookup_submitted = True
            if self.config.nonblocking_lookup_status:
                return self._client.run(
                    "query_prefetch_status",
                    lambda c: c.call(
                        "query_prefetch_status", request.request_id, timeout=LOOKUP_TIMEOUT_S
                    ),
                )
            return (
                self._client.run(
                    "wait_prefetch_status",
                    lambda c: c.call(
                        "wait_prefetch_status",
                        request.request_id,
                        LOOKUP_TIMEOUT_S,
                        timeout=2 * LOOKUP_TIMEOUT_S,
                    ),
                )
                or 0
            )
        except (MPClientError, ValueError) as exc:
            logger.debug("lookup for %s failed (%s); treating as a miss", request.request_id, exc)
            tracker.state = LMCacheMPRequestState.BYPASS_LMCACHE
            return 0

    def on_new_request(self, request: Request) -> None:
        if self.config.eager_prefetch and not self.health.is_down:
            self._poll_lookup(request, self._tracker(request))

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        tracker = self._tracker(request)
        if tracker.state == LMCacheMPRequestState.BYPASS_LMCACHE or self.health.is_down:
            tracker.state = LMCacheMPRequestState.BYPASS_LMCACHE
            return 0, False
        if tracker.hit_tokens is None:
            hit = self._poll_lookup(request, tracker)
            if hit is None:
                return None, False
            tracker.hit_tokens = hit_chunks_to_tokens(hit, self.chunk_size, tracker.prompt_len)
        usable = usable_hit_tokens(tracker.hit_tokens, tracker.prompt_len, self.chunk_size)
        tracker.local_computed = num_computed_tokens
        if usable <= num_computed_tokens:
            tracker.state = LMCacheMPRequestState.READY
            return 0, False
        tracker.state = LMCacheMPRequestState.WAITING_FOR_LOAD
        return usable - num_computed_tokens, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        tracker = self._tracker(request)
        tracker.num_external = int(num_external_tokens)
        if num_external_tokens <= 0:
            tracker.state = LMCacheMPRequestState.READY

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = LMCacheMPConnectorMetadata()
        num_scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            tracker = self._trackers.get(new.req_id)
            request = self._requests.get(new.req_id)
            if tracker is None or request is None:
                continue
            tracker.block_ids = [list(group) for group in new.block_ids]
            self._emit_load(meta, tracker, request)
            self._emit_store(
                meta, tracker, request, new.num_computed_tokens, num_scheduled.get(new.req_id, 0)
            )
        cached = scheduler_output.scheduled_cached_reqs
        for index, req_id in enumerate(cached.req_ids):
            tracker = self._trackers.get(req_id)
            request = self._requests.get(req_id)
            if tracker is None or request is None:
                continue
            new_blocks = cached.new_block_ids[index]
            if req_id in cached.resumed_req_ids:
                tracker.block_ids = [list(g) for g in (new_blocks or ())]
            elif new_blocks is not None:
                for group, extra in zip(tracker.block_ids, new_blocks):
                    group.extend(extra)
            self._emit_store(
                meta,
                tracker,
                request,
                cached.num_computed_tokens[index],
                num_scheduled.get(req_id, 0),
            )
        return meta

    def _emit_load(
        self, meta: LMCacheMPConnectorMetadata, tracker: LMCacheMPRequestTracker, request: Request
    ) -> None:
        op = load_op(tracker, list(request.prompt_token_ids or ()))
        if op is None:
            return
        tracker.load_emitted = True
        tracker.state = LMCacheMPRequestState.READY
        # What we load is on the server already: storing starts after it.
        tracker.stored_end = max(tracker.stored_end, op.end)
        meta.loads.append(LMCacheMPRequestMetadata(tracker.request_id, op, tracker.cache_salt))

    def _emit_store(
        self,
        meta: LMCacheMPConnectorMetadata,
        tracker: LMCacheMPRequestTracker,
        request: Request,
        computed_before: int,
        scheduled: int,
    ) -> None:
        if tracker.state == LMCacheMPRequestState.BYPASS_LMCACHE or self.health.is_down:
            return
        if self.config.save_decode_cache:
            tokens = list(request.all_token_ids)
        else:
            tokens = list(request.prompt_token_ids or ())
        span = store_range(
            tracker,
            computed_before + scheduled,
            len(tokens),
            self.chunk_size,
            self.config.max_offload_tokens,
        )
        if span is None:
            return
        start, end = span
        tracker.stored_end = end
        op = LoadStoreOp(
            token_ids=tuple(tokens[:end]),
            block_ids=tuple(tuple(group) for group in tracker.block_ids),
            start=start,
            end=end,
        )
        meta.stores.append(LMCacheMPRequestMetadata(tracker.request_id, op, tracker.cache_salt))

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._finish(request.request_id)
        return False, None

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._finish(request.request_id)
        return False, None

    def _finish(self, request_id: str) -> None:
        tracker = self._trackers.pop(request_id, None)
        self._requests.pop(request_id, None)
        if tracker is None or not tracker.lookup_submitted or self.health.is_down:
            return
        try:
            self._client.run(
                "end_session",
                lambda c: c.call("end_session", request_id, timeout=LOOKUP_TIMEOUT_S),
            )
        except MPClientError as exc:
            logger.debug("end_session(%s) failed: %s", request_id, exc)

    # ==================================================================================
    # Worker side
    # ==================================================================================

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from lmcache.v1.multiprocess.transfer_context.worker_transfer import (
            create_transfer_context,
        )
        from lmcache.v1.multiprocess.worker.kv_cache_worker import new_instance_id

        spec = self._attention_spec()
        views, layout = transfer_views(
            kv_caches, self.block_size, int(spec.num_kv_heads), int(spec.head_size)
        )
        mode = self._resolve_mode(views)
        if (
            mode == MPTransferMode.LMCACHE_DRIVEN
            and layout.num_blocks
            and next(iter(kv_caches.values())).device.type == "cpu"
        ):
            from lmcache.integration.vllm.cpu_shm_remap import remap_kv_caches_to_shm

            remap_kv_caches_to_shm(list(kv_caches.values()))
        self._rank = _tp_rank()
        self._instance_id = new_instance_id()
        self._layout = layout
        self._kv_views = views
        self._transfer = create_transfer_context(
            views, instance_id=self._instance_id, req_client=self._client.client, mode=mode
        )
        self._transfer.register(
            views,
            self.model_name,
            self.world_size,
            self.chunk_size // self.block_size,
            self.config.mq_timeout,
        )
        self._heartbeat = HeartbeatThread(
            self.server_url, self.health, self.config.heartbeat_interval, self._instance_id
        )
        self._heartbeat.start()
        logger.info(
            "LMCacheMPConnector worker rank %d/%d registered %d layers (%s, %s) in %s mode",
            self._rank,
            self.world_size,
            len(views),
            layout.engine_kv_format.name,
            str(layout.dtype).removeprefix("torch."),
            getattr(self._transfer, "mode", mode).value,
        )

    def _attention_spec(self) -> Any:
        groups = self._kv_cache_config.kv_cache_groups if self._kv_cache_config else []
        if len(groups) != 1:
            raise ValueError(
                f"LMCacheMPConnector supports one KV-cache group, this model has {len(groups)}"
            )
        return groups[0].kv_cache_spec

    def _resolve_mode(self, views: dict[str, torch.Tensor]) -> MPTransferMode:
        mode = self.config.mp_transfer_mode
        if mode != MPTransferMode.AUTO:
            return mode
        from lmcache.v1.platform import get_device_spec

        device_type = next(iter(views.values())).device.type
        spec = get_device_spec(device_type)
        return MPTransferMode.parse(
            spec.default_mp_transfer_mode() if spec is not None else MPTransferMode.ENGINE_DRIVEN
        )

    def _key(self, item: LMCacheMPRequestMetadata) -> IPCCacheServerKey:
        op = item.op
        return IPCCacheServerKey.from_token_ids(
            self.model_name,
            self.world_size,
            self._rank,
            op.token_ids,
            start=op.start,
            end=op.end,
            request_id=item.request_id,
            cache_salt=item.cache_salt,
        )

    def _metadata(self) -> LMCacheMPConnectorMetadata | None:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        return meta if isinstance(meta, LMCacheMPConnectorMetadata) else None

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._metadata()
        if meta is None or not meta.loads or self._transfer is None:
            return
        for item in meta.loads:
            ok = False
            if not self.health.is_down:
                ok = self._run_transfer("retrieve", item)
            if not ok:
                op = item.op
                failed = blocks_of_range(
                    op.block_ids[0], op.skip_first_n_tokens, op.end, self.block_size
                )
                logger.warning(
                    "loading %d tokens of %s from LMCache failed; vLLM recomputes them",
                    op.end - op.skip_first_n_tokens,
                    item.request_id,
                )
                self._load_errors |= failed

    def _run_transfer(self, what: str, item: LMCacheMPRequestMetadata) -> bool:
        op = item.op
        key = self._key(item)
        block_ids = [list(group) for group in op.block_ids]
        blocks_in_chunk = self.chunk_size // self.block_size
        try:
            if what == "store":
                future = self._transfer.submit_store(
                    item.request_id, key, self._kv_views, block_ids, None, blocks_in_chunk
                )
            else:
                future = self._transfer.submit_retrieve(
                    item.request_id,
                    key,
                    self._kv_views,
                    block_ids,
                    None,
                    blocks_in_chunk,
                    op.skip_first_n_tokens,
                )
            return bool(future.result(timeout=TRANSFER_TIMEOUT_S))
        except Exception as exc:
            if (
                isinstance(exc, (TimeoutError, ConnectionError))
                or "Unavailable" in type(exc).__name__
            ):
                self.health.mark_down(f"{what}: {exc}")
            logger.warning("LMCache %s for %s failed: %s", what, item.request_id, exc)
            return False

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Loads complete in start_load_kv, before the forward starts.
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        # Stores move all layers at once in wait_for_save, after the forward.
        return

    def wait_for_save(self) -> None:
        meta = self._metadata()
        if meta is None or not meta.stores or self._transfer is None:
            return
        for item in meta.stores:
            if self.health.is_down:
                return
            self._run_transfer("store", item)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        if self._transfer is not None:
            transfer, self._transfer = self._transfer, None
            try:
                transfer.close()
            except Exception:
                logger.debug("closing the transfer context failed", exc_info=True)
        self._client.close()

    # ==================================================================================
    # Class-level hooks
    # ==================================================================================

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        return None

    @property
    def kv_layout(self) -> EngineKVFormat | None:
        return self._layout.engine_kv_format if self._layout is not None else None
