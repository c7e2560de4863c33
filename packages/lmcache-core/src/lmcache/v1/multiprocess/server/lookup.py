"""Lookup sessions: which prefix of a request is cached, pinned until the request ends.

``lookup`` pins the hit chunks of every rank so they survive until ``retrieve``;
``free_lookup_locks`` / ``end_session`` (or the session TTL, or the session cap) unpin
them.  Hits below L1 are promoted in the background (:mod:`.prefetch`): the lookup replies
at once; as upstream, ``query_prefetch_status`` answers ``None`` while the promotion runs,
then the hit chunks (cut at the first chunk whose tier failed), and
``wait_prefetch_status`` waits for that answer up to its timeout.
``query_prefetch_progress`` reports chunks done / total.
"""

from __future__ import annotations

from typing import Any

from lmcache.v1.multiprocess.server.prefetch import PrefetchJob
from lmcache.v1.multiprocess.server.state import LookupSession, ServerCore
from lmcache.v1.multiprocess.wire.chunking import prefix_chunks
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey, PrefetchProgress
from lmcache.v1.multiprocess.wire.protocol import ErrorCode, ProtocolError

# A peer can name any request id: this caps the sessions (and pins) it can leave behind.
_MAX_LOOKUP_SESSIONS = 65536


class LookupOps(ServerCore):
    """``lookup``, the prefetch-status queries and the end of a lookup session."""

    def lookup(self, key: IPCCacheServerKey, tp_size: int) -> None:
        key = self._admit_key(key, False, "lookup")
        try:
            spans = prefix_chunks(key, self.chunk_size)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.BAD_PAYLOAD, str(exc)) from None
        # Keys are built rank by rank and only for the prefix still hit, so the work is
        # bounded by what is stored, not by tp_size x chunks (tp_size is bounded on the wire).
        hits = len(spans)
        per_rank: list[list[Any]] = []
        for rank in range(max(1, int(tp_size))):
            if hits == 0:
                break
            keys = [self._storage_key(key, rank, s.chunk_hash) for s in spans[:hits]]
            hits = min(hits, self.storage.batched_contains(keys))
            per_rank.append(keys)
        pinned = [(k, self.storage.pin_tiers(k)) for keys in per_rank for k in keys[:hits]]
        hit_tokens = sum(s.num_tokens for s in spans[:hits])
        self._count(lookup_hit_tokens=hit_tokens)
        if self.metrics is not None:
            miss_tokens = sum(s.num_tokens for s in spans[hits:])
            self.metrics.add_lookup(hit_tokens, miss_tokens)
        session = LookupSession(hit_tokens, hits, [p for p in pinned if p[1]])
        session.prefetch = self._start_prefetch(key.request_id, per_rank, hits)
        self._remember_lookup(self._session_id(key.request_id), session)

    def _start_prefetch(
        self, request_id: str, per_rank: list[list[Any]], hits: int
    ) -> PrefetchJob | None:
        """Promote the hit chunks that are only below L1; None when there are none."""
        if self.prefetcher is None or hits == 0:
            return None
        below = [
            (index, k)
            for keys in per_rank
            for index, k in enumerate(keys[:hits])
            if not self.storage.in_l1(k)
        ]
        if not below:
            return None
        return self.prefetcher.start(request_id, [k for _, k in below], [i for i, _ in below])

    def _remember_lookup(self, request_id: str, session: LookupSession) -> None:
        evicted = []
        with self._lookups_lock:
            old = self._lookups.pop(request_id, None)
            if old is not None:
                evicted.append(old)
            self._lookups[request_id] = session
            while len(self._lookups) > _MAX_LOOKUP_SESSIONS:
                evicted.append(self._lookups.popitem(last=False)[1])
        for stale in evicted:
            self._unpin(stale)

    def _unpin(self, session: LookupSession) -> None:
        """Release the session's pins: its prefetch (cancelling what no one else wants,
        dropping its L1 pins) and the tier pins its lookup took."""
        job, session.prefetch = session.prefetch, None
        if job is not None and self.prefetcher is not None:
            self.prefetcher.release(job)
        pinned, session.pinned = session.pinned, []
        for k, tiers in pinned:
            for tier in tiers:
                tier.unpin(k)

    def _session(self, request_id: str) -> LookupSession | None:
        with self._lookups_lock:
            return self._lookups.get(self._session_id(request_id))

    def query_prefetch_status(self, request_id: str) -> int | None:
        """Hit **chunks** of the lookup (upstream's unit: its scheduler multiplies by the
        chunk size; a trailing partial chunk counts as one), ``None`` while they are
        still being promoted into L1 (or for an unknown session)."""
        session = self._session(request_id)
        if session is None:
            return None
        job = session.prefetch
        if job is None:
            return session.hit_chunks
        if not job.progress().finished:
            return None
        if self.prefetcher is not None:
            self.prefetcher.log_failures_once(job)
        return job.usable_prefix(session.hit_chunks)

    def wait_prefetch_status(self, request_id: str, timeout: float) -> int | None:
        """As :meth:`query_prefetch_status`, after waiting up to ``timeout`` seconds for
        the session's prefetch to finish."""
        session = self._session(request_id)
        job = None if session is None else session.prefetch
        if job is not None:
            job.wait(timeout)
        return self.query_prefetch_status(request_id)

    def query_prefetch_progress(self, request_id: str) -> PrefetchProgress | None:
        """Chunks (over all ranks) the session's prefetch has finished, of how many;
        ``None`` for an unknown session."""
        session = self._session(request_id)
        if session is None:
            return None
        if session.prefetch is None:
            return PrefetchProgress(request_id, 0, 0, 0, True)
        return session.prefetch.progress()

    def free_lookup_locks(self, key: IPCCacheServerKey, tp_size: int) -> None:
        with self._lookups_lock:
            session = self._lookups.get(self._session_id(key.request_id))
        if session is not None:
            self._unpin(session)

    def end_session(self, request_id: str) -> None:
        with self._lookups_lock:
            session = self._lookups.pop(self._session_id(request_id), None)
        if session is not None:
            self._unpin(session)

    def pinned_objects(self) -> int:
        with self._lookups_lock:
            return sum(len(s.pinned) for s in self._lookups.values())

    def _reap_lookups(self, now: float) -> None:
        ttl = self.settings.session_ttl_seconds
        expired = []
        with self._lookups_lock:
            for request_id in list(self._lookups):
                if now - self._lookups[request_id].created > ttl:
                    expired.append(self._lookups.pop(request_id))
        for session in expired:
            self._unpin(session)

    def _close_lookups(self) -> None:
        with self._lookups_lock:
            sessions = list(self._lookups.values())
            self._lookups.clear()
        for session in sessions:
            self._unpin(session)
