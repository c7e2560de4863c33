"""Upstream LMCache 0.5.6's ``AsyncEngineDrivenTransferContext``: stores off the forward thread.

``submit_store`` only checks its arguments and queues the work, returning a pending
:class:`~.base.QueryableFuture`.  A background thread then runs the store's three steps:

1. ``prepare_store`` on the transport (a server round trip);
2. the gather, on a copy stream that first waits for the engine's event, into the
   transport's buffers (shared-memory slots) or pooled pinned staging buffers;
3. once the gather's own event completes, ``commit_store`` (one at a time: the request
   client's socket is not thread-safe); the future resolves to its result, or ``False``
   after any failure (logged).

Retrieves stay synchronous (inherited).  :meth:`flush_inflight_stores` returns once every
queued gather has been launched and has finished reading the KV pages, so the engine may
reuse them (preemption).  ``worker_transfer._build_engine_driven_context`` picks this
class where the device has streams, events and pinned memory.
"""

from __future__ import annotations

import logging
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from lmcache.v1.multiprocess.transfer_context.base import (
    EngineDrivenContext,
    QueryableFuture,
    _failed,
    gather_paged_kv_to_cpu,
)
from lmcache.v1.multiprocess.transfer_context.engine_driven import EngineDrivenTransferContext
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey
from lmcache.v1.platform import get_torch_device

__all__ = [
    "DEFAULT_ENGINE_DRIVEN_COMMIT_WORKERS",
    "AsyncEngineDrivenTransferContext",
    "gather_paged_kv_to_cpu",
]

logger = logging.getLogger(__name__)

# Several threads, so a store whose gather finished need not wait behind a slow one.
DEFAULT_ENGINE_DRIVEN_COMMIT_WORKERS = 4


