"""The scheduler's lookups, run on a background thread (``nonblocking_lookup_status``).

vLLM's scheduler thread must not wait on the network: a server that hangs would stall
every request, not only the ones it serves.  So with ``lmcache.mp.nonblocking_lookup_status``
(the default) the scheduler side only queues work here and reads results; this thread
sends each ``lookup`` (which starts the server's background prefetch of the hit from lower
tiers), polls ``query_prefetch_status`` until the server answers with the hit, and sends
``end_session`` when a request ends.  The server's ``query_prefetch_status`` never blocks,
so one slow prefetch does not hold up the others.

Free of vLLM imports so it can be unit-tested with fakes.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING, Any

from lmcache.integration.vllm.mp_client import ServerLink
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.worker.client import MPClient, MPClientError

if TYPE_CHECKING:
    from lmcache.integration.vllm.server_placement import LinkGroup

logger = logging.getLogger(__name__)

# A lookup that failed (server error or down): the request bypasses LMCache.
LOOKUP_FAILED = -1
# Pause between status polls while some prefetch is still running.
POLL_INTERVAL_S = 0.002


class LookupThread:
    """One per scheduler side; started on first use, stopped by ``close``."""

    def __init__(self, link: ServerLink | LinkGroup, world_size: int, call_timeout: float) -> None:
        self._link = link
        self._world_size = world_size
        self._timeout = call_timeout
        self._commands: queue.Queue[tuple[str, str, IPCCacheServerKey | None]] = queue.Queue()
        self._results: dict[str, int | None] = {}  # request id -> None while pending
        self._lock = threading.Lock()
        self._polling: list[str] = []  # owned by the thread
        self._thread: threading.Thread | None = None

    # -- scheduler thread ---------------------------------------------------------------------

    def submit(self, request_id: str, key: IPCCacheServerKey) -> None:
        with self._lock:
            self._results[request_id] = None
        self._send("lookup", request_id, key)

    def result(self, request_id: str) -> int | None:
        """The hit (chunks), ``LOOKUP_FAILED``, or None while pending (or never submitted)."""
        with self._lock:
            return self._results.get(request_id)

    def end_session(self, request_id: str) -> None:
        """Forget the request and release its lookup session on the server."""
        with self._lock:
            self._results.pop(request_id, None)
        self._send("end_session", request_id, None)

    def forget(self, request_id: str) -> None:
        """Forget the request; its session died with an earlier server incarnation."""
        with self._lock:
            self._results.pop(request_id, None)
        self._send("forget", request_id, None)

    def _send(self, what: str, request_id: str, key: IPCCacheServerKey | None) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lmcache-lookup", daemon=True)
            self._thread.start()
        self._commands.put((what, request_id, key))

    def close(self) -> None:
        """Stop after the commands already queued (e.g. the last ``end_session``)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._commands.put(("stop", "", None))
            thread.join(timeout=2 * self._timeout)

    # -- background thread --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                wait = POLL_INTERVAL_S if self._polling else 0.5
                command = self._commands.get(timeout=wait)
            except queue.Empty:
                command = None
            if command is not None and command[0] == "stop":
                return
            try:
                if command is not None:
                    self._handle(*command)
                    continue  # drain queued commands before the next round of polls
                self._poll_all()
            except Exception:
                # The thread must outlive any surprise; pending lookups time out as misses.
                logger.exception("LMCache lookup thread")

    def _handle(self, what: str, request_id: str, key: IPCCacheServerKey | None) -> None:
        if what == "lookup" and key is not None:
            self._send_lookup(request_id, key)
        elif what in ("end_session", "forget"):
            if request_id in self._polling:
                self._polling.remove(request_id)
            if what == "end_session":
                self._call("end_session", request_id)

    def _send_lookup(self, request_id: str, key: IPCCacheServerKey) -> None:
        try:
            self._link.run(
                "lookup",
                lambda c: c.call("lookup", key, self._world_size, timeout=self._timeout),
            )
        except (MPClientError, ValueError) as exc:
            logger.debug("lookup for %s failed (%s); treating as a miss", request_id, exc)
            self._set(request_id, LOOKUP_FAILED)
            return
        self._polling.append(request_id)

    def _poll_all(self) -> None:
        still: list[str] = []
        for request_id in self._polling:
            try:
                hit = self._query_status(request_id)
            except (MPClientError, ValueError) as exc:
                logger.debug("lookup status of %s failed (%s): a miss", request_id, exc)
                self._set(request_id, LOOKUP_FAILED)
                continue
            if hit is None:
                still.append(request_id)
            else:
                self._set(request_id, int(hit))
        self._polling = still

    def _query_status(self, request_id: str) -> int | None:
        def query(client: MPClient) -> int | None:
            answer: int | None = client.call(
                "query_prefetch_status", request_id, timeout=self._timeout
            )
            return answer

        return self._link.run("query_prefetch_status", query)

    def _set(self, request_id: str, value: int) -> None:
        with self._lock:
            if request_id in self._results:  # not ended meanwhile
                self._results[request_id] = value

    def _call(self, what: str, *args: Any) -> None:
        try:
            self._link.run(what, lambda c: c.call(what, *args, timeout=self._timeout))
        except MPClientError as exc:
            logger.debug("%s%r failed: %s", what, args, exc)
