"""Connection limits of the HTTP frontend: header and body timeouts and a connection cap.

uvicorn's h11 protocol arms no timer until it has answered a request, and any byte that
arrives cancels its keep-alive timer, so a client that opens a connection and trickles a
header line now and then (slowloris) holds a descriptor forever; nothing caps how many.
The descriptors are the process's, shared with the ZMQ transport.

:class:`LimitedH11Protocol` (uvicorn's protocol with these limits) therefore:

* closes a connection whose request head (request line and headers) has not fully arrived
  ``header_timeout_s`` after it was opened, or after the previous response on it (``408``
  JSON when part of a head had come, silently otherwise);
* closes a connection whose request body has not fully arrived ``body_timeout_s`` after
  its head (the handler sees the client go away);
* keeps at most ``max_connections`` open: a new connection past the cap closes the one
  that has waited longest for a request head (never one whose request is in progress), or,
  when every connection has a request in progress, is answered ``503`` JSON and closed.

A client's head is bounded in size by h11 (16 KiB), so memory per connection is bounded
too.  Each kind of closing is logged as a warning at most once a minute, with a count.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import resource
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from lmcache.logging import RateLimitedLog
from lmcache.v1.multiprocess.server_flags import (
    DEFAULT_HTTP_BODY_TIMEOUT_S,
    DEFAULT_HTTP_HEADER_TIMEOUT_S,
    DEFAULT_HTTP_MAX_CONNECTIONS,
)

__all__ = [
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS",
    "HTTPLimitStats",
    "HTTPLimits",
    "LimitedH11Protocol",
    "limited_protocol",
]

logger = logging.getLogger(__name__)

DEFAULT_HEADER_TIMEOUT_S = DEFAULT_HTTP_HEADER_TIMEOUT_S
DEFAULT_BODY_TIMEOUT_S = DEFAULT_HTTP_BODY_TIMEOUT_S
DEFAULT_MAX_CONNECTIONS = DEFAULT_HTTP_MAX_CONNECTIONS


@dataclasses.dataclass(frozen=True)
class HTTPLimits:
    """``--http-header-timeout-s``, ``--http-body-timeout-s``, ``--http-max-connections``."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections}")

    def warn_if_near_the_descriptor_limit(self) -> None:
        """The cap is meant to stay well below ``RLIMIT_NOFILE`` (ZMQ needs descriptors)."""
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and self.max_connections > soft // 2:
            logger.warning(
                "--http-max-connections %d is more than half of this process's descriptor "
                "limit (%d): HTTP clients could starve the ZMQ transport of descriptors",
                self.max_connections,
                soft,
            )


@dataclasses.dataclass
class HTTPLimitStats:
    """How many connections each limit closed (written on the frontend's event loop)."""

    header_timeouts: int = 0
    body_timeouts: int = 0
    evicted: int = 0
    refused: int = 0


class _Phase(enum.Enum):
    WAITING = "waiting for a request head"
    BODY = "receiving a request body"
    HANDLING = "handling a request"
    CLOSED = "closed"


_warnings = RateLimitedLog(logger)


