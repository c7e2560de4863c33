"""SGLang's connector to a standalone ``lmcache server`` (``sglang --enable-lmcache``).

SGLang 0.5.23's ``LMCacheUnifiedRadixCache`` builds one :class:`UnifiedLMCacheMPConnector`
per scheduler (TP x PP rank) with ``--lmcache-config-file cfg.yaml`` (``mp_host``,
``mp_port``; ``extra_config`` keys ``lmcache.mp.*`` as upstream reads them) and drives it
through lookup -> load -> store, with upstream LMCache 0.5.6's names and semantics.

How it maps onto lmcache-core:

* the KV cache is SGLang's token pool: one ``[slots, NH, HS]`` tensor per K and per V
  plane of every layer, slot 0..page_size-1 being SGLang's padding page.  Each plane is
  registered as a ``[pages, page_size, NH*HS]`` view (no copy) with upstream's
  ``layout_hints={"kv_list_layout": "unified"}`` and ``EngineType.SGLANG``: the server's
  chunk is then every K plane before every V plane, the bytes of a vLLM chunk;
* transfers go through :mod:`lmcache.v1.multiprocess.transfer_context` (the mode the KV
  device's backend defaults to, or ``lmcache.mp.mp_transfer_mode``), so any registered
  device backend serves them.  They finish inside ``submit_load`` / ``submit_store``:
  the operations SGLang polls are already done;
* the server connection is :class:`lmcache.integration.vllm.mp_client.ServerLink` with its
  heartbeat: a server that dies costs misses (lookups answer 0, loads and stores fail and
  SGLang recomputes), and one that comes back gets the KV cache registered again.

Only full-attention models (one ``FULL`` tree component; MHA or MLA pools) are served:
sliding-window (SWA) and Mamba components raise ``NotImplementedError`` at start.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from lmcache.integration.sglang.lmcache_mp_metadata import (
    LMCacheLoadOperation,
    LMCacheLookupOperation,
    LMCacheStoreOperation,
)
from lmcache.integration.vllm.mp_client import HeartbeatThread, ServerLink
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.multiprocess.transfer_context.base import QueryableFuture
from lmcache.v1.multiprocess.wire.custom_types import EngineType, IPCCacheServerKey
from lmcache.v1.multiprocess.worker.client import MPClientError, ServerUnavailableError
from lmcache.v1.platform.transfer_mode import MPTransferMode

logger = logging.getLogger(__name__)

DEFAULT_MQ_TIMEOUT_S = 300.0
DEFAULT_HEARTBEAT_INTERVAL_S = 10.0
# A live server answers a lookup or a lock release in milliseconds.
CONTROL_TIMEOUT_S = 5.0
# ... and moves a chunk in milliseconds; this bounds one load or store.
TRANSFER_TIMEOUT_S = 30.0
UNIFIED_LAYOUT_HINTS = {"kv_list_layout": "unified"}


def _done(value: Any) -> QueryableFuture[Any]:
    future: QueryableFuture[Any] = QueryableFuture()
    future.set_result(value)
    return future


def server_url(config: LMCacheEngineConfig) -> str:
    """``tcp://host:port`` from the config's ``mp_host`` / ``mp_port``."""
    if not config.mp_host:
        raise ValueError(
            "the LMCache config must set mp_host (the lmcache server's host) for SGLang; "
            "pass it with --lmcache-config-file or LMCACHE_CONFIG_FILE"
        )
    host = str(config.mp_host)
    if "://" not in host:
        host = f"tcp://{host}"
    return f"{host.rstrip(':/')}:{int(config.mp_port)}"


