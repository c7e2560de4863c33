"""The scheduler side of ``LMCacheMPConnector``: lookups, and each step's loads and stores.

For every request it asks the server (one lookup; with ``nonblocking_lookup_status`` sent
and polled by :mod:`.lookup_thread`, so the scheduler thread never waits on the network)
how long a stored prefix it has, tells vLLM how many tokens it may skip (to be loaded
asynchronously, by default), and after each step writes into the connector metadata which
token ranges the workers load and store.  The pure bookkeeping lives in
:mod:`.scheduler_state`.

A lookup sent to a server incarnation that has since died is never answered by its
successor (the session is gone): a request whose lookup belongs to an older
``ServerLink.generation``, or that waited longer than ``LOOKUP_TIMEOUT_S``, is a miss.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from lmcache.integration.vllm.lazy_offload import (
    BlockPoolView,
    LazyOffloadQueue,
    step_signals,
)
from lmcache.integration.vllm.lookup_thread import LOOKUP_FAILED, LookupThread
from lmcache.integration.vllm.mp_client import ServerLink
from lmcache.integration.vllm.mp_config import MPConnectorConfig
from lmcache.integration.vllm.scheduler_state import (
    LMCacheMPRequestMetadata,
    LMCacheMPRequestState,
    LMCacheMPRequestTracker,
    LoadStoreOp,
    load_op,
    store_range,
    usable_hit_tokens,
)
from lmcache.integration.vllm.stats_recorder import StatsRecorder
from lmcache.v1.multiprocess.wire.chunking import hit_chunks_to_tokens
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.worker.client import MPClientError

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

    from lmcache.integration.vllm.server_placement import LinkGroup

logger = logging.getLogger(__name__)

# A live server answers a lookup in milliseconds.
LOOKUP_TIMEOUT_S = 5.0


@dataclasses.dataclass
class LMCacheMPConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's work for the workers: loads before the forward, stores after it."""

    loads: list[LMCacheMPRequestMetadata] = dataclasses.field(default_factory=list)
    stores: list[LMCacheMPRequestMetadata] = dataclasses.field(default_factory=list)
    # Finished requests whose blocks vLLM keeps for this step's stores (lazy offload
    # under pressure): the workers report them in get_finished once the stores ran.
    held_requests: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Lookup:
    """When, and to which server incarnation, a request's lookup went."""

    generation: int
    sent_at: float


