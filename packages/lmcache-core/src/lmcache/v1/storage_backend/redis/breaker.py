"""Counters of the Redis tier and the circuit breaker (one per tier, one per cluster shard).

While a breaker is open, calls skip Redis (lookups and gets miss, puts are dropped and
counted) until a single half-open probe, ``retry_interval_s`` after the last failure,
finds it back.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, fields

logger = logging.getLogger(__name__)


@dataclass
class RedisStats:
    """Counters of one backend (read with :meth:`RedisBackend.get_stats`)."""

    round_trips: int = 0
    puts: int = 0
    put_bytes: int = 0
    puts_dropped: int = 0
    """Puts that did not land: Redis down or failing, or the put queue full."""
    puts_queue_full: int = 0
    """Of ``puts_dropped``: refused at once because the put queue was full."""
    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    errors: int = 0
    outages: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_lock"}


class CircuitBreaker:
    """Circuit breaker: the first connection failure (a refusal or a timeout) opens it;
    while open, calls skip Redis and fail fast.  Once ``retry_interval_s`` has passed since
    the last failure, exactly one call goes through as the half-open probe -- every other
    call keeps failing fast while it is in flight -- and its success closes the breaker.

    So with Redis hung, at most one call per ``retry_interval_s`` (plus the probe's own
    timeout) waits for the socket timeout; a probe that fails reopens the breaker and the
    next one comes ``retry_interval_s`` after that failure.  A probe that neither succeeds
    nor fails (its caller died of something else) is given up after ``probe_timeout_s``.
    """

    def __init__(
        self,
        retry_interval_s: float,
        stats: RedisStats,
        what: str = "tier",
        probe_timeout_s: float | None = None,
    ) -> None:
        self._interval = retry_interval_s
        self._probe_timeout = probe_timeout_s if probe_timeout_s is not None else 60.0
        self._stats = stats
        self._what = what
        self._lock = threading.Lock()
        self._down = False
        self._next_probe = 0.0
        self._probe_until = 0.0  # a half-open probe is in flight until then

    @property
    def is_up(self) -> bool:
        return not self._down

    def allow(self) -> bool:
        """True if a call may go to Redis: the breaker is closed, or this call is the one
        half-open probe."""
        if not self._down:
            return True
        with self._lock:
            if not self._down:
                return True
            now = time.monotonic()
            if now < self._next_probe or now < self._probe_until:
                return False
            self._probe_until = now + self._probe_timeout
            return True

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            if not self._down:
                self._down = True
                self._stats.add(outages=1)
                logger.warning(
                    "redis %s unavailable (%s: %s): lookups miss and puts are dropped "
                    "until it is back (probing every %.1fs)",
                    self._what,
                    type(exc).__name__,
                    exc,
                    self._interval,
                )
            self._next_probe = time.monotonic() + self._interval
            self._probe_until = 0.0

    def answered(self, exc: BaseException) -> None:
        """A call got an error that is no connection failure: a reply from Redis (a
        ``ResponseError``) proves it reachable; anything else proves nothing, and only ends
        a half-open probe so another may go."""
        import redis

        if isinstance(exc, redis.ResponseError):
            self.succeeded()
        else:
            with self._lock:
                self._probe_until = 0.0

    def succeeded(self) -> None:
        if self._down:
            with self._lock:
                if self._down:
                    self._down = False
                    self._probe_until = 0.0
                    logger.warning("redis %s is reachable again; resumed", self._what)
