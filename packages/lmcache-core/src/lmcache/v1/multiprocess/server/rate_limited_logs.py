"""Rate-limited logs: a peer can make the server fail or refuse in a loop, and neither
may fill the log (refused admin requests; unexpected handler and transport failures)."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

# Refused admin requests (and other warnings a peer can repeat) are logged at most this
# often, per operation, route or kind.
_REFUSAL_LOG_INTERVAL_S = 60.0
# Operations, routes and kinds are short fixed lists; past this, the rest share one entry.
_REFUSAL_LOG_MAX_KEYS = 64
_OTHER_KINDS = "(other kinds)"
_ERROR_LOG_INTERVAL_S = 60.0
_ERROR_LOG_MAX_KINDS = 256


@dataclasses.dataclass
class _Window:
    next_at: float = 0.0
    suppressed: int = 0


class RateLimitedWarnings:
    """Warnings of a kind at most once per interval, each carrying the count left out; a
    bounded number of kinds (past it, the rest share one window)."""

    def __init__(
        self,
        log: logging.Logger,
        interval_s: float = _REFUSAL_LOG_INTERVAL_S,
        max_kinds: int = _REFUSAL_LOG_MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        self._interval_s = interval_s
        self._max_kinds = max_kinds
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {}

    def warn(self, kind: str, message: str) -> None:
        now = self._clock()
        with self._lock:
            window = self._window(kind)
            if now < window.next_at:
                window.suppressed += 1
                return
            suppressed, window.suppressed = window.suppressed, 0
            window.next_at = now + self._interval_s
        if suppressed:
            message += f"; {suppressed} more like it in the last {self._interval_s:.0f}s"
        self._log.warning("%s", message)

    def _window(self, kind: str) -> _Window:
        window = self._windows.get(kind)
        if window is None:
            if len(self._windows) >= self._max_kinds:
                kind = _OTHER_KINDS
                window = self._windows.get(kind)
            if window is None:
                window = self._windows[kind] = _Window()
        return window


class RefusalLog:
    """Warns about refused admin requests (never the token): at most once per interval for
    each operation or route, with a count of the refusals left out, so a flood of refusals
    on one route neither fills the log nor hides a refusal on another."""

    def __init__(
        self,
        interval_s: float = _REFUSAL_LOG_INTERVAL_S,
        max_keys: int = _REFUSAL_LOG_MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._warnings = RateLimitedWarnings(logger, interval_s, max_keys, clock)

    def note(self, operation: str, reason: str) -> None:
        """``operation``: the wire operation (``clear``) or ``HTTP <route>``."""
        self._warnings.warn(operation, f"refused admin request {operation} ({reason})")


class RateLimitedErrorLog:
    """Unexpected failures: each kind (where, exception type) is logged with its traceback
    once, then at most one line per kind per interval carrying the count left out, so a
    flood of bad requests cannot fill the log."""

    def __init__(
        self,
        log: logging.Logger,
        interval_s: float = _ERROR_LOG_INTERVAL_S,
        max_kinds: int = _ERROR_LOG_MAX_KINDS,
    ) -> None:
        self._log = log
        self._interval_s = interval_s
        self._max_kinds = max_kinds
        self._kinds: dict[str, list[float]] = {}  # kind -> [last logged, left out since]
        self._lock = threading.Lock()

    def exception(self, where: str, exc: BaseException) -> None:
        kind = f"{where}: {type(exc).__name__}"
        now = time.monotonic()
        with self._lock:
            state = self._kinds.get(kind)
            if state is None and len(self._kinds) >= self._max_kinds:
                kind = "other failures"
                state = self._kinds.get(kind)
            if state is None:
                self._kinds[kind] = [now, 0]
                first, left_out = True, 0
            elif now - state[0] < self._interval_s:
                state[1] += 1
                return
            else:
                first, left_out = False, int(state[1])
                state[0], state[1] = now, 0
        if first:
            self._log.error("%s failed (traceback logged once per kind)", where, exc_info=exc)
        else:
            self._log.error(
                "%s failed again: %s: %s (%d more like it in the last %.0fs not logged)",
                where,
                type(exc).__name__,
                exc,
                left_out,
                self._interval_s,
            )