def _raw_json_response(status: int, reason: str, code: str, message: str) -> bytes:
    """A whole ``Connection: close`` response, for a connection h11 has no request on."""
    body = json.dumps({"error": code, "message": message}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with :class:`HTTPLimits` (see the module docstring); made
    per frontend by :func:`limited_protocol`."""

    limits: ClassVar[HTTPLimits] = HTTPLimits()
    stats: ClassVar[HTTPLimitStats]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase: _Phase | None = None
        self._phase_since = 0.0
        self._deadline: Any = None  # asyncio.TimerHandle

    # -- uvicorn's hooks ------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        if self._admitted():
            self._follow_phase()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self._phase = _Phase.CLOSED
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        self._follow_phase()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow_phase()

    # -- phases and their deadlines -------------------------------------------------------

    def _current_phase(self) -> _Phase:
        if self.transport is None or self.transport.is_closing():
            return _Phase.CLOSED
        if self.conn.their_state is h11.SEND_BODY:
            return _Phase.BODY
        if self.cycle is not None and not self.cycle.response_complete:
            return _Phase.HANDLING
        return _Phase.WAITING

    def _follow_phase(self) -> None:
        phase = self._current_phase()
        if phase is self._phase:
            return
        self._cancel_deadline()
        self._phase, self._phase_since = phase, self.loop.time()
        timeout = {
            _Phase.WAITING: self.limits.header_timeout_s,
            _Phase.BODY: self.limits.body_timeout_s,
        }.get(phase)
        if timeout is not None:
            self._deadline = self.loop.call_later(timeout, self._on_deadline, phase)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _on_deadline(self, phase: _Phase) -> None:
        self._deadline = None
        if self._current_phase() is not phase:
            self._follow_phase()  # a transition this protocol did not see; re-arm
            return
        if phase is _Phase.WAITING:
            self.stats.header_timeouts += 1
            self._warn(
                "header timeout",
                f"no complete request head within "
                f"{self.limits.header_timeout_s:g}s (--http-header-timeout-s)",
            )
            self._close_waiting(
                408, "Request Timeout", "request_timeout", "the request head did not arrive in time"
            )
        else:
            self.stats.body_timeouts += 1
            self._warn(
                "body timeout",
                f"the request body did not arrive within "
                f"{self.limits.body_timeout_s:g}s (--http-body-timeout-s)",
            )
            self.transport.close()  # the handler sees the client go away

    # -- the connection cap ---------------------------------------------------------------

    def _admitted(self) -> bool:
        """Admit this connection under the cap, making room by closing the connection
        that has waited longest for a request head; False when it was refused."""
        others = [
            c
            for c in self.connections
            if c is not self
            and isinstance(c, LimitedH11Protocol)
            and c._current_phase() is not _Phase.CLOSED
        ]
        if len(others) < self.limits.max_connections:
            return True
        waiting = [c for c in others if c._phase is _Phase.WAITING]
        if waiting:
            oldest = min(waiting, key=lambda c: c._phase_since)
            self.stats.evicted += 1
            oldest._warn(
                "connection cap",
                f"{len(others) + 1} connections, the cap is "
                f"{self.limits.max_connections} (--http-max-connections): closed the "
                f"one idle longest",
            )
            oldest._close_waiting(
                503,
                "Service Unavailable",
                "too_many_connections",
                "the server closed this idle connection to admit another",
            )
            return True
        self.stats.refused += 1
        self._warn(
            "connection cap (all busy)",
            f"refused a connection: all "
            f"{self.limits.max_connections} connections have a request in progress "
            f"(--http-max-connections)",
        )
        self.connections.discard(self)
        self.transport.write(
            _raw_json_response(
                503,
                "Service Unavailable",
                "too_many_connections",
                "every connection of this server is busy; retry shortly",
            )
        )
        self.transport.close()
        return False

    def _close_waiting(self, status: int, reason: str, code: str, message: str) -> None:
        """Close a connection that has no request in progress; a client that has sent part
        of a head gets a reply saying why."""
        if self.transport.is_closing():
            return
        partial, _closed = self.conn.trailing_data
        if partial:
            self.transport.write(_raw_json_response(status, reason, code, message))
        self.transport.close()

    def _warn(self, kind: str, what: str) -> None:
        peer = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        _warnings.log(logging.WARNING, kind, "HTTP frontend: %s; closed %s", what, peer)


def limited_protocol(limits: HTTPLimits) -> type[LimitedH11Protocol]:
    """A :class:`LimitedH11Protocol` class bound to ``limits`` and fresh statistics (uvicorn
    instantiates the class itself, so the settings travel as class attributes)."""
    return type(
        "LimitedH11Protocol",
        (LimitedH11Protocol,),
        {"limits": limits, "stats": HTTPLimitStats(), "__module__": __name__},
    )
