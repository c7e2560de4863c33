"""The worker side of ``LMCacheMPConnector``: registers the paged KV cache, moves blocks.

Loads marked ``async_load`` run on a background thread (:mod:`.async_loads`) and are
reported through ``get_finished``; the others finish in ``start_load_kv``, before the
forward that needs them.  Stores finish inside ``wait_for_save``, so vLLM may free a
finished request's blocks at once.

Registration follows the server: when the server is not there yet, the KV cache is
registered once it appears; when it restarts (a new incarnation, or a server that no
longer knows this worker's instance id), the worker registers again.  A transfer that
fails meanwhile is a miss: a load failure is reported to vLLM, which recomputes the blocks.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import torch

from lmcache.integration.vllm.async_loads import AsyncLoader
from lmcache.integration.vllm.mp_client import ServerLink
from lmcache.integration.vllm.mp_config import MPConnectorConfig
from lmcache.integration.vllm.scheduler_state import LMCacheMPRequestMetadata, blocks_of_range
from lmcache.integration.vllm.stats_recorder import StatsRecorder
from lmcache.integration.vllm.vllm_kv_layout import DetectedLayout, transfer_views
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.worker.client import ServerUnavailableError
from lmcache.v1.platform.ops_types import EngineKVFormat
from lmcache.v1.platform.transfer_mode import MPTransferMode

logger = logging.getLogger(__name__)

# A live server moves a chunk in milliseconds; this bounds one load or store.
TRANSFER_TIMEOUT_S = 30.0


def tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except (AssertionError, ImportError, RuntimeError):
        return 0


class WorkerSide:
    """One TP rank's KV cache, connected to the server through ``link``."""

    def __init__(
        self,
        link: ServerLink,
        config: MPConnectorConfig,
        model_name: str,
        world_size: int,
        block_size: int,
        rank: int | None = None,
    ) -> None:
        """``world_size`` and ``rank``: the workers this server sees and this one's place
        among them (rank placement gives each server a block of the TP ranks); ``rank``
        None = vLLM's TP rank, read when the KV cache registers."""
        self.link = link
        self._fixed_rank = rank
        self.config = config
        self.model_name = model_name
        self.world_size = world_size
        self.block_size = block_size
        self.layout: DetectedLayout | None = None
        self._views: dict[str, torch.Tensor] = {}
        self._mode = MPTransferMode.AUTO
        self._transfer: Any = None
        self._rank = 0
        self._instance_id = 0
        self._load_errors: set[int] = set()
        self.stats = StatsRecorder()
        self._bytes_per_token = 0  # this rank's KV bytes per token, for the metrics
        self._async_loads = AsyncLoader(self._load_one)
        # Held by transfers and by (re-)registration, which may remap the server's pool.
        self._lock = threading.Lock()

    # -- registration -------------------------------------------------------------------------

    def register_kv_caches(
        self, kv_caches: dict[str, torch.Tensor], num_kv_heads: int, head_size: int
    ) -> None:
        from lmcache.v1.multiprocess.worker.kv_cache_worker import new_instance_id

        views, layout = transfer_views(kv_caches, self.block_size, num_kv_heads, head_size)
        self._mode = self._resolve_mode(views)
        if (
            self._mode == MPTransferMode.LMCACHE_DRIVEN
            and layout.num_blocks
            and next(iter(kv_caches.values())).device.type == "cpu"
        ):
            from lmcache.integration.vllm.cpu_shm_remap import remap_kv_caches_to_shm

            remap_kv_caches_to_shm(list(kv_caches.values()))
        self._rank = tp_rank() if self._fixed_rank is None else self._fixed_rank
        self._instance_id = new_instance_id()
        self.layout = layout
        self._views = views
        self._bytes_per_token = _bytes_per_token(views, layout)
        self.link.add_listener(self._on_new_server)
        if self.link.guarded is not None:
            self._register_first_time()
        else:
            logger.info("LMCache worker: the KV cache registers once the server is reachable")
        # Only now: a heartbeat pinging an id not yet registered would register it twice.
        self.link.keep_alive(self._instance_id)

    def _register_first_time(self) -> None:
        from lmcache.v1.multiprocess.transfer_context.worker_transfer import (
            create_transfer_context,
        )

        chunk_size = self.link.chunk_size
        if self.link.guarded is None or chunk_size is None:
            raise ServerUnavailableError("not connected")
        with self._lock:
            self._transfer = create_transfer_context(
                self._views,
                instance_id=self._instance_id,
                req_client=self.link.guarded.client,
                mode=self._mode,
            )
            self._transfer.register(
                self._views,
                self.model_name,
                self.world_size,
                chunk_size // self.block_size,
                self.config.mq_timeout,
            )
            # mq_timeout (long) bounds start-up; every later call (loads, stores,
            # re-registration) is bounded by the transfer timeout instead.
            self.link.guarded.client.timeout = min(self.config.mq_timeout, TRANSFER_TIMEOUT_S)
        assert self.layout is not None
        logger.info(
            "LMCacheMPConnector worker rank %d/%d registered %d layers (%s, %s) in %s mode",
            self._rank,
            self.world_size,
            len(self._views),
            self.layout.engine_kv_format.name,
            str(self.layout.dtype).removeprefix("torch."),
            getattr(self._transfer, "mode", self._mode).value,
        )

    def _on_new_server(self) -> None:
        """Heartbeat listener: register with a server that does not know this worker."""
        if not self._views:
            return
        if self._transfer is None:
            self._register_first_time()
            return
        client = self.link.guarded.client if self.link.guarded is not None else None
        if client is not None and client.ping(self._instance_id):
            return  # still registered (the outage was the network's, not a restart)
        with self._lock:
            self._transfer.register_again()
        logger.info("LMCache worker rank %d registered again", self._rank)

    def _resolve_mode(self, views: dict[str, torch.Tensor]) -> MPTransferMode:
        mode = self.config.mp_transfer_mode
        if mode != MPTransferMode.AUTO:
            return mode
        from lmcache.v1.platform import get_device_spec

        spec = get_device_spec(next(iter(views.values())).device.type)
        return MPTransferMode.parse(
            spec.default_mp_transfer_mode() if spec is not None else MPTransferMode.ENGINE_DRIVEN
        )

    @property
    def kv_layout(self) -> EngineKVFormat | None:
        return self.layout.engine_kv_format if self.layout is not None else None

    # -- transfers ----------------------------------------------------------------------------

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

    def load(self, loads: list[LMCacheMPRequestMetadata]) -> None:
        """Load each range (async ones in the background); a failed one joins the blocks
        vLLM must recompute."""
        for item in loads:
            if item.async_load:
                self._async_loads.submit(item)
            elif not self._load_one(item):
                self._note_load_failure(item)

    def _load_one(self, item: LMCacheMPRequestMetadata) -> bool:
        started = time.perf_counter()
        if not (self.link.ready and self._run_transfer("retrieve", item)):
            return False
        tokens = item.op.end - item.op.skip_first_n_tokens
        self.stats.observe_load(time.perf_counter() - started)
        self.stats.add(loaded_tokens=tokens, loaded_bytes=tokens * self._bytes_per_token)
        return True

    def finished_loads(self) -> set[str]:
        """Requests whose async load ended since the last call; failed ones' blocks are
        in the next ``take_load_errors``."""
        finished, failed = self._async_loads.poll()
        for item in failed:
            self._note_load_failure(item)
        return finished

    def _note_load_failure(self, item: LMCacheMPRequestMetadata) -> None:
        self.stats.add(failed_loads=1)
        op = item.op
        self._load_errors |= blocks_of_range(
            op.block_ids[0], op.skip_first_n_tokens, op.end, self.block_size
        )
        self.link.health.warn_once(
            "loading %d tokens of %s from LMCache failed; vLLM recomputes them",
            op.end - op.skip_first_n_tokens,
            item.request_id,
        )

    def store(self, stores: list[LMCacheMPRequestMetadata]) -> None:
        for item in stores:
            if not self.link.ready:
                return
            tokens = item.op.end - item.op.start
            if self._run_transfer("store", item):
                self.stats.add(stored_tokens=tokens, stored_bytes=tokens * self._bytes_per_token)
            else:
                self.stats.add(failed_stores=1)

    def _run_transfer(self, what: str, item: LMCacheMPRequestMetadata) -> bool:
        if self._transfer is None or self.link.chunk_size is None:
            return False
        op = item.op
        key = self._key(item)
        block_ids = [list(group) for group in op.block_ids]
        blocks_in_chunk = self.link.chunk_size // self.block_size
        try:
            with self._lock:
                if what == "store":
                    future = self._transfer.submit_store(
                        item.request_id, key, self._views, block_ids, None, blocks_in_chunk
                    )
                else:
                    future = self._transfer.submit_retrieve(
                        item.request_id,
                        key,
                        self._views,
                        block_ids,
                        None,
                        blocks_in_chunk,
                        op.skip_first_n_tokens,
                    )
                return bool(future.result(timeout=TRANSFER_TIMEOUT_S))
        except Exception as exc:
            if isinstance(exc, (TimeoutError, ConnectionError, ServerUnavailableError)):
                self.link.health.mark_down(f"{what}: {exc}")
            else:
                # e.g. a restarted server that does not know this worker yet.
                self.link.health.warn_once(
                    "LMCache %s for %s failed: %s", what, item.request_id, exc
                )
            return False

    @property
    def instance_id(self) -> int:
        """The id this worker registers under (0 until the KV cache registers)."""
        return self._instance_id

    @property
    def rank(self) -> int:
        """This worker's TP rank (0 until the KV cache registers)."""
        return self._rank

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def close(self) -> None:
        self._async_loads.close()
        with self._lock:
            transfer, self._transfer = self._transfer, None
        if transfer is not None:
            try:
                transfer.close()
            except Exception:
                logger.debug("closing the transfer context failed", exc_info=True)


def _bytes_per_token(views: dict[str, torch.Tensor], layout: DetectedLayout) -> int:
    """KV bytes one token takes on this rank, over all layers (K and V)."""
    slots = layout.num_blocks * layout.block_size
    if not slots:
        return 0
    total = sum(view.numel() * view.element_size() for view in views.values())
    return total // slots
