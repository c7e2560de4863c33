"""KV events of the LMCache server, reported to vLLM (``--kv-events-config``).

vLLM's contract: each worker's ``get_kv_connector_kv_cache_events()`` returns a
:class:`~vllm.distributed.kv_events.KVConnectorKVEvents` after a model step; vLLM merges
the workers' containers into the step's ``KVConnectorOutput``; the scheduler's
``update_connector_output`` receives them and ``take_events()`` hands them to vLLM's
event publisher (and so to a KV-aware router).

The events come from the server (``subscribe_kv_events``), which sees every store of every
engine sharing it and every eviction.  Only TP rank 0 follows them: the server's events
are per chunk hash, not per rank, so one follower per engine reports each change once.
Following is polling (our wire has no streams): at most one request per
:data:`POLL_INTERVAL_S`, made on the worker's step, never blocking it for longer than one
local round trip; a server that is down simply yields no events.

When the server says events were lost (the follower fell behind its bounded log) or it
restarted (new incarnation), every hash announced so far is withdrawn with one
``BlockRemoved``, as upstream does: the router then forgets rather than trusts stale data.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from vllm.distributed.kv_events import (
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVConnectorKVEvents,
)

from lmcache.integration.vllm.mp_client import ServerLink
from lmcache.v1.multiprocess.wire.custom_types import (
    KV_EVENT_CAPABILITY,
    KV_EVENT_KIND_REMOVED,
    KV_EVENT_KIND_STORED,
    KVEventBatch,
    KVEventRecord,
)
from lmcache.v1.multiprocess.worker.client import MPClientError, ServerUnavailableError

logger = logging.getLogger(__name__)

# The least time between two polls of the server (the model runner asks every step).
POLL_INTERVAL_S = 0.05
# Records per poll; a follower further behind catches up over the next polls.
BATCH_SIZE = 1024


def _external_hash(block_hash: bytes) -> bytes | int:
    """A hash in the form vLLM publishes (bytes, or int with
    ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``)."""
    try:
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
    except ImportError:  # an older vLLM publishes bytes
        return block_hash
    result: bytes | int = maybe_convert_block_hash(block_hash)  # type: ignore[arg-type]
    return result


class LMCacheMPKVEvents(KVConnectorKVEvents):  # type: ignore[misc]
    """The KV events of one step, as vLLM collects them from the workers.

    Events keep their order; ``aggregate`` keeps every worker's events (only one worker
    reports the server's events, so nothing is duplicated) and resets the worker count.
    """

    def __init__(self, num_workers: int) -> None:
        self._events: list[KVCacheEvent] = []
        self._num_workers = num_workers

    def add_events(self, events: list[KVCacheEvent]) -> None:
        self._events.extend(events)

    def aggregate(self) -> LMCacheMPKVEvents:
        self._num_workers = 1 if self._events else 0
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._num_workers += count

    def get_all_events(self) -> list[KVCacheEvent]:
        return list(self._events)

    def get_number_of_workers(self) -> int:
        return self._num_workers

    def clear_events(self) -> None:
        self._events.clear()
        self._num_workers = 0


class KVEventFollower:
    """Follows one model's events on the server and turns them into vLLM events."""

    def __init__(self, link: ServerLink, model_name: str, instance_id: int = 0) -> None:
        self.link = link
        self.model_name = model_name
        self.instance_id = instance_id
        self.cursor = 0
        self.incarnation: int | None = None
        self.announced: set[bytes] = set()
        self._last_poll = float("-inf")
        self._unsupported_logged = False

    def get_kv_events(self, now: float | None = None) -> list[KVCacheEvent]:
        """The vLLM events since the last call (polls at most every POLL_INTERVAL_S)."""
        now = time.monotonic() if now is None else now
        if now - self._last_poll < POLL_INTERVAL_S or not self.link.ready:
            return []
        self._last_poll = now
        events: list[KVCacheEvent] = []
        try:
            batch: KVEventBatch = self.link.run(
                "subscribe_kv_events",
                lambda client: client.call(
                    "subscribe_kv_events",
                    self.instance_id,
                    self.model_name,
                    self.cursor,
                    BATCH_SIZE,
                ),
            )
        except ServerUnavailableError:
            return events  # the link's health already reports the outage
        except MPClientError as exc:
            if not self._unsupported_logged:
                logger.warning(
                    "the LMCache server does not report KV events (%s); vLLM learns only "
                    "its own cache. A server that does lists %r in get_experimental.",
                    exc,
                    KV_EVENT_CAPABILITY,
                )
                self._unsupported_logged = True
            return events
        return self.apply(batch)

    def apply(self, batch: KVEventBatch) -> list[KVCacheEvent]:
        """The vLLM events of one batch; advances the cursor."""
        events: list[KVCacheEvent] = []
        if not batch.enabled:
            return events
        if self.incarnation is not None and batch.incarnation != self.incarnation:
            events.extend(self._withdraw_all("the server restarted"))
            if batch.lost:
                # Our cursor means nothing to the new incarnation: read it from the start.
                self.incarnation = batch.incarnation
                self.cursor = 0
                return events
        elif batch.lost and self.incarnation is not None:
            events.extend(self._withdraw_all("events were lost"))
        self.incarnation = batch.incarnation
        for record in batch.events:
            events.extend(self._convert(record))
        self.cursor = batch.next_cursor
        return events

    def _withdraw_all(self, why: str) -> Iterable[KVCacheEvent]:
        logger.warning("LMCache KV events: %s; withdrawing what was announced", why)
        if not self.announced:
            return []
        hashes = sorted(self.announced)
        self.announced.clear()
        return [BlockRemoved(block_hashes=[_external_hash(h) for h in hashes], medium="CPU")]

    def _convert(self, record: KVEventRecord) -> list[KVCacheEvent]:
        if record.kind == KV_EVENT_KIND_STORED:
            # A chunk the server got without its tokens (a promotion) cannot be announced:
            # vLLM's consumers need the tokens to place it in the prefix tree.
            # A partial (last) chunk is not announced either, as upstream: it names no
            # whole block of the chunk size.
            fresh = [h for h in record.block_hashes if h not in self.announced]
            chunk_size = self.link.chunk_size
            if not fresh or not record.token_ids or len(record.token_ids) != chunk_size:
                return []
            self.announced.update(fresh)
            parent = record.parent_block_hash
            return [
                BlockStored(
                    block_hashes=[_external_hash(h) for h in fresh],
                    parent_block_hash=None if parent is None else _external_hash(parent),
                    token_ids=list(record.token_ids),
                    block_size=len(record.token_ids),  # the server's chunk size
                    lora_id=None,
                    medium=record.medium,
                    lora_name=None,
                )
            ]
        if record.kind == KV_EVENT_KIND_REMOVED:
            gone = [h for h in record.block_hashes if h in self.announced]
            if not gone:
                return []
            self.announced.difference_update(gone)
            return [BlockRemoved(block_hashes=[_external_hash(h) for h in gone], medium="CPU")]
        logger.warning("ignoring a KV event of unknown kind %r", record.kind)
        return []


def collect(container: Any, into: list[KVCacheEvent]) -> None:
    """Scheduler side: append a step's worker events (a ``KVConnectorOutput`` field)."""
    if isinstance(container, LMCacheMPKVEvents):
        into.extend(container.aggregate().get_all_events())