def plane_views(kv_pool: Any, page_size: int) -> tuple[list[torch.Tensor], bool]:
    """SGLang's KV pool as page views ``[pages, page_size, width]``, K planes first; and
    whether it is an MLA pool (one latent plane per layer)."""
    kv_buffer = getattr(kv_pool, "kv_buffer", None)
    if kv_buffer is not None:
        planes, mla = list(kv_buffer), True
    else:
        k_buffer = getattr(kv_pool, "k_buffer", None)
        v_buffer = getattr(kv_pool, "v_buffer", None)
        if not k_buffer or not v_buffer or len(k_buffer) != len(v_buffer):
            raise NotImplementedError(
                f"LMCache cannot read SGLang KV pool {type(kv_pool).__name__}: it has neither "
                "kv_buffer (MLA) nor matching k_buffer/v_buffer lists"
            )
        planes, mla = [*k_buffer, *v_buffer], False
    views = []
    for plane in planes:
        if plane.dim() < 2 or plane.shape[0] % page_size or not plane.is_contiguous():
            raise NotImplementedError(
                f"LMCache needs contiguous SGLang KV planes whose slot count is a multiple of "
                f"the page size {page_size}; got shape {tuple(plane.shape)}"
            )
        views.append(plane.view(plane.shape[0] // page_size, page_size, -1))
    if any(v.device != views[0].device or v.dtype != views[0].dtype for v in views):
        raise ValueError("SGLang's KV planes must share one device and dtype")
    return views, mla


def slots_to_pages(slots: torch.Tensor, page_size: int) -> list[int]:
    """Page ids of token slots that fill whole, page-aligned pages (SGLang allocates KV by
    pages, so a run of ``page_size`` slots starting at a multiple of it is one page); the
    all-zero padding page stands for a page nobody reads."""
    if slots.numel() % page_size:
        raise ValueError(f"{slots.numel()} slots do not fill whole pages of {page_size}")
    if slots.numel() == 0:
        return []
    pages = slots.detach().to(device="cpu", dtype=torch.int64).reshape(-1, page_size)
    first = pages[:, :1]
    expected = first + torch.arange(page_size, dtype=torch.int64)
    padding = (pages == 0).all(dim=1)
    whole = (pages == expected).all(dim=1) & (first[:, 0] % page_size == 0)
    if not bool((whole | padding).all()):
        raise ValueError("LMCache needs SGLang slots that form whole, page-aligned pages")
    return (first[:, 0] // page_size).tolist()


class UnifiedLMCacheMPConnector:
    """One SGLang scheduler's KV cache, connected to the LMCache server."""

    def __init__(
        self,
        *,
        config_file: str | None,
        model_config: Any,
        tp_size: int,
        tp_rank: int,
        tp_group: Any,
        pp_size: int = 1,
        pp_rank: int = 0,
        pp_group: Any = None,
        page_size: int,
        token_to_kv_pool_allocator: Any,
        req_to_token_pool: Any,
        tree_components: tuple[Any, ...],
        mamba_component: Any,
        sliding_window_size: int | None,
    ) -> None:
        del req_to_token_pool  # only Mamba state lives there
        _check_full_attention_only(tree_components, mamba_component, sliding_window_size)
        if not (0 <= tp_rank < tp_size and 0 <= pp_rank < pp_size):
            raise ValueError(f"bad SGLang ranks: TP {tp_rank}/{tp_size}, PP {pp_rank}/{pp_size}")
        if (tp_size > 1 and tp_group is None) or (pp_size > 1 and pp_group is None):
            raise ValueError("LMCache needs SGLang's CPU process groups for TP>1 or PP>1")
        self.tp_size, self.tp_rank, self.pp_size, self.pp_rank = tp_size, tp_rank, pp_size, pp_rank
        self.tp_group, self.pp_group = tp_group, pp_group
        self.page_size = int(page_size)
        self.kv_world_size = tp_size * pp_size
        self.kv_worker_id = pp_rank * tp_size + tp_rank
        self._lookup_leader = tp_rank == 0 and pp_rank == 0

        config = LMCacheEngineConfig.load(config_file)
        self.server_url = server_url(config)
        self._mq_timeout = float(
            config.get_extra_config_value("lmcache.mp.mq_timeout", DEFAULT_MQ_TIMEOUT_S)
        )
        self._heartbeat_interval = float(
            config.get_extra_config_value(
                "lmcache.mp.heartbeat_interval", DEFAULT_HEARTBEAT_INTERVAL_S
            )
        )
        self._mode_setting = config.get_extra_config_value("lmcache.mp.mp_transfer_mode", None)
        self.model_name = str(getattr(model_config, "model_path", "") or "sglang-model")

        self._views, self.mla_enabled = plane_views(
            token_to_kv_pool_allocator.get_kvcache(), self.page_size
        )
        self.device = self._views[0].device
        self._kv_caches = {f"kv_{i}": view for i, view in enumerate(self._views)}

        self._link = ServerLink(self.server_url, self._mq_timeout, "lmcache server", page_size)
        if not self._link.open(timeout=self._mq_timeout):
            raise RuntimeError(
                f"cannot reach the LMCache server at {self.server_url} "
                f"({self._link.health.last_error}); start `lmcache server` first"
            )
        assert self._link.chunk_size is not None
        self.chunk_size = int(self._link.chunk_size)
        self.blocks_in_chunk = self.chunk_size // self.page_size

        from lmcache.v1.multiprocess.worker.kv_cache_worker import new_instance_id

        self.instance_id = new_instance_id()
        self._transfer: Any = None
        self._transfer_lock = threading.Lock()
        self._lookups: dict[str, LMCacheLookupOperation] = {}
        self._active_sessions: set[str] = set()
        self._store_submitted_tokens: dict[str, int] = {}
        self._closed = False
        self.register_kv_cache()
        self._link.add_listener(self._on_new_server)
        self._link.keep_alive(self.instance_id)
        self._heartbeat = HeartbeatThread(self._link, self._heartbeat_interval)
        self._heartbeat.start()
        logger.info(
            "LMCache connector for SGLang rank %d/%d: %d KV planes, chunk %d tokens, %s",
            self.kv_worker_id,
            self.kv_world_size,
            len(self._views),
            self.chunk_size,
            self.server_url,
        )

    # -- registration -------------------------------------------------------------------------

    def _transfer_mode(self) -> MPTransferMode:
        if self._mode_setting:
            return MPTransferMode.parse(str(self._mode_setting))
        from lmcache.v1.platform import get_device_spec

        spec = get_device_spec(self.device.type)
        return MPTransferMode.parse(
            spec.default_mp_transfer_mode() if spec is not None else MPTransferMode.ENGINE_DRIVEN
        )

    def register_kv_cache(self) -> None:
        """Register the KV planes with the server through a transfer context."""
        from lmcache.v1.multiprocess.transfer_context.worker_transfer import (
            create_transfer_context,
        )

        guarded = self._link.guarded
        if guarded is None:
            raise RuntimeError(f"not connected to the LMCache server at {self.server_url}")
        with self._transfer_lock:
            if self._transfer is not None:
                raise RuntimeError("LMCache KV tensors are already registered")
            transfer = create_transfer_context(
                self._kv_caches,
                instance_id=self.instance_id,
                req_client=guarded.client,
                mode=self._transfer_mode(),
            )
            transfer.register(
                self._kv_caches,
                self.model_name,
                self.kv_world_size,
                self.blocks_in_chunk,
                self._mq_timeout,
                layout_hints=dict(UNIFIED_LAYOUT_HINTS),
                engine_type=EngineType.SGLANG,
            )
            self._transfer = transfer
        # The long mq_timeout bounds start-up only; every later call is bounded tighter.
        guarded.client.timeout = min(self._mq_timeout, TRANSFER_TIMEOUT_S)

    def _on_new_server(self) -> None:
        """Heartbeat listener: a server that does not know this instance gets it again."""
        guarded = self._link.guarded
        if guarded is not None and guarded.client.ping(self.instance_id):
            return
        with self._transfer_lock:
            if self._transfer is not None:
                self._transfer.register_again()
        logger.info("LMCache connector rank %d registered again", self.kv_worker_id)

    # -- small API SGLang reads -----------------------------------------------------------------

    @property
    def is_lookup_leader(self) -> bool:
        return self._lookup_leader

    @property
    def is_kv_writer(self) -> bool:
        return True

    @property
    def operation_timeout(self) -> float:
        return self._mq_timeout

    @staticmethod
    def build_cache_salt(cache_salt: str | None, extra_key: str | None) -> str:
        """One tenant namespace from SGLang's ``cache_salt`` and ``extra_key`` (LoRA id
        and the like): the salt alone when there is no extra key, else a digest of both."""
        if not extra_key:
            return cache_salt or ""
        return hashlib.sha256(f"{cache_salt or ''}\0{extra_key}".encode()).hexdigest()

    def aligned_swa_window_size(self) -> int:
        return 0  # no sliding-window component is served (checked at start)

    def reset_mamba_checkpoint_metadata(self, indices: torch.Tensor) -> None:
        del indices  # no Mamba component is served (checked at start)

    def device_indices_by_group(
        self,
        full_indices: torch.Tensor,
        *,
        mamba_value: torch.Tensor | None = None,
        mamba_transfer_tokens: int | None = None,
    ) -> list[torch.Tensor]:
        """The slots of each registered group: the one full-attention group."""
        del mamba_transfer_tokens
        if mamba_value is not None:
            raise NotImplementedError("LMCache does not serve SGLang's Mamba state")
        return [full_indices]

    # -- TP x PP agreement --------------------------------------------------------------------

    def parallel_all_reduce(self, tensor: torch.Tensor, op: Any) -> None:
        """Reduce ``tensor`` over the TP group, then the PP group (every scheduler ends with
        the same value)."""
        if self.tp_size > 1:
            dist.all_reduce(tensor, op=op, group=self.tp_group)
        if self.pp_size > 1:
            dist.all_reduce(tensor, op=op, group=self.pp_group)

    def _agree(self, value: int, op: Any) -> int:
        tensor = torch.tensor([value], dtype=torch.int64)
        self.parallel_all_reduce(tensor, op)
        return int(tensor.item())

    def _all_succeeded(self, success: bool) -> bool:
        return bool(self._agree(int(success), dist.ReduceOp.MIN))

    def ready_prefix_count(
        self, operations: Sequence[LMCacheLoadOperation | LMCacheStoreOperation]
    ) -> int:
        """How many leading operations every rank has finished."""
        count = 0
        for operation in operations:
            if not operation.query():
                break
            count += 1
        return self._agree(count, dist.ReduceOp.MIN)

    # -- keys -----------------------------------------------------------------------------------

    def _key(
        self, operation: LMCacheLookupOperation, start: int, end: int, worker_id: int | None
    ) -> IPCCacheServerKey:
        return IPCCacheServerKey.from_token_ids(
            self.model_name,
            self.kv_world_size,
            worker_id,
            operation.token_ids,
            start=start,
            end=end,
            request_id=operation.request_id,
            cache_salt=operation.cache_salt,
        )

    def _aligned(self, tokens: int) -> int:
        return tokens // self.chunk_size * self.chunk_size

    # -- lookup ---------------------------------------------------------------------------------

    def submit_lookup(
        self, request_id: str, token_ids: list[int], *, local_hit_tokens: int, cache_salt: str
    ) -> LMCacheLookupOperation:
        """Ask the server for the longest stored prefix (the leader asks; the answer is
        read by :meth:`poll_lookup`).  A server that cannot be asked is a miss."""
        operation = LMCacheLookupOperation(
            request_id, list(token_ids), int(local_hit_tokens), cache_salt
        )
        self._lookups[request_id] = operation
        aligned_end = self._aligned(len(token_ids))
        if aligned_end == 0:
            operation.total_hit_tokens = 0
            return operation
        sent = True
        if self._lookup_leader:
            key = self._key(operation, 0, aligned_end, None)
            sent = self._control("lookup", key, self.kv_world_size)
            operation.submission_future = _done(sent)
        if self._all_succeeded(sent):
            self._active_sessions.add(request_id)
        else:
            operation.total_hit_tokens = 0
        return operation

    def poll_lookup(self, operation: LMCacheLookupOperation) -> int | None:
        """Tokens the server holds for the request (chunk-aligned), or None while its
        prefetch still runs; the hit's chunks stay read-locked until loaded or freed."""
        if operation.total_hit_tokens is not None:
            return operation.total_hit_tokens
        answer = -1
        if self._lookup_leader:
            answer = self._prefetch_status(operation.request_id)
        answer = self._agree(answer, dist.ReduceOp.MAX)
        if answer < 0:
            return None
        hit = min(answer * self.chunk_size, self._aligned(len(operation.token_ids)))
        operation.total_hit_tokens = hit
        operation.locks_held = hit > 0
        # The server holds this prefix already: later stores only need what follows it.
        if hit > self._store_submitted_tokens.get(operation.request_id, 0):
            self._store_submitted_tokens[operation.request_id] = hit
        return hit

    def _prefetch_status(self, request_id: str) -> int:
        """Matched chunks, -1 while the prefetch runs, 0 when the server cannot answer."""
        try:
            chunks = self._link.run(
                "query_prefetch_status",
                lambda c: c.call("query_prefetch_status", request_id, timeout=CONTROL_TIMEOUT_S),
            )
        except (MPClientError, TimeoutError, ConnectionError) as exc:
            logger.debug("lookup of %s failed (%s): a miss", request_id, exc)
            return 0
        return -1 if chunks is None else int(chunks)

    def _control(self, operation: str, *payloads: Any) -> bool:
        """One control call; False (and logged at DEBUG) when the server cannot take it."""
        try:
            self._link.run(
                operation, lambda c: c.call(operation, *payloads, timeout=CONTROL_TIMEOUT_S)
            )
        except (MPClientError, TimeoutError, ConnectionError) as exc:
            logger.debug("LMCache %s failed: %s", operation, exc)
            return False
        return True

    def free_lookup_locks(self, request_id: str, start: int, end: int) -> None:
        """Release the read locks of ``[start, end)`` of a lookup's hit (front to back)."""
        operation = self._lookups.get(request_id)
        if operation is None or not operation.locks_held:
            return
        if operation.total_hit_tokens is None:
            raise RuntimeError(f"the LMCache lookup of {request_id} has not completed")
        if start != operation.lock_start:
            raise RuntimeError(
                f"LMCache locks of {request_id} are held from token {operation.lock_start}, "
                f"not {start}"
            )
        end = min(end, operation.total_hit_tokens)
        if end <= start:
            return
        if self._lookup_leader:
            self._control(
                "free_lookup_locks", self._key(operation, start, end, None), self.kv_world_size
            )
        operation.lock_start = end
        if end == operation.total_hit_tokens:
            operation.locks_held = False
            self._lookups.pop(request_id, None)

    # -- load -----------------------------------------------------------------------------------

    def submit_load(
        self,
        operation: LMCacheLookupOperation,
        device_indices: list[torch.Tensor] | torch.Tensor,
        *,
        local_hit_tokens: int,
        owned_device_indices: torch.Tensor | None = None,
        producer_stream: Any = None,
    ) -> LMCacheLoadOperation:
        """Load the hit's tokens after ``local_hit_tokens`` into ``device_indices`` (slots
        SGLang allocated for them).  The transfer ends before this returns."""
        del producer_stream  # the transfer is complete on return: nothing to order after
        if operation.total_hit_tokens is None or not operation.locks_held:
            raise RuntimeError("an LMCache load needs a completed lookup that holds its locks")
        indices = self._one_group(device_indices)
        total_hit = operation.total_hit_tokens
        start = self._aligned(local_hit_tokens)
        prefix_pad = local_hit_tokens - start
        if indices.numel() != total_hit - local_hit_tokens:
            raise ValueError(
                f"LMCache load of {operation.request_id}: {indices.numel()} slots for "
                f"{total_hit - local_hit_tokens} tokens"
            )
        if prefix_pad % self.page_size:
            raise ValueError("SGLang's local hit must end on a page boundary")
        # The chunk's pages SGLang already holds are skipped: page 0 stands in for them.
        pages = [0] * (prefix_pad // self.page_size) + slots_to_pages(indices, self.page_size)
        key = self._key(operation, start, total_hit, self.kv_worker_id)
        ok = self._run_transfer("retrieve", operation.request_id, key, pages, prefix_pad)
        return LMCacheLoadOperation(
            request_id=operation.request_id,
            token_ids=operation.token_ids,
            start=start,
            end=total_hit,
            local_hit_tokens=local_hit_tokens,
            device_indices=indices if owned_device_indices is None else owned_device_indices,
            future=_done(ok),
            lookup=operation,
        )

    def prepare_load_on_stream(self, operation: LMCacheLoadOperation, stream: Any) -> bool:
        """Whether every rank's load succeeded (the data is in place: nothing to order on
        ``stream``).  A failed load releases its lookup; SGLang recomputes the tokens."""
        del stream
        if self._all_succeeded(bool(operation.future.result())):
            return True
        operation.lookup.locks_held = False
        operation.result = False
        self._forget_lookup(operation.lookup)
        return False

    def complete_load(self, operation: LMCacheLoadOperation, *, synchronize: bool = True) -> bool:
        if operation.result is not None:
            return operation.result
        success = bool(operation.future.result())
        if synchronize:
            success = self._all_succeeded(success)
        # The server released the retrieved chunks' locks when the retrieve finished.
        operation.lookup.locks_held = False
        operation.result = success
        self._forget_lookup(operation.lookup)
        return success

    def _forget_lookup(self, operation: LMCacheLookupOperation) -> None:
        if self._lookups.get(operation.request_id) is operation:
            del self._lookups[operation.request_id]

    # -- store ----------------------------------------------------------------------------------

    def get_store_start(self, request_id: str, end: int) -> int:
        """The first token of ``[0, end)`` not yet stored for the request (chunk-aligned)."""
        aligned_end = self._aligned(end)
        return self._aligned(min(self._store_submitted_tokens.get(request_id, 0), aligned_end))

    def submit_store(
        self,
        request_id: str,
        token_ids: list[int],
        device_indices: list[torch.Tensor] | torch.Tensor,
        *,
        device_indices_start: int,
        cache_salt: str,
    ) -> LMCacheStoreOperation | None:
        """Store the request's whole chunks not stored yet; ``device_indices`` are the slots
        of tokens from ``device_indices_start`` on.  None when there is nothing new."""
        aligned_end = self._aligned(len(token_ids))
        start = self.get_store_start(request_id, aligned_end)
        if aligned_end <= start:
            return None
        if (
            device_indices_start < 0
            or device_indices_start > start
            or (device_indices_start % self.chunk_size)
        ):
            raise ValueError(
                f"LMCache store of {request_id}: device_indices_start {device_indices_start} "
                f"must be chunk-aligned and within [0, {start}]"
            )
        indices = self._one_group(device_indices)
        if indices.numel() < aligned_end - device_indices_start:
            raise ValueError(
                f"LMCache store of {request_id}: {indices.numel()} slots cannot cover tokens "
                f"[{device_indices_start}, {aligned_end})"
            )
        slots = indices[start - device_indices_start : aligned_end - device_indices_start]
        pages = slots_to_pages(slots, self.page_size)
        ok = False
        if 0 not in pages:  # a padding page has no KV to store
            lookup = LMCacheLookupOperation(request_id, list(token_ids), 0, cache_salt)
            key = self._key(lookup, start, aligned_end, self.kv_worker_id)
            ok = self._run_transfer("store", request_id, key, pages, 0)
        if self._agree(int(ok), dist.ReduceOp.MAX):
            self._active_sessions.add(request_id)
        self._store_submitted_tokens[request_id] = aligned_end
        return LMCacheStoreOperation(request_id, start, aligned_end, _done(ok))

    def complete_store(self, operation: LMCacheStoreOperation, *, synchronize: bool = True) -> bool:
        if operation.result is not None:
            return operation.result
        success = bool(operation.future.result())
        operation.result = self._all_succeeded(success) if synchronize else success
        if not operation.result and (
            self._store_submitted_tokens.get(operation.request_id) == operation.end
        ):
            # A later store of the same request retries the failed range.
            self._store_submitted_tokens[operation.request_id] = operation.start
        return operation.result

    # -- transfers ------------------------------------------------------------------------------

    @staticmethod
    def _one_group(device_indices: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        if isinstance(device_indices, torch.Tensor):
            return device_indices
        if len(device_indices) != 1:
            raise ValueError(f"expected the slots of 1 KV group, got {len(device_indices)}")
        return device_indices[0]

    def _run_transfer(
        self, what: str, request_id: str, key: IPCCacheServerKey, pages: list[int], skip: int
    ) -> bool:
        """One store or retrieve; False (a miss, logged once per outage) on any failure."""
        if not self._link.ready:
            return False
        try:
            with self._transfer_lock:
                if self._transfer is None:
                    return False
                if what == "store":
                    future = self._transfer.submit_store(
                        request_id, key, self._kv_caches, [pages], None, self.blocks_in_chunk
                    )
                else:
                    future = self._transfer.submit_retrieve(
                        request_id,
                        key,
                        self._kv_caches,
                        [pages],
                        None,
                        self.blocks_in_chunk,
                        skip_first_n_tokens=skip,
                    )
                return bool(future.result(timeout=TRANSFER_TIMEOUT_S))
        except Exception as exc:
            if isinstance(exc, (TimeoutError, ConnectionError, ServerUnavailableError)):
                self._link.health.mark_down(f"{what}: {exc}")
            else:
                self._link.health.warn_once("LMCache %s for %s failed: %s", what, request_id, exc)
            return False

    # -- sessions and shutdown ------------------------------------------------------------------

    def end_session(self, request_id: str) -> None:
        """Tell the server the request's lookup/store session is over."""
        was_active = request_id in self._active_sessions
        self._active_sessions.discard(request_id)
        self._lookups.pop(request_id, None)
        if was_active and self._lookup_leader and self._link.ready:
            self._control("end_session", request_id)

    def finish_request(self, request_id: str) -> None:
        self.end_session(request_id)
        self._store_submitted_tokens.pop(request_id, None)

    def end_all_sessions(self) -> None:
        for request_id in list(self._active_sessions):
            self.end_session(request_id)

    def clear(self) -> bool:
        """Drop everything the server stores (SGLang's ``/flush_cache``)."""
        ok = True
        if self._lookup_leader:
            try:
                self._link.run("clear", lambda c: c.clear())
            except (MPClientError, TimeoutError, ConnectionError) as exc:
                logger.warning("clearing the LMCache server failed: %s", exc)
                ok = False
        return self._all_succeeded(ok)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.end_all_sessions()
        self._heartbeat.stop()
        self._heartbeat.join(timeout=max(1.0, min(self._heartbeat_interval, 10.0)))
        with self._transfer_lock:
            transfer, self._transfer = self._transfer, None
        if transfer is not None and self._link.ready:
            try:
                transfer.close()
            except Exception:
                logger.debug("closing the transfer context failed", exc_info=True)
        self._link.close()


def _check_full_attention_only(
    tree_components: tuple[Any, ...], mamba_component: Any, sliding_window_size: int | None
) -> None:
    names = [str(getattr(c, "name", c)) for c in tree_components]
    if mamba_component is not None or sliding_window_size not in (None, -1) or names != ["FULL"]:
        raise NotImplementedError(
            "LMCache serves SGLang models with full attention only (tree components "
            f"{names}, sliding window {sliding_window_size}, Mamba "
            f"{mamba_component is not None}); hybrid SWA/Mamba models are not supported yet"
        )
