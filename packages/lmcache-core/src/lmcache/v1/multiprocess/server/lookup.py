"""Lookup sessions: which prefix of a request is cached, pinned until the request ends.

``lookup`` pins the hit chunks of every rank so they survive until ``retrieve``;
``free_lookup_locks`` / ``end_session`` (or the session TTL, or the session cap) unpin
them.  Upstream's prefetch-status calls read the session's hit count.
"""

from __future__ import annotations

from typing import Any

from lmcache.v1.multiprocess.server.state import LookupSession, ServerCore
from lmcache.v1.multiprocess.wire.chunking import prefix_chunks
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.wire.protocol import ErrorCode, ProtocolError

# A peer can name any request id: this caps the sessions (and pins) it can leave behind.
_MAX_LOOKUP_SESSIONS = 65536


class LookupOps(ServerCore):
    """``lookup``, the prefetch-status queries and the end of a lookup session."""

    def lookup(self, key: IPCCacheServerKey, tp_size: int) -> None:
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
        pinned = [k for keys in per_rank for k in keys[:hits] if self.storage.contains(k, pin=True)]
        hit_tokens = sum(s.num_tokens for s in spans[:hits])
        self._count(lookup_hit_tokens=hit_tokens)
        if self.metrics is not None:
            miss_tokens = sum(s.num_tokens for s in spans[hits:])
            self.metrics.add_lookup(hit_tokens, miss_tokens)
        self._remember_lookup(key.request_id, LookupSession(hit_tokens, hits, pinned))

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
        pinned, session.pinned = session.pinned, []
        for k in pinned:
            self.storage.unpin(k)

    def query_prefetch_status(self, request_id: str) -> int | None:
        """Hit **chunks** of the lookup (upstream's unit: its scheduler multiplies by the
        chunk size); a trailing partial chunk counts as one."""
        with self._lookups_lock:
            session = self._lookups.get(request_id)
        return None if session is None else session.hit_chunks

    def wait_prefetch_status(self, request_id: str, timeout: float) -> int | None:
        # Lookups finish before their reply, so there is never anything to wait for.
        return self.query_prefetch_status(request_id)

    def free_lookup_locks(self, key: IPCCacheServerKey, tp_size: int) -> None:
        with self._lookups_lock:
            session = self._lookups.get(key.request_id)
        if session is not None:
            self._unpin(session)

    def end_session(self, request_id: str) -> None:
        with self._lookups_lock:
            session = self._lookups.pop(request_id, None)
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
