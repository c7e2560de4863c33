"""Rate-limited logs: a peer can make the server fail or refuse in a loop, and neither
may fill the log (refused admin requests; unexpected handler and transport failures).

:class:`RateLimitedErrorLog` lives in :mod:`lmcache.logging` (the storage tiers use the
same helpers, and storage never imports the server); it is re-exported here."""

from __future__ import annotations

import logging
import threading
import time

from lmcache.logging import RateLimitedErrorLog

__all__ = ["RateLimitedErrorLog", "RefusalLog"]

logger = logging.getLogger(__name__)

# Refused admin requests are logged at most this often.
_REFUSAL_LOG_INTERVAL_S = 60.0


class RefusalLog:
    """Warns about refused requests (admin requests by default), at most once per interval
    (never the token)."""

    def __init__(
        self, interval_s: float = _REFUSAL_LOG_INTERVAL_S, subject: str = "admin request"
    ) -> None:
        self._interval_s = interval_s
        self._subject = subject
        self._lock = threading.Lock()
        self._next_at = 0.0
        self._suppressed = 0

    def note(self, operation: str, reason: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now < self._next_at:
                self._suppressed += 1
                return
            suppressed, self._suppressed = self._suppressed, 0
            self._next_at = now + self._interval_s
        logger.warning(
            "refused %s %s (%s)%s",
            self._subject,
            operation,
            reason,
            f"; {suppressed} more refused in the last {self._interval_s:.0f}s"
            if suppressed
            else "",
        )
