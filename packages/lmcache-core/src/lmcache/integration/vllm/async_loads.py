"""Worker-side asynchronous loads of ``LMCacheMPConnector`` (vLLM's async-load contract).

When the scheduler answers ``get_num_new_matched_tokens`` with ``load_kv_async=True``,
vLLM parks the request in ``WAITING_FOR_REMOTE_KVS`` with its blocks allocated and keeps
stepping the other requests.  Each worker then runs the load on a background thread
(:class:`AsyncLoader`) instead of inside ``start_load_kv``, and reports it through
``get_finished`` (``finished_recving``) in the first step after it ended.  A failed load
is reported as finished too, and its blocks through ``get_block_ids_with_load_errors`` in
the same step, so vLLM recomputes them instead of reading unwritten KV.

Free of vLLM imports so it can be unit-tested with fakes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from lmcache.integration.vllm.scheduler_state import LMCacheMPRequestMetadata

logger = logging.getLogger(__name__)

LoadFn = Callable[[LMCacheMPRequestMetadata], bool]


@dataclasses.dataclass
class _Pending:
    item: LMCacheMPRequestMetadata
    future: Future[bool]


class AsyncLoader:
    """Runs loads one after another on one background thread; polled by the worker.

    One thread is enough: the transfers of one worker are serialized by its lock anyway,
    and order keeps the server's reader shares simple.
    """

    def __init__(self, load: LoadFn) -> None:
        self._load = load
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[_Pending] = []

    def submit(self, item: LMCacheMPRequestMetadata) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="lmcache-async-load"
            )
        self._pending.append(_Pending(item, self._executor.submit(self._guarded_load, item)))

    def _guarded_load(self, item: LMCacheMPRequestMetadata) -> bool:
        try:
            return bool(self._load(item))
        except Exception:
            # A failed load is a recomputation, never a lost request.
            logger.warning("async load of %s failed", item.request_id, exc_info=True)
            return False

    def poll(self) -> tuple[set[str], list[LMCacheMPRequestMetadata]]:
        """(request ids whose load ended, the items of those that failed); non-blocking."""
        finished: set[str] = set()
        failed: list[LMCacheMPRequestMetadata] = []
        still: list[_Pending] = []
        for pending in self._pending:
            if not pending.future.done():
                still.append(pending)
                continue
            finished.add(pending.item.request_id)
            if pending.future.cancelled() or not pending.future.result():
                failed.append(pending.item)
        self._pending = still
        return finished, failed

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            # Queued loads are dropped; the one running is bounded by the transfer timeout.
            executor.shutdown(wait=False, cancel_futures=True)
