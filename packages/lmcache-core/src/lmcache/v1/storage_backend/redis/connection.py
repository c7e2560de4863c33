"""Connections to Redis: clients (sync, async, cluster), round-trip counting, the breaker.

:class:`RedisConnections` is the part of the tier that talks to the network: it builds the
clients, runs one operation against them and turns every failure into ``None`` -- a
connection failure also trips the tier's :class:`~.breaker.CircuitBreaker`, so while Redis
is unreachable calls return at once without network I/O.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from lmcache.logging import RateLimitedLog
from lmcache.v1.storage_backend.redis.breaker import CircuitBreaker, RedisStats
from lmcache.v1.storage_backend.redis.settings import RedisSettings

logger = logging.getLogger(__name__)


class RedisUnavailableError(ConnectionError):
    """Redis could not be reached when the tier started (and the tier is not optional)."""


def counting_connection_classes(stats: RedisStats) -> tuple[type, type, type, type]:
    """Connection classes (sync/async, plain/TLS) that count writes, i.e. round trips.

    Per backend, so counters are never shared between backends."""
    import redis.asyncio.connection as aconn
    import redis.connection as conn

    def sync_cls(base: Any) -> type:
        def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
            stats.add(round_trips=1)
            base.send_packed_command(self, command, check_health)

        return type(
            f"Counting{base.__name__}", (base,), {"send_packed_command": send_packed_command}
        )

    def async_cls(base: Any) -> type:
        async def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
            stats.add(round_trips=1)
            await base.send_packed_command(self, command, check_health)

        return type(
            f"Counting{base.__name__}", (base,), {"send_packed_command": send_packed_command}
        )

    return (
        sync_cls(conn.Connection),
        sync_cls(conn.SSLConnection),
        async_cls(aconn.Connection),
        async_cls(aconn.SSLConnection),
    )


def unreachable_errors() -> tuple[type[BaseException], ...]:
    """Errors meaning "Redis (or a shard) cannot be reached": they trip the breaker."""
    import redis
    from redis.exceptions import ClusterError, RedisClusterException

    return (
        redis.ConnectionError,
        redis.TimeoutError,
        ClusterError,
        RedisClusterException,
        OSError,
        asyncio.TimeoutError,
    )


async def aclose_quietly(client: Any) -> None:
    """Close an async client; a failure is logged, never raised (it is being dropped)."""
    try:
        await client.aclose()
    except Exception:
        logger.debug("closing an async redis client failed", exc_info=True)


class RedisConnections:
    """Client management of :class:`~.backend.RedisBackend` (a base class: the attributes
    below are set by the backend's constructor)."""

    settings: RedisSettings
    stats: RedisStats
    loop: asyncio.AbstractEventLoop | None
    _availability: CircuitBreaker
    _error_log: RateLimitedLog
    _classes: tuple[type, type, type, type]
    _client_lock: threading.Lock
    _client: Any
    _aclient: Any
    _closed: bool
    _executor: ThreadPoolExecutor

    def _client_kwargs(self, asynchronous: bool) -> dict[str, Any]:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        s = self.settings
        tls = urlsplit(s.url).scheme == "rediss"
        sync_plain, sync_tls, async_plain, async_tls = self._classes
        if asynchronous:
            connection_class = async_tls if tls else async_plain
            from redis.asyncio.retry import Retry as AsyncRetry

            retry: Any = AsyncRetry(NoBackoff(), 0)
        else:
            connection_class = sync_tls if tls else sync_plain
            retry = Retry(NoBackoff(), 0)
        kwargs: dict[str, Any] = {
            "socket_timeout": s.timeout_s,
            "socket_connect_timeout": s.connect_timeout_s,
            # Failures are handled by the circuit breaker; redis-py's own retries (with
            # backoff of up to seconds) would stall callers instead.
            "retry": retry,
            "connection_class": connection_class,
            "max_connections": s.max_connections,
        }
        if s.username is not None:
            kwargs["username"] = s.username
        if s.password is not None:
            kwargs["password"] = s.password
        if tls:
            kwargs.update(
                ssl_ca_certs=s.ssl_ca_certs,
                ssl_certfile=s.ssl_certfile,
                ssl_keyfile=s.ssl_keyfile,
                ssl_cert_reqs=s.ssl_cert_reqs,
            )
        return kwargs

    def _make_client(self) -> Any:
        import redis
        from redis.cluster import RedisCluster

        kwargs = self._client_kwargs(asynchronous=False)
        client: Any
        if self.settings.cluster:
            client = RedisCluster.from_url(self.settings.url, **kwargs)
        else:
            max_connections = kwargs.pop("max_connections")
            pool = redis.BlockingConnectionPool.from_url(
                self.settings.url,
                max_connections=max_connections,
                timeout=self.settings.timeout_s,
                **kwargs,
            )
            client = redis.Redis(connection_pool=pool)
        client.ping()
        return client

    def _get_client(self) -> Any:
        """The sync client, created on first use (or on a probe while Redis was down)."""
        client = self._client
        if client is not None:
            return client
        with self._client_lock:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def _connect_at_start(self) -> None:
        import redis

        try:
            self._get_client()
        except (*unreachable_errors(), redis.RedisError) as exc:  # type: ignore[misc]
            if not self.settings.optional:
                self._executor.shutdown(wait=False)
                raise RedisUnavailableError(
                    f"cannot reach Redis at {self.settings.redacted()['url']} "
                    f"({type(exc).__name__}: {exc}); set the tier optional to start without it"
                ) from exc
            self._availability.failed(exc)
        else:
            logger.info("redis tier connected: %s", self)

    def _run(self, op: Callable[[Any], Any], what: str) -> Any:
        """``op(client)`` unless Redis is known down; None (and breaker tripped) on failure."""
        import redis

        if self._closed or not self._availability.allow():
            return None
        try:
            result = op(self._get_client())
        except unreachable_errors() as exc:
            self._on_connection_error(exc)
            return None
        except redis.RedisError as exc:
            self._on_redis_error(exc, what)
            return None
        self._availability.succeeded()
        return result

    def _on_redis_error(self, exc: BaseException, what: str) -> None:
        self.stats.add(errors=1)
        self._availability.answered(exc)
        self._error_log.log(
            logging.WARNING, f"{what}: {type(exc).__name__}", "redis %s failed: %s", what, exc
        )

    def _on_connection_error(self, exc: BaseException) -> None:
        self.stats.add(errors=1)
        self._availability.failed(exc)
        if self.settings.cluster:
            # A cluster client holds a slot map that may be stale once nodes come back.
            with self._client_lock:
                client, self._client = self._client, None
            if client is not None:
                try:
                    client.close()
                except Exception:
                    logger.debug("closing the stale cluster client failed", exc_info=True)

    @property
    def available(self) -> bool:
        """False while Redis is known to be unreachable."""
        return self._availability.is_up

    def health_degraded(self) -> list[str]:
        """Why the tier serves less than it should (empty when it serves fully): its
        breaker is open -- lookups miss and puts are dropped until a probe succeeds."""
        if self._availability.is_up:
            return []
        return [
            f"redis {self.settings.redacted()['url']} unreachable: circuit breaker open, "
            "lookups miss and puts are dropped until a probe succeeds"
        ]

    def get_stats(self) -> dict[str, int]:
        return self.stats.snapshot()

    def _make_async_client(self) -> Any:
        import redis.asyncio as aredis
        from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

        kwargs = self._client_kwargs(asynchronous=True)
        if self.settings.cluster:
            kwargs.pop("max_connections")
            return AsyncRedisCluster.from_url(self.settings.url, **kwargs)
        return aredis.Redis.from_url(self.settings.url, **kwargs)

    async def _run_async(self, op: Callable[[Any], Any], what: str) -> Any:
        """Async twin of :meth:`_run`.  A client is kept for ``loop`` (the server's event
        loop); on any other loop a client lives for one call, as its connections are bound
        to the loop that opened them."""
        import redis

        if self._closed or not self._availability.allow():
            return None
        persistent = self.loop is not None and asyncio.get_running_loop() is self.loop
        client = self._aclient if persistent else None
        try:
            if client is None:
                client = self._make_async_client()
                if persistent:
                    self._aclient = client
            result = await op(client)
        except unreachable_errors() as exc:
            self._on_connection_error(exc)
            if persistent:
                self._aclient = None
                await aclose_quietly(client)
            return None
        except redis.RedisError as exc:
            self._on_redis_error(exc, what)
            return None
        finally:
            if not persistent and client is not None:
                await aclose_quietly(client)
        self._availability.succeeded()
        return result