class SchedulerSide:
    """Per-request lookup and load/store planning (one per scheduler)."""

    def __init__(
        self,
        link: ServerLink | LinkGroup,
        config: MPConnectorConfig,
        model_name: str,
        world_size: int,
    ) -> None:
        self.link = link
        self.config = config
        self.model_name = model_name
        self.world_size = world_size
        self._trackers: dict[str, LMCacheMPRequestTracker] = {}
        self._requests: dict[str, Request] = {}
        self._lookups: dict[str, _Lookup] = {}
        self.stats = StatsRecorder()
        # Requests parked by vLLM for an async load whose load is not yet planned.
        self._async_to_plan: set[str] = set()
        self._lookup_thread = LookupThread(link, world_size, LOOKUP_TIMEOUT_S)
        # lmcache.mp.lazy_offload: stores buffered until a policy releases them.
        self.lazy: LazyOffloadQueue | None = None
        self._warned_no_block_pool = False
        self._lazy_reported: dict[str, int] = {}  # counter totals already in self.stats
        # Stores released as their request finished, for the next step (blocks held).
        self._finish_stores: list[LMCacheMPRequestMetadata] = []
        if config.lazy_offload is not None:
            self.lazy = LazyOffloadQueue(config.lazy_offload, link.block_size)

    def bind_block_pool(self, pool: BlockPoolView) -> None:
        """vLLM's scheduler block pool, which lazy offload reads (hashes, free queue)."""
        if self.lazy is not None:
            self.lazy.pool = pool

    # -- lookups ------------------------------------------------------------------------------

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
            if self.lazy is not None:
                self.lazy.on_new_request(request.request_id)
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

    def _lookup_lost(self, request_id: str) -> bool:
        """The lookup went to a server incarnation that is gone, or was never answered."""
        sent = self._lookups.get(request_id)
        if sent is None:
            return False
        return (
            sent.generation != self.link.generation
            or time.monotonic() - sent.sent_at > LOOKUP_TIMEOUT_S
        )

    def _poll_lookup(self, request: Request, tracker: LMCacheMPRequestTracker) -> int | None:
        """The server's hit count, None while pending; a failure counts as a miss."""
        request_id = request.request_id
        if self.config.nonblocking_lookup_status:
            return self._poll_lookup_in_background(request, tracker)
        try:
            if not tracker.lookup_submitted:
                key = self._lookup_key(request, tracker)
                generation = self.link.generation
                self.link.run(
                    "lookup",
                    lambda c: c.call("lookup", key, self.world_size, timeout=LOOKUP_TIMEOUT_S),
                )
                tracker.lookup_submitted = True
                self._lookups[request_id] = _Lookup(generation, time.monotonic())
            # nonblocking_lookup_status=false: wait here, as upstream does in that mode.
            hit: int | None = self.link.run(
                "wait_prefetch_status",
                lambda c: c.call(
                    "wait_prefetch_status",
                    request_id,
                    LOOKUP_TIMEOUT_S,
                    timeout=2 * LOOKUP_TIMEOUT_S,
                ),
            )
        except (MPClientError, ValueError) as exc:
            logger.debug("lookup for %s failed (%s); treating as a miss", request_id, exc)
            tracker.state = LMCacheMPRequestState.BYPASS_LMCACHE
            return 0
        if hit is None:
            logger.debug("the lookup for %s was not answered in time: a miss", request_id)
            tracker.state = LMCacheMPRequestState.BYPASS_LMCACHE
            return 0
        return hit

    def _poll_lookup_in_background(
        self, request: Request, tracker: LMCacheMPRequestTracker
    ) -> int | None:
        """``_poll_lookup`` without touching the network: the lookup thread does that."""
        request_id = request.request_id
        if not tracker.lookup_submitted:
            self._lookup_thread.submit(request_id, self._lookup_key(request, tracker))
            tracker.lookup_submitted = True
            self._lookups[request_id] = _Lookup(self.link.generation, time.monotonic())
        hit = self._lookup_thread.result(request_id)
        if hit is None and not self._lookup_lost(request_id):
            return None
        if hit is None or hit == LOOKUP_FAILED:
            logger.debug("the lookup for %s failed or was lost: a miss", request_id)
            tracker.state = LMCacheMPRequestState.BYPASS_LMCACHE
            return 0
        return hit

    def on_new_request(self, request: Request) -> None:
        if self.config.eager_prefetch and self.link.ready:
            self._poll_lookup(request, self._tracker(request))

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        tracker = self._tracker(request)
        chunk_size = self.link.chunk_size
        if (
            tracker.state == LMCacheMPRequestState.BYPASS_LMCACHE
            or not self.link.ready
            or chunk_size is None
        ):
            tracker.state = LMCacheMPRequestState.BYPASS_LMCACHE
            return 0, False
        if tracker.load_emitted and not self._replan_load(request, tracker):
            return 0, False
        if tracker.hit_tokens is None:
            hit = self._poll_lookup(request, tracker)
            if hit is None:
                return None, False
            tracker.hit_tokens = hit_chunks_to_tokens(hit, chunk_size, tracker.prompt_len)
            self._count_lookup(tracker, chunk_size)
        else:
            self._refresh_lookup(request, tracker, chunk_size)
        usable = self._usable_hit(tracker.hit_tokens, tracker, chunk_size)
        tracker.local_computed = num_computed_tokens
        if usable <= num_computed_tokens:
            tracker.state = LMCacheMPRequestState.READY
            return 0, False
        tracker.state = LMCacheMPRequestState.WAITING_FOR_LOAD
        # Async: vLLM parks the request (WAITING_FOR_REMOTE_KVS) until a worker reports the
        # load in get_finished, and keeps stepping the others meanwhile.
        tracker.load_async = self.config.async_load
        return usable - num_computed_tokens, tracker.load_async

    def _refresh_lookup(
        self, request: Request, tracker: LMCacheMPRequestTracker, chunk_size: int
    ) -> None:
        """vLLM asks again for a request it could not schedule (no free blocks): while it
        waited, other requests may have stored more of its prefix (users asking about the
        same document at once).  Look it up again in the background, at most once per
        ``lookup_refresh_interval``, and answer with the last hit until the new one is in.

        The server pins a lookup's hit before it releases the session's earlier pins, so a
        repeated lookup never finds less than the answer vLLM may already be using."""
        request_id = request.request_id
        if tracker.refresh_pending:
            self._take_refreshed_hit(request_id, tracker, chunk_size)
            return
        interval = self.config.lookup_refresh_interval
        if (
            interval <= 0
            or not self.config.nonblocking_lookup_status
            or (tracker.hit_tokens or 0) >= tracker.prompt_len
        ):
            return
        sent = self._lookups.get(request_id)
        if sent is not None and time.monotonic() - sent.sent_at < interval:
            return
        self._lookup_thread.submit(request_id, self._lookup_key(request, tracker))
        self._lookups[request_id] = _Lookup(self.link.generation, time.monotonic())
        tracker.refresh_pending = True
        self.stats.add(lookup_refreshes=1)

    def _take_refreshed_hit(
        self, request_id: str, tracker: LMCacheMPRequestTracker, chunk_size: int
    ) -> None:
        hit = self._lookup_thread.result(request_id)
        if hit is None and not self._lookup_lost(request_id):
            return  # still out: keep the last answer
        tracker.refresh_pending = False
        if hit is None or hit == LOOKUP_FAILED:
            logger.debug("a repeated lookup for %s failed; keeping the last hit", request_id)
            return
        before = self._usable_hit(tracker.hit_tokens or 0, tracker, chunk_size)
        tracker.hit_tokens = hit_chunks_to_tokens(hit, chunk_size, tracker.prompt_len)
        gained = self._usable_hit(tracker.hit_tokens, tracker, chunk_size) - before
        if gained > 0:
            self.stats.add(hit_tokens=gained, refresh_hit_tokens=gained)

    def _count_lookup(self, tracker: LMCacheMPRequestTracker, chunk_size: int) -> None:
        """Metrics: once per request, when its lookup resolves."""
        hit_tokens = tracker.hit_tokens or 0
        self.stats.add(
            lookups=1,
            lookup_tokens=tracker.prompt_len,
            hit_tokens=self._usable_hit(hit_tokens, tracker, chunk_size),
        )

    def _usable_hit(
        self, hit_tokens: int, tracker: LMCacheMPRequestTracker, chunk_size: int
    ) -> int:
        return usable_hit_tokens(
            hit_tokens, tracker.prompt_len, chunk_size, self.link.block_size, self.config.async_load
        )

    def _replan_load(self, request: Request, tracker: LMCacheMPRequestTracker) -> bool:
        """vLLM asks again for a request whose load already went out (it asks only when the
        request holds no computed tokens).  Preempted: its blocks are gone, so the hit is
        loaded again into the new ones.  Otherwise vLLM reset it after a failed load: it is
        recomputed without LMCache rather than retried (a retry could fail forever)."""
        tracker.load_emitted = False
        tracker.num_external = 0
        if getattr(getattr(request, "status", None), "name", "") == "PREEMPTED":
            return True
        logger.warning("LMCache load of %s failed; vLLM recomputes the prompt", request.request_id)
        tracker.state = LMCacheMPRequestState.BYPASS_LMCACHE
        return False

    def update_state_after_alloc(
        self,
        request: Request,
        num_external_tokens: int,
        block_ids: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """Record vLLM's allocation.

        For an async load this is the only place its blocks are known: the parked request
        is not in the step's scheduled requests, so its load is planned from ``block_ids``
        (all of the request's blocks, per KV group) in the next ``build_connector_meta``.
        vLLM calls this again, with no external tokens, once the loaded request runs.
        """
        tracker = self._tracker(request)
        if tracker.load_emitted:
            return  # the second call of an async load: its load is planned already
        tracker.num_external = int(num_external_tokens)
        if num_external_tokens <= 0:
            tracker.state = LMCacheMPRequestState.READY
            tracker.load_async = False
        elif tracker.load_async:
            tracker.block_ids = [list(group) for group in (block_ids or ())]
            self._async_to_plan.add(request.request_id)

    # -- per-step metadata --------------------------------------------------------------------

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> LMCacheMPConnectorMetadata:
        meta = LMCacheMPConnectorMetadata()
        self._emit_async_loads(meta)
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
                if self.lazy is not None:
                    # Its buffered stores named the block table it just lost.
                    tracker.stored_end = min(tracker.stored_end, self.lazy.on_preempted(req_id))
                # A preempted request resumed with a (synchronous) hit loads it again.
                self._emit_load(meta, tracker, request)
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
        self._release_lazy_stores(meta, scheduler_output)
        return meta

    def _release_lazy_stores(
        self, meta: LMCacheMPConnectorMetadata, scheduler_output: SchedulerOutput
    ) -> None:
        """Lazy offload: this step's released stores (run in this step's wait_for_save,
        before any later step can reuse their blocks)."""
        if self.lazy is None:
            return
        cached = scheduler_output.scheduled_cached_reqs
        signals = step_signals(
            [new.block_ids for new in scheduler_output.scheduled_new_reqs]
            + list(cached.new_block_ids),
            scheduler_output.total_num_scheduled_tokens,
            self.link.block_size,
        )
        meta.stores.extend(self._finish_stores)
        meta.held_requests.extend(store.request_id for store in self._finish_stores)
        self._finish_stores = []
        if self.link.ready:
            meta.stores.extend(self.lazy.drain(signals))
        # (else kept: still valid when the server is back, unless evicted first)
        totals = self.lazy.counters.as_metrics()
        self.stats.add(**{name: totals[name] - self._lazy_reported.get(name, 0) for name in totals})
        self._lazy_reported = totals

    def _emit_async_loads(self, meta: LMCacheMPConnectorMetadata) -> None:
        """The loads of requests vLLM parked for an async load since the last step."""
        for request_id in sorted(self._async_to_plan):
            tracker = self._trackers.get(request_id)
            request = self._requests.get(request_id)
            if tracker is not None and request is not None:
                self._emit_load(meta, tracker, request)
        self._async_to_plan.clear()

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
        meta.loads.append(
            LMCacheMPRequestMetadata(
                tracker.request_id, op, tracker.cache_salt, async_load=tracker.load_async
            )
        )

    def _emit_store(
        self,
        meta: LMCacheMPConnectorMetadata,
        tracker: LMCacheMPRequestTracker,
        request: Request,
        computed_before: int,
        scheduled: int,
    ) -> None:
        chunk_size = self.link.chunk_size
        if (
            tracker.state == LMCacheMPRequestState.BYPASS_LMCACHE
            or not self.link.ready
            or chunk_size is None
        ):
            return
        if self.config.save_decode_cache:
            tokens = list(request.all_token_ids)
        else:
            tokens = list(request.prompt_token_ids or ())
        span = store_range(
            tracker,
            computed_before + scheduled,
            len(tokens),
            chunk_size,
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
        item = LMCacheMPRequestMetadata(tracker.request_id, op, tracker.cache_salt)
        if self.lazy is not None:
            if self.lazy.pool is not None:
                self.lazy.admit(item, chunk_size)
                return
            if not self._warned_no_block_pool:
                self._warned_no_block_pool = True
                logger.warning(
                    "lmcache.mp.lazy_offload: vLLM has not bound its block pool to the "
                    "connector (bind_gpu_block_pool), so stores are issued eagerly"
                )
        meta.stores.append(item)

    # -- end of a request ---------------------------------------------------------------------

    def waiting_blocks(self) -> int:
        """Blocks the requests vLLM has not given blocks yet need for their prompts."""
        block_size = self.link.block_size
        return sum(
            -(-t.prompt_len // block_size) for t in self._trackers.values() if not t.block_ids
        )

    def finish(self, request_id: str, waiting_blocks: Callable[[], int] | None = None) -> bool:
        """vLLM finished the request.  True: vLLM must keep its blocks (delay_free_blocks)
        until the workers report it, after the next step stored what lazy offload had
        buffered (``waiting_blocks``: what waiting requests need, default this side's;
        called only when the request has buffered stores)."""
        held = self._release_at_finish(request_id, waiting_blocks)
        tracker = self._trackers.pop(request_id, None)
        self._async_to_plan.discard(request_id)
        if self.lazy is not None:  # a no-op when the release at finish took everything
            self.lazy.on_finished(request_id)
        self._requests.pop(request_id, None)
        sent = self._lookups.pop(request_id, None)
        if tracker is not None and tracker.lookup_submitted:
            self._end_session(request_id, sent)
        return held

    def _release_at_finish(self, request_id: str, waiting_blocks: Callable[[], int] | None) -> bool:
        if self.lazy is None or not self.link.ready or not self.lazy.is_buffered(request_id):
            return False
        demand = (waiting_blocks or self.waiting_blocks)()
        store = self.lazy.release_at_finish(request_id, demand)
        if store is None:
            return False
        self._finish_stores.append(store)
        return True

    def _end_session(self, request_id: str, sent: _Lookup | None) -> None:
        """The server's lookup session of a finished request (its pins) goes."""
        lost = sent is not None and sent.generation != self.link.generation
        if self.config.nonblocking_lookup_status:
            # Queued behind the lookup itself, so the session exists when it is ended.
            if lost or not self.link.ready:
                self._lookup_thread.forget(request_id)
            else:
                self._lookup_thread.end_session(request_id)
            return
        if lost or not self.link.ready:
            return  # that server is gone, and its session with it
        try:
            self.link.run(
                "end_session",
                lambda c: c.call("end_session", request_id, timeout=LOOKUP_TIMEOUT_S),
            )
        except MPClientError as exc:
            logger.debug("end_session(%s) failed: %s", request_id, exc)

    def close(self) -> None:
        self._lookup_thread.close()
        if self.lazy is not None:
            self.lazy.log_final_stats()
