"""Logging setup for lmcache processes.

Library modules only call ``logging.getLogger(__name__)``; processes we own (the CLI, the
server) call :func:`init_logger` once to attach a handler to the ``lmcache`` logger.  The
format keeps upstream's ``LMCache <LEVEL>:`` prefix so existing log scrapers still match.

:class:`RateLimitedLog` and :class:`RateLimitedErrorLog` keep failures that can repeat in a
loop (a full disk, a hung peer, a hostile client) from filling the log; they live here, at
the bottom of the layers, so the storage tiers and the server share them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

LOG_FORMAT = "[%(asctime)s] LMCache %(levelname)s: %(message)s (%(filename)s:%(lineno)d:%(name)s)"
_HANDLER_MARK = "_lmcache_handler"


def resolve_level(level: str | int | None = None) -> int:
    """Level from the argument, else ``LMCACHE_LOG_LEVEL``, else INFO."""
    value = level if level is not None else os.environ.get("LMCACHE_LOG_LEVEL", "INFO")
    if isinstance(value, int):
        return value
    resolved = logging.getLevelName(value.strip().upper())
    if not isinstance(resolved, int):
        raise ValueError(f"unknown log level {value!r} (LMCACHE_LOG_LEVEL / --log-level)")
    return resolved


def init_logger(level: str | int | None = None) -> logging.Logger:
    """Attach one stderr handler to the ``lmcache`` logger (idempotent) and set its level."""
    root = logging.getLogger("lmcache")
    root.setLevel(resolve_level(level))
    if not any(getattr(h, _HANDLER_MARK, False) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        setattr(handler, _HANDLER_MARK, True)
        root.addHandler(handler)
    return root


_RATE_LIMIT_INTERVAL_S = 60.0
_RATE_LIMIT_MAX_KINDS = 256


class RateLimitedLog:
    """At most one line per kind of event per interval, carrying how many were left out.

    For failures that can repeat in a loop (a full disk, an unreachable peer, a hostile
    client): the first of a kind is logged at once, later ones within ``interval_s`` are
    only counted and reported by the next line of that kind.  Kinds are capped at
    ``max_kinds`` (the rest share one "other" kind), so the table cannot grow without bound.
    """

    def __init__(
        self,
        log: logging.Logger,
        interval_s: float = _RATE_LIMIT_INTERVAL_S,
        max_kinds: int = _RATE_LIMIT_MAX_KINDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        self._interval_s = interval_s
        self._max_kinds = max_kinds
        self._clock = clock
        self._kinds: dict[str, list[float]] = {}  # kind -> [last logged, left out since]
        self._lock = threading.Lock()

    @property
    def interval_s(self) -> float:
        return self._interval_s

    def admit(self, kind: str) -> tuple[bool, int] | None:
        """None when this event is to be left out (and counted); else ``(first, left_out)``:
        whether it is the first of its kind, and how many were left out since the last."""
        now = self._clock()
        with self._lock:
            state = self._kinds.get(kind)
            if state is None and len(self._kinds) >= self._max_kinds:
                kind = "other"
                state = self._kinds.get(kind)
            if state is None:
                self._kinds[kind] = [now, 0]
                return True, 0
            if now - state[0] < self._interval_s:
                state[1] += 1
                return None
            left_out = int(state[1])
            state[0], state[1] = now, 0
            return False, left_out

    def log(
        self,
        level: int,
        kind: str,
        msg: str,
        *args: object,
        exc_info: BaseException | None = None,
    ) -> bool:
        """Log ``msg % args`` unless ``kind`` was logged less than an interval ago; the
        line ends with the count left out since.  True if it was logged."""
        admitted = self.admit(kind)
        if admitted is None:
            return False
        _, left_out = admitted
        suffix = (
            f" ({left_out} more like it in the last {self._interval_s:.0f}s not logged)"
            if left_out
            else ""
        )
        self._log.log(level, msg + "%s", *args, suffix, exc_info=exc_info)
        return True


class RateLimitedErrorLog:
    """Unexpected failures: each kind (where, exception type) is logged with its traceback
    once, then at most one line per kind per interval carrying the count left out, so a
    flood of bad requests cannot fill the log."""

    def __init__(
        self,
        log: logging.Logger,
        interval_s: float = _RATE_LIMIT_INTERVAL_S,
        max_kinds: int = _RATE_LIMIT_MAX_KINDS,
    ) -> None:
        self._log = log
        self._limit = RateLimitedLog(log, interval_s, max_kinds)

    def exception(self, where: str, exc: BaseException) -> None:
        admitted = self._limit.admit(f"{where}: {type(exc).__name__}")
        if admitted is None:
            return
        first, left_out = admitted
        if first:
            self._log.error("%s failed (traceback logged once per kind)", where, exc_info=exc)
        else:
            self._log.error(
                "%s failed again: %s: %s (%d more like it in the last %.0fs not logged)",
                where,
                type(exc).__name__,
                exc,
                left_out,
                self._limit.interval_s,
            )


PLUGIN_LOGGER_PREFIX = "lmcache.plugins"


def plugin_logger(module_name: str) -> logging.Logger:
    """The logger of a plugin module, inside the ``lmcache`` tree
    (``lmcache.plugins.<module_name>``): ``--log-level``, ``LMCACHE_LOG_LEVEL`` and the
    handler of :func:`init_logger` apply to it as to the core's own modules."""
    return logging.getLogger(f"{PLUGIN_LOGGER_PREFIX}.{module_name}")
