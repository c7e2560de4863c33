"""The connector's view of the MP server: ``MPClient`` plus a shared up/down flag.

``lmcache.v1.multiprocess.worker.client.MPClient`` already bounds every call with a timeout.  What
the connector adds is fail-fast behaviour once the server is gone: the first timeout (or
a failed heartbeat) marks the server down, and later calls raise at once instead of each
waiting out its own timeout, so vLLM keeps serving (as cache misses) at full speed.  A
successful heartbeat marks it up again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from lmcache.v1.multiprocess.worker.client import MPClient, MPClientError, ServerUnavailableError

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ServerHealth:
    """Shared up/down flag; transitions are logged once."""

    def __init__(self) -> None:
        self._down = threading.Event()
        self._lock = threading.Lock()
        self.last_error = ""

    @property
    def is_down(self) -> bool:
        return self._down.is_set()

    def mark_down(self, reason: str) -> None:
        with self._lock:
            if not self._down.is_set():
                logger.warning(
                    "LMCache server unreachable (%s); vLLM continues without the cache", reason
                )
            self._down.set()
            self.last_error = reason

    def mark_up(self) -> None:
        with self._lock:
            if self._down.is_set():
                logger.warning("LMCache server reachable again; cache re-enabled")
            self._down.clear()


def connect(url: str, timeout: float, start_hint: str) -> MPClient:
    """A handshaken client, or ``ConnectionError`` saying how to start a server."""
    try:
        return MPClient(url, timeout=timeout, connect_timeout=min(timeout, 10.0))
    except ServerUnavailableError as exc:
        raise ConnectionError(
            f"LMCacheMPConnector cannot reach the LMCache server at {url} ({exc}). "
            f"Start one first, e.g.:\n    {start_hint}\n"
            "or point lmcache.mp.host / lmcache.mp.port (kv_connector_extra_config) at it."
        ) from None


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


class HeartbeatThread(threading.Thread):
    """Pings every ``interval`` seconds on its own connection; flips the health flag."""

    def __init__(
        self,
        url: str,
        health: ServerHealth,
        interval: float,
        instance_id: int | None = None,
    ) -> None:
        super().__init__(name="lmcache-mp-heartbeat", daemon=True)
        self._url = url
        self._health = health
        self._interval = interval
        self._instance_id = instance_id
        self._stop_event = threading.Event()
        self._timeout = max(1.0, min(interval, 5.0))

    def run(self) -> None:
        client: Any = None
        while not self._stop_event.wait(self._interval):
            try:
                if client is None:
                    client = MPClient(
                        self._url, timeout=self._timeout, connect_timeout=self._timeout
                    )
                client.ping(self._instance_id)
                self._health.mark_up()
            except MPClientError as exc:
                self._health.mark_down(f"heartbeat: {exc}")
                if client is not None:
                    client.close()
                client = None
        if client is not None:
            client.close()

    def stop(self) -> None:
        self._stop_event.set()
