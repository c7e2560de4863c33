"""Rate-limited logs: a peer can make the server fail or refuse in a loop, and neither
may fill the log (refused admin requests; unexpected handler and transport failures).

The generic helpers (:class:`~lmcache.logging.RateLimitedLog`,
:class:`~lmcache.logging.RateLimitedErrorLog`) live in :mod:`lmcache.logging`, where the
storage tiers use them too (storage never imports the server); the error log is
re-exported here."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from lmcache.logging import RateLimitedErrorLog, RateLimitedLog

__all__ = ["RateLimitedErrorLog", "RefusalLog"]

logger = logging.getLogger(__name__)

# Refused requests are logged at most this often per operation or route.
_REFUSAL_LOG_INTERVAL_S = 60.0
# Operations and routes are short fixed lists; past this, the rest share one entry.
_REFUSAL_LOG_MAX_KEYS = 64


class RefusalLog:
    """Warns about refused requests (never the token): at most once per interval for each
    operation or route, with a count of the refusals left out, so a flood of refusals on one
    route neither fills the log nor hides a refusal on another."""

    def __init__(
        self,
        interval_s: float = _REFUSAL_LOG_INTERVAL_S,
        subject: str = "admin request",
        max_keys: int = _REFUSAL_LOG_MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._subject = subject
        self._limit = RateLimitedLog(logger, interval_s, max_keys, clock)

    def note(self, operation: str, reason: str) -> None:
        """``operation``: the wire operation (``clear``) or ``HTTP <route>``."""
        self._limit.log(
            logging.WARNING, operation, "refused %s %s (%s)", self._subject, operation, reason
        )
