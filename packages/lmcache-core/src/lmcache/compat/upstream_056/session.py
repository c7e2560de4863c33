"""Upstream LMCache 0.5.6's ``lmcache.v1.multiprocess.session``: per-request state of the
multiprocess cache server.

A :class:`Session` holds one request's token ids and the rolling chunk hashes computed
from them so far (by a :class:`~upstream_056.token_hasher.TokenHasher`), so a
lookup and the stores and retrieves that follow it hash each chunk once.  A
:class:`SessionManager` keeps the sessions by request id, drops them after ``ttl`` seconds
(counted from creation, as upstream) and, unless ``cleanup_interval`` is None, does that on
a background :class:`~upstream_056.periodic_thread.PeriodicThread` listed in the per-process
:class:`~upstream_056.periodic_thread.PeriodicThreadRegistry` until :meth:`SessionManager.close`.

Differences from upstream, on purpose:

* ``set_tokens`` keeps the hashes of the chunks whose tokens are unchanged and forgets the
  rest (upstream keeps every computed hash, so replacing tokens inside the hashed prefix
  returned stale hashes), and it stores a copy of the list.
* Misaligned ``start`` / ``end`` raise :class:`ValueError` (upstream asserts).
* Upstream's lookup-lock bookkeeping for its own server's L1 (``begin_lookup``,
  ``record_prefetch_result``, failed-retrieve release claims) is left out: lmcache-core's
  server (:mod:`lmcache.v1.multiprocess.server`) tracks its pins itself.  ``extras`` is
  kept for callers that attach their own per-request state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lmcache.compat.upstream_056.periodic_thread import (
    PeriodicThread,
    PeriodicThreadRegistry,
    ThreadLevel,
    ThreadRunSummary,
    create_periodic_thread,
)
from lmcache.compat.upstream_056.token_hasher import TokenHasher
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey

logger = logging.getLogger(__name__)

__all__ = ["Session", "SessionManager"]


@dataclass(eq=False)
class Session:
    """One request's tokens and the chunk hashes computed so far.

    Every method takes the session's lock: the tensor-parallel workers of one request may
    call it from several threads at once.  ``chunk_hashes[i]`` is the hash of chunk ``i``
    chained on all chunks before it, in the hasher's own type (``bytes`` for blake3).
    """

    request_id: str
    hasher: TokenHasher
    token_ids: list[int] = field(default_factory=list)
    chunk_hashes: list[Any] = field(default_factory=list)
    last_prefix_hash: Any = None
    num_chunks_processed: int = 0
    created_at: float = field(default_factory=time.time)
    lookup_ipc_key: IPCCacheServerKey | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def set_tokens(self, full_token_ids: Sequence[int]) -> None:
        """Replace the token sequence (the whole prompt so far, not an increment).

        Hashes of leading chunks whose tokens did not change are kept.
        """
        tokens = list(full_token_ids)
        chunk = self.hasher.chunk_size
        with self._lock:
            old = self.token_ids
            self.token_ids = tokens
            keep = 0
            while keep < self.num_chunks_processed:
                begin = keep * chunk
                end = begin + chunk
                if end > len(tokens) or tokens[begin:end] != old[begin:end]:
                    break
                keep += 1
            if keep < self.num_chunks_processed:
                del self.chunk_hashes[keep:]
                self.num_chunks_processed = keep
                self.last_prefix_hash = self.chunk_hashes[-1] if keep else None

    def get_hashes(self, start: int, end: int | None = None) -> list[Any]:
        """Hashes of the chunks covering tokens ``[start, end)``.

        ``start`` and ``end`` are token indices on chunk boundaries; without ``end`` the
        range runs to the last complete chunk.  Chunks hashed before are not hashed again.

        Raises:
            ValueError: a bound not on a chunk boundary, or ``end`` past the tokens set
                (hashing tokens that are not there would give plausible wrong keys).
        """
        chunk = self.hasher.chunk_size
        if start < 0 or start % chunk:
            raise ValueError(f"start ({start}) must be a non-negative multiple of {chunk}")
        with self._lock:
            count = len(self.token_ids)
            if end is None:
                end = count - count % chunk
            elif end > count:
                raise ValueError(
                    f"get_hashes end ({end}) is past the session's {count} token(s); the "
                    "session may have been dropped and recreated (ttl) since its tokens were set"
                )
            elif end < 0 or end % chunk:
                raise ValueError(f"end ({end}) must be a non-negative multiple of {chunk}")
            last_chunk = end // chunk
            self._hash_up_to(last_chunk)
            return self.chunk_hashes[start // chunk : last_chunk]

    def _hash_up_to(self, num_chunks: int) -> None:
        """Extend the rolling hashes to the first ``num_chunks`` chunks (lock held)."""
        chunk = self.hasher.chunk_size
        while self.num_chunks_processed < num_chunks:
            begin = self.num_chunks_processed * chunk
            # hash_tokens chains on the hasher's none_hash when the prefix is None.
            digest = self.hasher.hash_tokens(
                self.token_ids[begin : begin + chunk], self.last_prefix_hash
            )
            self.chunk_hashes.append(digest)
            self.last_prefix_hash = digest
            self.num_chunks_processed += 1


class SessionManager:
    """Sessions by request id, dropped ``ttl`` seconds after they were created."""

    DEFAULT_SESSION_TTL = 600.0
    DEFAULT_CLEANUP_INTERVAL = 60.0

    def __init__(
        self,
        hasher: TokenHasher,
        ttl: float = DEFAULT_SESSION_TTL,
        cleanup_interval: float | None = DEFAULT_CLEANUP_INTERVAL,
    ) -> None:
        self._hasher = hasher
        self._ttl = ttl
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        #: Called (without the manager's lock) with every session removed or expired, so
        #: whoever keeps per-request state elsewhere can release it.  A listener that
        #: raises is logged and the others still run.
        self.destroy_listeners: list[Callable[[Session], None]] = []
        self._cleanup_thread: PeriodicThread | None = None
        if cleanup_interval is not None and cleanup_interval > 0:
            self._cleanup_thread = create_periodic_thread(
                # id() keeps two managers in one process from replacing each other's entry.
                name=f"SessionManager-cleanup-thread-{id(self):x}",
                interval=cleanup_interval,
                execute_fn=self._cleanup_cycle,
                level=ThreadLevel.MEDIUM,
            )
            self._cleanup_thread.start()

    def get_or_create(self, request_id: str) -> Session:
        with self._lock:
            session = self._sessions.get(request_id)
            if session is None:
                session = Session(request_id=request_id, hasher=self._hasher)
                self._sessions[request_id] = session
                logger.debug("Created session for request %s", request_id)
            return session

    def get(self, request_id: str) -> Session | None:
        """The session of ``request_id`` if there is one (never creates it)."""
        with self._lock:
            return self._sessions.get(request_id)

    def remove(self, request_id: str) -> Session | None:
        """Drop and return the session of ``request_id`` (None when there is none)."""
        with self._lock:
            session = self._sessions.pop(request_id, None)
        if session is not None:
            logger.debug("Removed session for request %s", request_id)
            self._notify_destroyed(session)
        return session

    def cleanup_expired(self) -> int:
        """Drop the sessions older than the TTL; returns how many."""
        cutoff = time.time() - self._ttl
        with self._lock:
            expired = [s for s in self._sessions.values() if s.created_at < cutoff]
            for session in expired:
                del self._sessions[session.request_id]
        for session in expired:
            self._notify_destroyed(session)
        if expired:
            logger.info("Dropped %d expired session(s)", len(expired))
        return len(expired)

    def active_count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def close(self) -> None:
        """Stop the cleanup thread and take it out of the registry (idempotent).  The
        sessions themselves stay until removed."""
        thread, self._cleanup_thread = self._cleanup_thread, None
        if thread is None:
            return
        registry = PeriodicThreadRegistry.get_instance()
        # Only our own entry: reset() may have replaced the registry since start.
        if registry.get(thread.name) is thread:
            registry.unregister(thread.name)
        thread.stop()

    def _notify_destroyed(self, session: Session) -> None:
        for listener in list(self.destroy_listeners):
            try:
                listener(session)
            except Exception:
                logger.exception("Session destroy listener failed for %s", session.request_id)

    def _cleanup_cycle(self) -> ThreadRunSummary:
        removed = self.cleanup_expired()
        return ThreadRunSummary(
            message=f"Removed {removed} expired sessions",
            extra_info={"removed_sessions": str(removed)},
        )
