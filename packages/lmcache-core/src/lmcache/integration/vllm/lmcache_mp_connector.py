"""``LMCacheMPConnector``: vLLM's KV connector for the LMCache multiprocess cache server.

Enable it with::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "LMCacheMPConnector",
        "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"lmcache.mp.host": "tcp://localhost",
                                      "lmcache.mp.port": "5555"}}'

This class is the thin vLLM-facing shell: it parses the extra config, opens the
:class:`~lmcache.integration.vllm.mp_client.ServerLink` (with its heartbeat) and hands each
vLLM call to the side of its role, :class:`~.scheduler_side.SchedulerSide` or
:class:`~.worker_side.WorkerSide`.

The cache is best-effort: a server that is down at start-up or dies later turns lookups
into misses and stores into no-ops (one warning per outage), never an error or a hang;
when it is back (or restarted), the heartbeat re-registers the worker and the cache
resumes without restarting vLLM.

With several servers (``"lmcache.mp.server_urls": "tcp://127.0.0.1:5555,tcp://127.0.0.1:5556"``)
each prefix lives on one of them, chosen by a hash both roles compute alike, and each
server has its own link, heartbeat and sides (see :mod:`.multi_server`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from lmcache.integration.vllm.autostart import AutostartedServer, ensure_local_server
from lmcache.integration.vllm.connector_stats import (
    LMCacheMPConnectorStats,
    LMCacheMPPromMetrics,
    take_stats,
)
from lmcache.integration.vllm.kv_events import KVEventFollower, LMCacheMPKVEvents, collect
from lmcache.integration.vllm.lazy_offload import VllmBlockPool
from lmcache.integration.vllm.mp_client import HeartbeatThread, ServerLink
from lmcache.integration.vllm.mp_config import (
    MPConnectorConfig,
    kv_events_enabled,
    parse_extra_config,
)
from lmcache.integration.vllm.multi_server import (
    SchedulerRouter,
    WorkerRouter,
    check_same_chunk_size,
)
from lmcache.integration.vllm.scheduler_side import (
    LOOKUP_TIMEOUT_S,
    LMCacheMPConnectorMetadata,
    SchedulerSide,
)
from lmcache.integration.vllm.scheduler_state import LMCacheMPRequestMetadata, LoadStoreOp
from lmcache.integration.vllm.server_placement import (
    LinkGroup,
    resolve_placement,
    server_of_rank,
)
from lmcache.integration.vllm.worker_side import TRANSFER_TIMEOUT_S, WorkerSide, tp_rank
from lmcache.v1.multiprocess.worker.client import MPClientError
from lmcache.v1.platform.ops_types import EngineKVFormat

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)

__all__ = [
    "LOOKUP_TIMEOUT_S",
    "TRANSFER_TIMEOUT_S",
    "LMCacheMPConnector",
    "LMCacheMPConnectorMetadata",
    "LMCacheMPRequestMetadata",
    "LoadStoreOp",
]


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
        if self.config.lazy_offload is not None and not getattr(
            vllm_config.cache_config, "enable_prefix_caching", False
        ):
            # A deferred store is proven intact by its blocks' prefix-cache hashes.
            raise ValueError(
                "lmcache.mp.lazy_offload requires vLLM prefix caching (enable_prefix_caching)"
            )
        self.server_urls = list(self.config.server_urls)
        self.server_url = self.server_urls[0]
        self._autostarted: AutostartedServer | None = None
        if self.config.autostart:  # mp_config allows it with exactly one server
            self._autostarted = ensure_local_server(
                self.server_url,
                self.config.autostart_server_args,
                self.config.autostart_wait_timeout,
            )
        self.model_name = _model_name(vllm_config)
        self.world_size = _tp_size(vllm_config)
        self.block_size = int(vllm_config.cache_config.block_size)
        n_servers = len(self.server_urls)
        self.placement = resolve_placement(self.config.server_placement, self.world_size, n_servers)
        # The global TP rank; with rank placement a worker talks to its block's server only.
        self._tp_rank = tp_rank() if role == KVConnectorRole.WORKER else 0
        urls = self.server_urls
        self._rank_on_server: int | None = None
        if self.placement == "rank" and role == KVConnectorRole.WORKER:
            server, self._rank_on_server = server_of_rank(self._tp_rank, self.world_size, n_servers)
            urls = [self.server_urls[server]]
        # One link and heartbeat per server (see multi_server): each server's outages and
        # restarts are handled on their own.
        self.links = [
            ServerLink(
                url,
                self.config.mq_timeout,
                self.config.start_server_hint,
                self.block_size,
                curve=self.config.curve,
            )
            for url in urls
        ]
        self.link = self.links[0]
        self.health = self.link.health
        connected = [link.open(warn=False) for link in self.links]
        try:
            check_same_chunk_size(self.links)
        except ValueError:
            for link in self.links:
                link.close()
            raise
        self._scheduler, self._worker = self._routers(role)
        # Worker: held finished requests whose stores ran, for the next get_finished.
        self._stored_held: set[str] = set()
        if n_servers > 1:
            logger.info(
                "LMCacheMPConnector (%s): %d servers, %s placement%s",
                role.name.lower(),
                n_servers,
                self.placement,
                f" (this worker: {urls[0]})" if self._rank_on_server is not None else "",
            )
        self._heartbeats = [
            HeartbeatThread(link, self.config.heartbeat_interval) for link in self.links
        ]
        for heartbeat in self._heartbeats:
            heartbeat.start()
        self._enable_kv_events = kv_events_enabled(vllm_config)
        self._kv_events: list[KVCacheEvent] = []  # scheduler: gathered, awaiting take_events
        # Worker: one follower per server, each announcing the chunks that server holds.
        self._kv_event_followers: list[KVEventFollower] = []
        if self._enable_kv_events and role == KVConnectorRole.WORKER:
            self._kv_event_followers = [
                KVEventFollower(link, self.model_name) for link in self.links
            ]
        policy = getattr(self._kv_transfer_config, "kv_load_failure_policy", "recompute")
        if role == KVConnectorRole.SCHEDULER and policy != "recompute":
            # vLLM's default fails a request whose load failed; for a cache that is wrong.
            logger.warning(
                "kv_load_failure_policy is %r: a request whose KV cannot be loaded from "
                "LMCache (e.g. across a server restart) fails. Add "
                '"kv_load_failure_policy": "recompute" to --kv-transfer-config so vLLM '
                "recomputes it instead",
                policy,
            )
        for link, up in zip(self.links, connected):
            self._log_connection(role, link, up)

    def _routers(self, role: KVConnectorRole) -> tuple[SchedulerRouter, WorkerRouter]:
        """The sides of each role over ``self.links`` (see multi_server).

        Prefix placement: a scheduler and a worker side per server, routed by prefix.
        Rank placement: one scheduler side over every server (lookups take the smallest
        hit) and one worker side on this rank's server, which sees ``world_size /
        n_servers`` workers."""
        if self.placement == "prefix":
            scheduler = SchedulerRouter(
                [
                    SchedulerSide(link, self.config, self.model_name, self.world_size)
                    for link in self.links
                ],
                self.server_urls,
                self.block_size,
            )
            worker = WorkerRouter(
                [
                    WorkerSide(link, self.config, self.model_name, self.world_size, self.block_size)
                    for link in self.links
                ],
                self.server_urls,
                self.block_size,
            )
            return scheduler, worker
        server_world = self.world_size // len(self.server_urls)
        group = LinkGroup(self.links)
        scheduler = SchedulerRouter(
            [SchedulerSide(group, self.config, self.model_name, server_world)],
            [group.url],
            self.block_size,
        )
        own = self.links[0]  # a worker's only link; unused by the scheduler role
        worker_side = WorkerSide(
            own, self.config, self.model_name, server_world, self.block_size, self._rank_on_server
        )
        return scheduler, WorkerRouter([worker_side], [own.url], self.block_size)

    def _log_connection(self, role: KVConnectorRole, link: ServerLink, connected: bool) -> None:
        if connected:
            logger.info(
                "LMCacheMPConnector (%s) connected to %s: chunk size %s, block size %d, "
                "world size %d",
                role.name.lower(),
                link.url,
                link.chunk_size,
                self.block_size,
                self.world_size,
            )
        else:
            logger.warning(
                "LMCacheMPConnector (%s): the cache stays off until the server at %s answers "
                "(checked every %.1fs). Start it with:\n    %s",
                role.name.lower(),
                link.url,
                self.config.heartbeat_interval,
                self.config.start_server_hint,
            )

    @property
    def chunk_size(self) -> int | None:
        """The servers' chunk size; None until one of them answered."""
        return next((link.chunk_size for link in self.links if link.chunk_size), None)

    @property
    def requires_kv_delivery(self) -> bool:
        # A best-effort cache: a store lost to preemption is just a future miss.
        return False

    # -- scheduler side -----------------------------------------------------------------------

    def on_new_request(self, request: Request) -> None:
        self._scheduler.on_new_request(request)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        block_ids = blocks.get_block_ids() if num_external_tokens > 0 else None
        self._scheduler.update_state_after_alloc(request, num_external_tokens, block_ids)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self._scheduler.build_connector_meta(scheduler_output)

    def reset_cache(self) -> bool | None:
        """Scheduler: clear every server's cache (vLLM's ``reset_prefix_cache`` with
        ``reset_connector``); True when every server cleared, False otherwise (logged).

        ``clear`` is an admin operation: each server must run with ``--enable-admin-ops``,
        and its admin token, if it has one, is read from ``$LMCACHE_ADMIN_TOKEN`` in vLLM's
        environment.  Objects a transfer is using stay (the server's rule); requests keep
        their trackers."""
        if self._role != KVConnectorRole.SCHEDULER:
            return None
        cleared = True
        for link in self.links:
            try:
                link.run("clear", lambda client: client.clear())
            except MPClientError as exc:
                cleared = False
                code = getattr(exc, "code", "")
                hint = (
                    " (start the server with --enable-admin-ops, and give vLLM its admin "
                    "token in $LMCACHE_ADMIN_TOKEN)"
                    if code in ("forbidden", "unauthorized")
                    else ""
                )
                logger.warning("LMCache cache reset on %s failed: %s%s", link.url, exc, hint)
        if cleared:
            logger.info("LMCache cache cleared on %d server(s)", len(self.links))
        return cleared

    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        """vLLM's scheduler hands over its block pool: lazy offload reads it."""
        if self._role == KVConnectorRole.SCHEDULER:
            self._scheduler.bind_block_pool(VllmBlockPool(gpu_block_pool))

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        # True (lazy offload under pressure): vLLM keeps the blocks until get_finished
        # reports the request, after the next step stored them.
        return self._scheduler.finish(request), None

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler.finish(request), None

    # -- worker side --------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        spec = self._attention_spec()
        self._worker.register_kv_caches(kv_caches, int(spec.num_kv_heads), int(spec.head_size))

    def _attention_spec(self) -> Any:
        groups = self._kv_cache_config.kv_cache_groups if self._kv_cache_config else []
        if len(groups) != 1:
            raise ValueError(
                f"LMCacheMPConnector supports one KV-cache group, this model has {len(groups)}"
            )
        return groups[0].kv_cache_spec

    def _metadata(self) -> LMCacheMPConnectorMetadata | None:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        return meta if isinstance(meta, LMCacheMPConnectorMetadata) else None

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._metadata()
        if meta is not None and meta.loads:
            self._worker.load(meta.loads)

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
        if meta is None:
            return
        try:
            if meta.stores:
                self._worker.store(meta.stores)
        finally:
            # Reported even when a store failed: vLLM would otherwise never free them.
            self._stored_held.update(meta.held_requests)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        # Stores finish in wait_for_save, so only the finished requests whose blocks vLLM
        # kept for them are reported as sent (in this step, or the next one when vLLM
        # asks before wait_for_save, as with speculative decoding).  Async loads end here
        # too (failed ones with their blocks in get_block_ids_with_load_errors).
        sent, self._stored_held = self._stored_held, set()
        return sent or None, self._worker.finished_loads() or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_load_errors()

    # -- KV events (see kv_events.py) ---------------------------------------------------------

    def get_kv_connector_kv_cache_events(self) -> LMCacheMPKVEvents | None:
        """Worker: the server's cache changes since the last step (TP rank 0 only)."""
        if not self._kv_event_followers or self._tp_rank != 0:
            return None
        events = [event for f in self._kv_event_followers for event in f.get_kv_events()]
        if not events:
            return None
        container = LMCacheMPKVEvents(num_workers=1)
        container.add_events(events)
        return container

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        """Scheduler: keep the step's worker events for ``take_events``."""
        if self._enable_kv_events:
            collect(getattr(connector_output, "kv_cache_events", None), self._kv_events)

    def take_events(self) -> Iterable[KVCacheEvent]:
        """Scheduler: the KV events gathered since the last call, in order."""
        events, self._kv_events = self._kv_events, []
        return events

    def shutdown(self) -> None:
        for heartbeat in self._heartbeats:
            heartbeat.stop()
        self._scheduler.close()
        self._worker.close()
        for link in self.links:
            link.close()
        if self._autostarted is not None:
            self._autostarted.stop()

    # -- metrics (see connector_stats) --------------------------------------------------------

    def get_kv_connector_stats(self) -> LMCacheMPConnectorStats | None:
        """What this side recorded since vLLM last asked, over every server; None when
        nothing."""
        router = self._scheduler if self._role == KVConnectorRole.SCHEDULER else self._worker
        taken = [stats for stats in (take_stats(side.stats) for side in router.sides) if stats]
        if not taken:
            return None
        total = taken[0]
        for more in taken[1:]:
            total.aggregate(more)
        return total

    @classmethod
    def build_kv_connector_stats(
        cls, data: dict[str, Any] | None = None
    ) -> LMCacheMPConnectorStats | None:
        return LMCacheMPConnectorStats(data=dict(data)) if data else LMCacheMPConnectorStats()

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> LMCacheMPPromMetrics:
        return LMCacheMPPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # -- class-level hooks --------------------------------------------------------------------

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        return None

    @property
    def kv_layout(self) -> EngineKVFormat | None:
        return self._worker.kv_layout
