"""The connector's link to the MP server: one client, a health flag, and restart detection.

``lmcache.v1.multiprocess.worker.client.MPClient`` already bounds every call with a timeout.
What the connector adds:

* fail-fast once the server is gone: the first timeout (or failed heartbeat) marks it down
  and later calls raise at once, so vLLM keeps serving (as cache misses) at full speed;
* a server that is unreachable when vLLM starts is not fatal: the cache stays off until
  the heartbeat reaches it;
* restarts: the heartbeat reads the server's incarnation (``ServerStats.server_incarnation``,
  a random id drawn at server start).  When it changes, or the server comes back after an
  outage, the link's ``generation`` grows and its listeners run (the worker side registers
  its KV cache again), and only then is the cache switched back on.

Every outage is logged once as a warning; the recovery is logged at INFO.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from lmcache.v1.multiprocess.wire.curve import CurveClientKeys
from lmcache.v1.multiprocess.worker.client import (
    MPClient,
    MPClientError,
    ServerError,
    ServerUnavailableError,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ServerHealth:
    """Shared up/down flag; the switch to down is logged once per outage."""

    def __init__(self, url: str = "") -> None:
        self.url = url  # named in the messages: with several servers, which one
        self._down = threading.Event()
        self._lock = threading.Lock()
        self._warned = False
        self.last_error = ""

    @property
    def is_down(self) -> bool:
        return self._down.is_set()

    def mark_down(self, reason: str, *, warn: bool = True) -> None:
        """Switch the cache off; ``warn=False`` when the caller logs the outage itself."""
        with self._lock:
            self._down.set()
            self.last_error = reason
            if not warn:
                self._warned = True
        if warn:
            self.warn_once(
                "LMCache server %s unreachable (%s); vLLM continues without it",
                self.url,
                reason,
            )

    def mark_up(self) -> None:
        with self._lock:
            was_down = self._down.is_set()
            self._down.clear()
            self._warned = False
        if was_down:
            logger.info("LMCache server %s reachable; cache enabled", self.url)

    def warn_once(self, message: str, *args: Any) -> None:
        """A warning for the first problem of an outage, DEBUG for the rest of it."""
        with self._lock:
            first, self._warned = not self._warned, True
        (logger.warning if first else logger.debug)(message, *args)


class GuardedClient:
    """Runs client calls through the health flag."""

    def __init__(self, client: MPClient, health: ServerHealth) -> None:
        self.client = client
        self.health = health

    def run(self, what: str, call: Callable[[MPClient], T]) -> T:
        """``call(client)``; raises ``ServerUnavailableError`` at once while down."""
        if self.health.is_down:
            raise ServerUnavailableError(f"server is down ({self.health.last_error})")
        try:
            return call(self.client)
        except ServerUnavailableError as exc:
            self.health.mark_down(f"{what}: {exc}")
            raise

    def close(self) -> None:
        try:
            self.client.close()
        except MPClientError:
            logger.debug("closing the MP client failed", exc_info=True)


# A listener runs on the heartbeat thread when a new server incarnation answers; raising
# keeps the cache off (the next heartbeat retries).
Listener = Callable[[], None]


class ServerLink:
    """One connector side's connection to one server, across its restarts.

    ``open`` connects (quietly failing when the server is not there yet); ``client`` and
    ``chunk_size`` are None until it succeeds.  ``check`` (called by the heartbeat) notices
    a new incarnation and bumps ``generation``.
    """

    def __init__(
        self,
        url: str,
        mq_timeout: float,
        start_hint: str,
        block_size: int,
        curve: CurveClientKeys | None = None,
    ) -> None:
        self.url = url
        self.health = ServerHealth(url)
        self.mq_timeout = mq_timeout
        self.curve = curve  # lmcache.mp.curve_*: every connection of this link uses them
        self.start_hint = start_hint
        self.block_size = block_size
        self.guarded: GuardedClient | None = None
        self.chunk_size: int | None = None
        self.incarnation: str | None = None
        self.generation = 0  # grows with every new server incarnation this link meets
        self._listeners: list[Listener] = []
        # Registered workers the heartbeat keeps alive: the server reaps a worker it has not
        # heard from for --worker-reap-timeout (120 s), and one long prefill (minutes on a
        # CPU) sends nothing else.
        self._instance_ids: set[int] = set()
        self._lock = threading.Lock()  # open/check vs. close

    @property
    def ready(self) -> bool:
        """Connected, chunk size known, and not marked down."""
        return self.guarded is not None and not self.health.is_down

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def keep_alive(self, instance_id: int) -> None:
        """Ping ``instance_id`` on every heartbeat; a server that forgot it (reaped) is
        treated like a new incarnation, so the listeners register again."""
        self._instance_ids.add(instance_id)

    def run(self, what: str, call: Callable[[MPClient], T]) -> T:
        guarded = self.guarded
        if guarded is None:
            raise ServerUnavailableError(f"not connected to the LMCache server at {self.url}")
        return guarded.run(what, call)

    def open(self, timeout: float | None = None, *, warn: bool = True) -> bool:
        """Connect and read the chunk size; False (cache off) if the server is unreachable.

        ``warn=False``: the caller logs the failure (with the start-up hint).  A chunk size
        that is not a multiple of vLLM's block size is a configuration error and raises
        ``ValueError``.
        """
        wait = self.mq_timeout if timeout is None else timeout
        client: MPClient | None = None
        try:
            client = MPClient(
                self.url, timeout=wait, connect_timeout=min(wait, 10.0), curve=self.curve
            )
            chunk_size = int(client.get_chunk_size())
            incarnation = _incarnation(client)
        except ServerUnavailableError as exc:
            if client is not None:
                client.close()
            self.health.mark_down(str(exc), warn=warn)
            return False
        if chunk_size % self.block_size:
            client.close()
            suggested = max(self.block_size, chunk_size // self.block_size * self.block_size)
            raise ValueError(
                f"the LMCache server's chunk size ({chunk_size}) must be a multiple of "
                f"vLLM's block size ({self.block_size}); restart the server with "
                f"--chunk-size {suggested}"
            )
        client.timeout = self.mq_timeout  # for the registration that follows
        with self._lock:
            self.chunk_size = chunk_size
            self.guarded = GuardedClient(client, self.health)
            self.incarnation = incarnation
        return True

    def check(self, probe: MPClient) -> None:
        """One heartbeat over ``probe`` (the heartbeat's own connection)."""
        if self.guarded is None:
            if not self.open(timeout=probe.timeout):
                return
            self._new_incarnation("server reachable")
            return
        try:
            incarnation = _incarnation(probe)
            forgotten = self._ping_registered(probe)
        except MPClientError as exc:
            self.health.mark_down(f"heartbeat: {exc}")
            return
        if incarnation != self.incarnation:
            self.incarnation = incarnation
            self._new_incarnation("server restarted")
        elif forgotten:
            self._new_incarnation(f"server no longer knows worker(s) {sorted(forgotten)}")
        elif self.health.is_down:
            # Back after an outage: an upstream server shows no incarnation, so treat the
            # return as a restart (re-registering with a server that kept us is harmless).
            self._new_incarnation("server reachable again")
        else:
            self.health.mark_up()

    def _ping_registered(self, probe: MPClient) -> list[int]:
        """Refresh every kept-alive worker on the server; the ids it does not know."""
        if not self._instance_ids:
            probe.ping(None)
            return []
        return [i for i in sorted(self._instance_ids) if not probe.ping(i)]

    def _new_incarnation(self, why: str) -> None:
        self.generation += 1
        logger.info("LMCache server at %s: %s (generation %d)", self.url, why, self.generation)
        for listener in self._listeners:
            try:
                listener()
            except (MPClientError, ValueError, RuntimeError) as exc:
                self.health.mark_down(f"re-registering: {exc}")
                self.incarnation = None  # retry on the next heartbeat
                return
        self.health.mark_up()

    def close(self) -> None:
        with self._lock:
            guarded, self.guarded = self.guarded, None
        if guarded is not None:
            guarded.close()


def _incarnation(client: MPClient) -> str:
    """The server's incarnation id; "" for a server that reports none (upstream, older)."""
    if client.server_is_upstream:
        return ""
    try:
        return str(client.get_stats().server_incarnation)
    except ServerError:
        return ""


class HeartbeatThread(threading.Thread):
    """Every ``interval`` seconds runs ``ServerLink.check`` on its own connection."""

    def __init__(self, link: ServerLink, interval: float) -> None:
        super().__init__(name="lmcache-mp-heartbeat", daemon=True)
        self._link = link
        self._interval = interval
        self._stop_event = threading.Event()
        self._timeout = max(1.0, min(interval, 5.0))

    def run(self) -> None:
        probe: MPClient | None = None
        while not self._stop_event.wait(self._interval):
            try:
                if probe is None:
                    probe = MPClient(
                        self._link.url,
                        timeout=self._timeout,
                        connect_timeout=self._timeout,
                        curve=self._link.curve,
                    )
                self._link.check(probe)
            except MPClientError as exc:
                self._link.health.mark_down(f"heartbeat: {exc}")
                if probe is not None:
                    probe.close()
                probe = None
            except Exception:
                # The heartbeat must outlive any surprise; the cache stays off meanwhile.
                logger.exception("LMCache heartbeat failed")
                self._link.health.mark_down("heartbeat error")
        if probe is not None:
            probe.close()

    def stop(self) -> None:
        self._stop_event.set()
