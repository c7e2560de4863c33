"""Counters of the Redis tier and the circuit breaker (one per tier, one per cluster shard).

While a breaker is open, calls skip Redis (lookups and gets miss, puts are dropped and
counted) until one caller per ``retry_interval_s`` probes it again.
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
    """Circuit breaker: after a connection failure, calls skip Redis until the next probe."""

    def __init__(self, retry_interval_s: float, stats: RedisStats, what: str = "tier") -> None:
        self._interval = retry_interval_s
        self._stats = stats
        self._what = what
        self._lock = threading.Lock()
        self._down = False
        self._next_probe = 0.0

    @property
    def is_up(self) -> bool:
        return not self._down

    def allow(self) -> bool:
        """True if a call may go to Redis (up, or it is time for one probe)."""
        if not self._down:
            return True
        with self._lock:
            now = time.monotonic()
            if now < self._next_probe:
                return False
            self._next_probe = now + self._interval  # one prober per interval
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

    def succeeded(self) -> None:
        if self._down:
            with self._lock:
                if self._down:
                    self._down = False
                    logger.warning("redis %s is reachable again; resumed", self._what)