def __getattr__(name: str) -> Any:
    # Resolved on first use: the backend registry is not built at import time.
    if name == "torch_dev":
        return get_torch_device()[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _torch_dev() -> Any:
    """``torch_dev`` as seen through this module (a replaced one included)."""
    return sys.modules[__name__].torch_dev


class AsyncEngineDrivenTransferContext(EngineDrivenTransferContext):
    """Engine-driven transfer whose stores complete in the background (see the module)."""

    def __init__(
        self,
        instance_id: int,
        req_client: Any,
        sub_path: str | None = None,
        commit_workers: int = DEFAULT_ENGINE_DRIVEN_COMMIT_WORKERS,
    ) -> None:
        super().__init__(instance_id, req_client, sub_path=sub_path)
        self._copy_stream: Any = _torch_dev().Stream()
        self._commit_executor = ThreadPoolExecutor(
            max_workers=max(1, int(commit_workers)),
            thread_name_prefix="lmcache-engine-driven-store",
        )
        self._commit_lock = threading.Lock()
        self._inflight_lock = threading.Lock()
        # Set once a queued store launched its gather (or gave up): flush waits for these.
        self._pending_stores: set[threading.Event] = set()
        # Gathers launched and not yet known complete.
        self._inflight_gather_events: set[Any] = set()
        self._staging_pool: dict[tuple[tuple[int, ...], torch.dtype], list[torch.Tensor]] = {}
        self._is_closing = False
        self._warned_pageable = False

    def create_recorded_event(self) -> Any:
        """An event on the current stream: the copy stream waits for it (never shared
        with another process)."""
        if self._engine_driven_context is None:
            raise RuntimeError("the engine-driven context is not registered; call register()")
        dev = _torch_dev()
        event = dev.Event()
        event.record(dev.current_stream())
        return event

    def _take_staging(
        self, shape: torch.Size, dtype: torch.dtype, count: int
    ) -> list[torch.Tensor]:
        """``count`` host buffers, pinned where possible, reused from earlier stores."""
        with self._inflight_lock:
            pooled = self._staging_pool.setdefault((tuple(shape), dtype), [])
            taken = [pooled.pop() for _ in range(min(count, len(pooled)))]
        while len(taken) < count:
            try:
                taken.append(torch.empty(shape, dtype=dtype, pin_memory=True))
            except RuntimeError:
                if not self._warned_pageable:
                    self._warned_pageable = True
                    logger.warning("pinned memory unavailable; staging in pageable memory")
                taken.append(torch.empty(shape, dtype=dtype))
        return taken

    def _give_back_staging(self, buffers: list[torch.Tensor]) -> None:
        if not buffers:
            return
        with self._inflight_lock:
            key = (tuple(buffers[0].shape), buffers[0].dtype)
            self._staging_pool.setdefault(key, []).extend(buffers)

    def submit_store(
        self,
        request_id: str,
        key: IPCCacheServerKey,
        kv_caches: Any,
        block_ids: list[list[int]],
        event: Any,
        blocks_in_chunk: int,
    ) -> QueryableFuture[bool]:
        completion: QueryableFuture[bool] = QueryableFuture()
        transport = self._engine_driven_context
        launched = threading.Event()
        with self._inflight_lock:
            if self._is_closing:
                # Closing (or closed): refused as a failed store, the caller carries on.
                completion.set_result(False)
                return completion
            if transport is None:
                return _failed(RuntimeError("the engine-driven context is not registered"))
            if event is None:
                return _failed(RuntimeError("an asynchronous store needs the engine's event"))
            self._pending_stores.add(launched)
        try:
            ids, blocks_in_chunk = self._generic_ids(key, block_ids, blocks_in_chunk)
            kv = self._kv_for(kv_caches)
            self._commit_executor.submit(
                self._store_in_background,
                request_id, transport, key, kv, ids, event, blocks_in_chunk, launched, completion,
            )  # fmt: skip
        except Exception:
            logger.exception("could not queue the store of request %s", request_id)
            self._mark_launched(launched)
            completion.set_result(False)
        return completion

    def _mark_launched(self, launched: threading.Event, gather_done: Any = None) -> None:
        with self._inflight_lock:
            self._pending_stores.discard(launched)
            if gather_done is not None:
                self._inflight_gather_events.add(gather_done)
        launched.set()

    def _store_in_background(
        self,
        request_id: str,
        transport: EngineDrivenContext,
        key: IPCCacheServerKey,
        kv: Any,
        ids: list[int],
        event: Any,
        blocks_in_chunk: int,
        launched: threading.Event,
        completion: QueryableFuture[bool],
    ) -> None:
        ok = False
        staging: list[torch.Tensor] = []
        gather_done: Any = None
        try:
            prepared = transport.prepare_store(key, self.instance_id)
            buffers, indices = prepared if prepared is not None else (None, None)
            if indices is not None and not indices:
                ok = True  # every chunk is stored already
                return
            if buffers is None:
                desc = transport.layout_desc
                if not desc.shapes or not desc.dtypes:
                    raise RuntimeError("the transport's chunk layout is empty")
                count = len(indices) if indices is not None else len(ids) // blocks_in_chunk
                staging = self._take_staging(desc.shapes[0], desc.dtypes[0], count)
                buffers = staging
            dev = _torch_dev()
            with torch.inference_mode(), dev.stream(self._copy_stream):
                event.wait(stream=self._copy_stream)
                gather_paged_kv_to_cpu(
                    kv,
                    ids,
                    blocks_in_chunk,
                    layout_hints=self._layout_hints,
                    out=buffers,
                    chunk_indices=indices,
                    engine_type=self._engine_type,
                )
                gather_done = dev.Event()
                gather_done.record(self._copy_stream)
            self._mark_launched(launched, gather_done)
            gather_done.synchronize()
            with self._commit_lock:
                ok = bool(transport.commit_store(key, self.instance_id, buffers))
            if not ok:
                logger.error("the server refused the store of request %s", request_id)
        except Exception:
            logger.exception("the asynchronous store of request %s failed", request_id)
            ok = False
        finally:
            self._give_back_staging(staging)
            with self._inflight_lock:
                if gather_done is not None:
                    self._inflight_gather_events.discard(gather_done)
            self._mark_launched(launched)
            completion.set_result(ok)

    def _wait_for_launches(self) -> None:
        with self._inflight_lock:
            pending = list(self._pending_stores)
        for launched in pending:
            launched.wait()

    def _sync_gathers(self, suppress_errors: bool) -> None:
        with self._inflight_lock:
            events = list(self._inflight_gather_events)
        for gather_done in events:
            try:
                gather_done.synchronize()
            except Exception:
                if not suppress_errors:
                    raise
                logger.exception("waiting for an in-flight gather failed")

    def flush_inflight_stores(self) -> None:
        """Return once every queued store finished reading the engine's KV pages."""
        self._wait_for_launches()
        self._sync_gathers(suppress_errors=False)

    def close(self) -> None:
        """Let queued stores finish (their futures resolve), then close as usual."""
        with self._inflight_lock:
            self._is_closing = True
        self._wait_for_launches()
        self._sync_gathers(suppress_errors=True)
        self._commit_executor.shutdown(wait=True)
        super().close()
