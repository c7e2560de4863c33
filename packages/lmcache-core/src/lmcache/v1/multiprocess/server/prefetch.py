"""Background promotion of lookup hits from the lower tiers (disk, Redis, plugins) into L1.

A lookup that finds chunks below L1 answers at once and hands those chunks to a
:class:`Prefetcher`; a bounded pool (``--l2-prefetch-max-in-flight`` threads, upstream's
flag) reads them, one chunk per task, and inserts them into L1 **pinned**, so L1 pressure
cannot evict a chunk between its promotion and the retrieve that needs it.

* Each chunk has one :class:`ChunkPrefetch` shared by every lookup session that wants it,
  with a completion event: a retrieve waits only for the chunks it reads
  (:meth:`Prefetcher.wait_for`), and a timeout is a miss.
* A chunk whose tier fails (read error, corrupt file, Redis down, no L1 room) is a miss:
  nothing is inserted, so no retrieve can read wrong bytes.  A session logs its failures
  once, when its last chunk finishes.
* ``end_session`` / ``free_lookup_locks`` release the session's chunks: queued reads no one
  else wants are cancelled, and the L1 pins are dropped (also for reads that finish after).
* ``--l2-prefetch-policy`` (upstream's): with ``default`` a chunk this prefetcher put into
  L1 is temporary and leaves L1 when its last session releases it (unless someone else
  pins or reads it, or a newer copy replaced it); with ``retain`` it stays in L1.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.multiprocess.wire.custom_types import PrefetchProgress
from lmcache.v1.storage_backend.storage_manager import StorageManager

logger = logging.getLogger(__name__)

# Upstream's default for --l2-prefetch-max-in-flight.
DEFAULT_MAX_IN_FLIGHT = 8


@dataclasses.dataclass(eq=False)
class ChunkPrefetch:
    """One chunk on its way into L1; shared by every session that looked it up."""

    key: Any
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    ok: bool = False
    error: str | None = None
    holders: int = 1  # sessions still relying on it
    l1_obj: MemoryObj | None = None  # pinned and referenced until the last holder leaves
    future: Future | None = None
    temporary: bool = False  # put into L1 by this prefetch (the key was not there before)


@dataclasses.dataclass(eq=False)
class PrefetchJob:
    """The chunks one lookup session prefetches; ``indices[i]`` is chunk ``i``'s position
    in the request (the same for every rank)."""

    request_id: str
    chunks: list[ChunkPrefetch]
    indices: list[int]
    failure_logged: bool = False
    released: bool = False

    def progress(self) -> PrefetchProgress:
        done = [c for c in self.chunks if c.done.is_set()]
        return PrefetchProgress(
            request_id=self.request_id,
            total_chunks=len(self.chunks),
            done_chunks=len(done),
            failed_chunks=sum(not c.ok for c in done),
            finished=len(done) == len(self.chunks),
        )

    def usable_prefix(self, hit_chunks: int) -> int:
        """Hit chunks still retrievable: the prefix before the first failed chunk."""
        failed = [i for i, c in zip(self.indices, self.chunks) if c.done.is_set() and not c.ok]
        return min([hit_chunks, *failed])

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + max(0.0, timeout)
        return all(c.done.wait(max(0.0, deadline - time.monotonic())) for c in self.chunks)


class Prefetcher:
    """Promotes chunks from the lower tiers into L1 on a bounded pool (see the module doc)."""

    def __init__(
        self,
        storage: StorageManager,
        max_in_flight: int,
        wait_timeout: float,
        retain: bool = False,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.storage = storage
        self.max_in_flight = max_in_flight
        self.wait_timeout = wait_timeout
        self.retain = retain
        self._pool = ThreadPoolExecutor(
            max_workers=max_in_flight, thread_name_prefix="lmc-prefetch"
        )
        self._lock = threading.Lock()
        self._inflight: dict[Any, ChunkPrefetch] = {}
        self._running = 0
        self._unfinished = 0  # chunks submitted and not yet finished (running or queued)
        self.peak_running = 0  # most reads at once so far (bounded by max_in_flight)
        self.promoted_chunks = 0
        self.failed_chunks = 0
        self._closed = False

    # -- sessions -----------------------------------------------------------------------------

    def start(self, request_id: str, keys: Sequence[Any], indices: Sequence[int]) -> PrefetchJob:
        """Prefetch ``keys`` (all below L1) for one session; returns at once."""
        chunks: list[ChunkPrefetch] = []
        with self._lock:
            for key in keys:
                chunk = self._inflight.get(key)
                if chunk is not None:
                    chunk.holders += 1
                else:
                    chunk = ChunkPrefetch(key)
                    self._inflight[key] = chunk
                    self._unfinished += 1
                    if self._closed:
                        self._finish_locked(chunk, None, "server closing")
                    else:
                        chunk.future = self._pool.submit(self._run, chunk)
                chunks.append(chunk)
        return PrefetchJob(request_id, chunks, list(indices))

    def release(self, job: PrefetchJob) -> None:
        """The session is over: cancel what no one else wants, drop its L1 pins (and,
        without ``retain``, the L1 copies this prefetcher made)."""
        to_unpin: list[ChunkPrefetch] = []
        with self._lock:
            if job.released:
                return
            job.released = True
            for chunk in job.chunks:
                chunk.holders -= 1
                if chunk.holders > 0:
                    continue
                if self._inflight.get(chunk.key) is chunk:
                    del self._inflight[chunk.key]
                if chunk.future is not None and chunk.future.cancel():
                    self._finish_locked(chunk, None, "cancelled")
                elif chunk.l1_obj is not None:
                    to_unpin.append(chunk)
        for chunk in to_unpin:
            self._let_go(chunk)

    def wait_for(self, keys: Sequence[Any], timeout: float | None = None) -> bool:
        """Wait for the in-flight prefetches of ``keys``; False when one failed or did not
        finish in time (the caller treats it as a miss)."""
        with self._lock:
            pending = [c for c in (self._inflight.get(k) for k in keys) if c is not None]
        deadline = time.monotonic() + (self.wait_timeout if timeout is None else timeout)
        for chunk in pending:
            if not chunk.done.wait(max(0.0, deadline - time.monotonic())):
                logger.warning(
                    "retrieve: prefetch of %s still running at the timeout: a miss", chunk.key
                )
                return False
            if not chunk.ok:
                return False
        return True

    def log_failures_once(self, job: PrefetchJob) -> None:
        """One warning per session whose prefetch lost chunks."""
        progress = job.progress()
        if not progress.finished or not progress.failed_chunks:
            return
        with self._lock:
            if job.failure_logged:
                return
            job.failure_logged = True
        first = next(c.error for c in job.chunks if c.done.is_set() and not c.ok)
        logger.warning(
            "prefetch for request %r: %d of %d chunks could not be promoted to L1 (first: "
            "%s); they are misses",
            job.request_id,
            progress.failed_chunks,
            progress.total_chunks,
            first,
        )

    def in_flight(self) -> int:
        """Chunks queued or being read (also those whose sessions already ended)."""
        with self._lock:
            return self._unfinished

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            leftover = [c for c in self._inflight.values() if not c.done.is_set()]
            for chunk in leftover:
                self._finish_locked(chunk, None, "server closing")

    # -- the pool's side ----------------------------------------------------------------------

    def _run(self, chunk: ChunkPrefetch) -> None:
        with self._lock:
            if chunk.holders <= 0:
                self._finish_locked(chunk, None, "cancelled")
                return
            self._running += 1
            self.peak_running = max(self.peak_running, self._running)
        obj: MemoryObj | None = None
        error: str | None = None
        fresh = False
        try:
            fresh = not self.storage.in_l1(chunk.key)
            obj = self._promote(chunk.key)
            if obj is None:
                error = "not readable from any lower tier (or no room in L1)"
            else:
                chunk.temporary = fresh
        except Exception as exc:  # a tier's failure is a miss, never the server's end
            error = f"{type(exc).__name__}: {exc}"
        release_now = False
        with self._lock:
            self._running -= 1
            self._finish_locked(chunk, obj, error)
            release_now = chunk.holders <= 0 and chunk.l1_obj is not None
        if release_now:
            self._let_go(chunk)

    def _let_go(self, chunk: ChunkPrefetch) -> None:
        """Drop the chunk's pin and reference; a temporary copy leaves L1 too."""
        with self._lock:
            obj, chunk.l1_obj = chunk.l1_obj, None
        if obj is None:
            return
        _unpin_all([obj])
        if chunk.temporary and not self.retain:
            self.storage.local_cpu_backend.remove_object(chunk.key, obj)

    def _finish_locked(
        self, chunk: ChunkPrefetch, obj: MemoryObj | None, error: str | None
    ) -> None:
        if chunk.done.is_set():
            return
        self._unfinished -= 1
        chunk.l1_obj = obj
        chunk.ok = obj is not None
        chunk.error = None if chunk.ok else error
        if chunk.ok:
            self.promoted_chunks += 1
        else:
            self.failed_chunks += 1
        chunk.done.set()

    def _promote(self, key: Any) -> MemoryObj | None:
        """Read ``key`` from a lower tier into L1; the L1 object, pinned and referenced."""
        obj = self.storage.read_lower_tiers(key)
        if obj is None:
            return None
        l1 = self.storage.local_cpu_backend
        # Pinned before it becomes visible, so no eviction can take it in between.
        obj.pin()
        held: MemoryObj | None = None
        try:
            l1.batched_submit_put_task([key], [obj])
            held = l1.get_blocking(key)
        finally:
            if held is not obj:
                obj.unpin()
            obj.ref_count_down()
        if held is not None and held is not obj:
            held.pin()  # L1 holds another copy (a foreign allocation, or a racing put)
        return held


def _unpin_all(objs: list[MemoryObj]) -> None:
    for obj in objs:
        obj.unpin()
        obj.ref_count_down()
