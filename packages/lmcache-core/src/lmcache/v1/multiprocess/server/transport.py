"""The MP cache server's transport: a ZMQ ROUTER loop dispatching to handler pools.

* The main thread owns the ROUTER socket: it frames and validates requests, answers
  cheap operations inline and hands the rest to thread pools.  Store/retrieve-family
  operations (and registration) go to an *affinity* pool keyed by the client identity, so
  one client's requests run in order; lookups and management go to a shared pool.
* Handler threads send replies back through an inproc PUSH/PULL pair; only the main
  thread touches the ROUTER.  Replies are sent non-blocking: a client that never reads
  fills its queue and then loses replies (counted), never stalls the server.
* ``request_stop`` (SIGINT/SIGTERM): new requests get ``shutting_down`` errors, in-flight
  ones finish and are answered, then storage is flushed and shared memory removed.
* No request can kill or wedge the loop: framing, decoding and handling failures all end
  as exactly one typed error reply (``internal`` for anything unexpected, whose traceback
  is logged once per kind and then rate-limited), and a request over the size or frame
  bound is refused before its frames are copied out of the transport.
* Memory: the bytes of requests read and not yet answered are counted across all peers;
  a request that would take them past ``--max-inflight-mb`` is answered ``busy`` at once
  and its frames released (requests of at most ``BUDGET_EXEMPT_BYTES`` are exempt).  What
  libzmq holds before the loop reads a request is bounded per peer by ``--max-message-mb``
  and ``_RECV_HWM``; docs/operations.md ("Request memory") adds it all up.

Which pool serves an operation, and which :class:`MPCacheServer` method, is the
operation's :class:`~lmcache.v1.multiprocess.wire.protocol.RpcSpec` (``pool``, ``handler``);
the handlers are bound once, when the server is made.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import zmq

from lmcache.v1.multiprocess.affinity_pool import AffinityThreadPool
from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.server.rate_limited_logs import RateLimitedErrorLog, RefusalLog
from lmcache.v1.multiprocess.server.tenants import Tenant, calling_as
from lmcache.v1.multiprocess.server_config import MPServerConfig
from lmcache.v1.multiprocess.wire import protocol
from lmcache.v1.multiprocess.wire.curve import HandshakeMonitor, ZapHandler, peer_key
from lmcache.v1.multiprocess.wire.protocol import ErrorCode, Pool, ProtocolError
from lmcache.v1.multiprocess.wire.security import rpc_reach, warn_if_exposed

logger = logging.getLogger(__name__)

_POLL_MS = 100
_REAP_INTERVAL_S = 1.0
_SEND_HWM = 1000
# Complete requests libzmq queues per peer while the loop does not read (it stops at
# MAX_IN_FLIGHT); past it libzmq stops reading that peer's connection (TCP pushes back).
# Small, because each may be as large as --max-message-mb (libzmq's default is 1000).
_RECV_HWM = 16
# A valid request_uid frame is a msgpack int (at most 9 bytes); a longer one is not echoed.
_MAX_ECHOED_UID_BYTES = 16
# Requests queued or running in the handler pools; beyond it the loop stops reading new
# ones (ZeroMQ holds them, pushing back on senders) so a flood cannot grow memory unbounded.
MAX_IN_FLIGHT = 1024


# identity, uid frame, operation frame, operation, the caller's tenant (None: no tenants).
Head = tuple[bytes, bytes, bytes, str, Tenant | None]


class FramedRequest(NamedTuple):
    """A request whose framing checked out: its frames are not decoded past the operation."""

    op_frame: bytes
    operation: str
    payload_frames: list[zmq.Frame]
    size: int  # bytes of all its frames (the identity frame excluded)


def frame_request(body: Sequence[zmq.Frame], max_message_bytes: int) -> FramedRequest:
    """Check the frames after the identity, ``[request_uid, operation, *payloads]``, by
    count and total size before any is copied, then decode uid and operation.

    Raises only ``ProtocolError``: whatever the frames are, nothing here indexes past
    them (the split is one unpacking, refused as a whole when there are too few frames).
    """
    count = len(body)
    if count > protocol.MAX_REQUEST_FRAMES:
        raise ProtocolError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"request of {count} frames exceeds the limit of {protocol.MAX_REQUEST_FRAMES} "
            f"frames (uid, operation and at most "
            f"{protocol.MAX_REQUEST_FRAMES - 2} payloads)",
        )
    size = sum(len(f) for f in body)
    if size > max_message_bytes:
        raise ProtocolError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"request of {size} bytes in {count} frames exceeds the server limit of "
            f"{max_message_bytes} bytes per request (--max-message-mb)",
        )
    try:
        uid_frame, op_frame, *payload_frames = body
    except ValueError:
        raise ProtocolError(
            ErrorCode.MALFORMED_FRAME,
            f"a request is [request_uid, operation, *payloads]; got {count} frame(s)",
        ) from None
    try:
        protocol.decode(uid_frame.buffer, int)
    except Exception:
        raise ProtocolError(
            ErrorCode.MALFORMED_FRAME, "request_uid frame is not a msgpack integer"
        ) from None
    op_bytes = op_frame.bytes
    return FramedRequest(op_bytes, protocol.decode_operation(op_bytes), payload_frames, size)


def decode_request(request: FramedRequest) -> tuple[protocol.RpcSpec, list[Any]]:
    """The operation's spec and its typed payloads (a bulk operation's data frames last,
    as zero-copy views that keep their frames alive); raises only ``ProtocolError``."""
    spec = protocol.RPC_SPECS[request.operation]
    payload_frames, bulk = protocol.split_bulk(spec, request.payload_frames)
    payloads = protocol.decode_payloads(spec, [f.buffer for f in payload_frames])
    if spec.bulk_frames:
        payloads.append([f.buffer for f in bulk])
    return spec, payloads


def bind_handlers(engine: MPCacheServer) -> dict[str, Callable[..., Any]]:
    """Each operation's handler: the method of ``engine`` its ``RpcSpec`` names (resolved
    once, so a table entry without a method fails at start-up, not at its first request)."""
    handlers = {}
    for name, spec in protocol.RPC_SPECS.items():
        handler = getattr(engine, spec.handler, None)
        if not callable(handler):
            raise TypeError(
                f"RPC_SPECS[{name!r}] names handler {spec.handler!r}, which "
                f"{type(engine).__name__} does not define"
            )
        handlers[name] = handler
    return handlers


class MPServer:
    """Serves one :class:`MPCacheServer` on ``tcp://host:port``."""

    def __init__(self, config: MPServerConfig, engine: MPCacheServer) -> None:
        self.config = config
        self.engine = engine
        self.endpoint = f"tcp://{config.host}:{config.port}"
        self._ctx = zmq.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.setsockopt(zmq.SNDHWM, _SEND_HWM)
        self._router.setsockopt(zmq.RCVHWM, _RECV_HWM)
        # The transport drops (and disconnects) anything far beyond the limit; between the
        # limit and this cap the request is answered with message_too_large.
        self._router.setsockopt(zmq.MAXMSGSIZE, 2 * config.max_message_bytes)
        self._handshakes: HandshakeMonitor | None = None
        self._zap = self._start_curve(engine)
        self._router.bind(self.endpoint)
        if self._zap is None:
            warn_if_exposed(
                "the ZMQ RPC port", config.host, config.port, rpc_reach(engine.settings.admin)
            )
        self._reply_endpoint = f"inproc://lmcache-replies-{id(self)}"
        self._replies = self._ctx.socket(zmq.PULL)
        self._replies.bind(self._reply_endpoint)
        self._local = threading.local()
        self._push_sockets: list[zmq.Socket[Any]] = []
        self._push_lock = threading.Lock()
        transfer_threads, other_threads = config.pool_workers()
        # Keyed by client identity: up to ``transfer_threads`` clients with work in flight
        # get a thread each, so one client's transfers never queue behind another's.
        # Idle identities are released: reconnecting clients get fresh ones.
        self._affinity = AffinityThreadPool(
            max(1, transfer_threads), "lmc-transfer", release_idle_keys=True
        )
        self._pool = ThreadPoolExecutor(other_threads, thread_name_prefix="lmc-handler")
        self._stop = threading.Event()
        self._in_flight = 0
        self._in_flight_bytes = 0
        self._in_flight_lock = threading.Lock()
        self.max_in_flight = MAX_IN_FLIGHT
        self.max_in_flight_bytes = config.max_inflight_bytes
        self._busy_log = RefusalLog(subject="request over --max-inflight-mb:")
        self._closed = False
        self._errors = RateLimitedErrorLog(logger)
        self.http_url: str | None = None
        self._handlers = bind_handlers(engine)

    def _start_curve(self, engine: MPCacheServer) -> ZapHandler | None:
        """With CURVE keys: the ZAP handler (bound before the ROUTER, so no connection is
        ever admitted unchecked) and the ROUTER's CURVE server options."""
        keys = engine.settings.curve
        if keys is None:
            return None
        metrics = engine.metrics
        zap = ZapHandler(
            self._ctx,
            keys.authorized,
            on_refusal=None if metrics is None else metrics.count_auth_refused,
        )
        keys.apply(self._router)
        self._handshakes = HandshakeMonitor(
            self._router,
            on_failure=None if metrics is None else lambda: metrics.count_auth_refused("handshake"),
        )
        logger.info(
            "CURVE on the RPC port: encrypted, %d authorized client key(s)", len(keys.authorized)
        )
        return zap

    # -- lifecycle ----------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def is_serving(self) -> bool:
        return not self._stop.is_set() and not self._closed

    def serve_forever(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._replies, zmq.POLLIN)
        replies_only = zmq.Poller()  # while saturated: wait for handlers to finish
        replies_only.register(self._replies, zmq.POLLIN)
        next_reap = time.monotonic() + _REAP_INTERVAL_S
        logger.info("LMCache MP server listening on %s", self.endpoint)
        while not self._stop.is_set():
            try:
                active = replies_only if self._saturated() else poller
                ready = dict(active.poll(_POLL_MS))
                if self._replies in ready:
                    self._pump_replies()
                if self._router in ready:
                    self._pump_requests()
            except zmq.ContextTerminated:
                raise
            except Exception as exc:  # the loop outlives anything a request can cause
                self._errors.exception("serve loop", exc)
            if time.monotonic() >= next_reap:
                next_reap = time.monotonic() + _REAP_INTERVAL_S
                self._reap()
        self._drain(poller)

    def _reap(self) -> None:
        try:
            self.engine.reap()
        except Exception:
            logger.exception("housekeeping failed")

    def _drain(self, poller: zmq.Poller) -> None:
        """Answer new requests with shutting_down until in-flight handlers are answered."""
        logger.info("shutting down: draining %d in-flight requests", self._in_flight)
        while True:
            with self._in_flight_lock:
                idle = self._in_flight == 0
            if idle and not self._replies.poll(0):
                break
            ready = dict(poller.poll(_POLL_MS))
            if self._replies in ready:
                self._pump_replies()
            if self._router in ready:
                self._pump_requests()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._affinity.shutdown(wait=True)
        self._pool.shutdown(wait=True)
        try:
            self.engine.close()
        finally:
            with self._push_lock:
                for sock in self._push_sockets:
                    sock.close(linger=0)
            self._replies.close(linger=0)
            if self._handshakes is not None:
                self._router.disable_monitor()
                self._handshakes.close()
            self._router.close(linger=0)
            if self._zap is not None:
                self._zap.close()
            self._ctx.term()
        logger.info("LMCache MP server stopped")

    # -- requests -----------------------------------------------------------------------------

    def _saturated(self) -> bool:
        return self._in_flight >= self.max_in_flight

    def _pump_requests(self) -> None:
        for _ in range(256):
            # While draining, new requests are answered inline (shutting_down), never queued.
            if self._saturated() and not self._stop.is_set():
                return
            try:
                # copy=False: sizes are checked before any frame is copied out of libzmq.
                frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity = frames[0].bytes
            try:
                self._handle(identity, frames)
            except Exception as exc:
                self._errors.exception("request framing", exc)
                self._reply_error(identity, self._uid_frame(frames), ErrorCode.INTERNAL, exc, "")
            finally:
                del frames  # release an oversized request's memory now, not at the next one

    @staticmethod
    def _uid_frame(frames: list[zmq.Frame]) -> bytes:
        if len(frames) > 1 and len(frames[1]) <= _MAX_ECHOED_UID_BYTES:
            return frames[1].bytes
        return protocol.encode(-1)

    def _handle(self, identity: bytes, frames: list[zmq.Frame]) -> None:
        uid_frame = self._uid_frame(frames)
        operation = ""
        reserved = 0
        try:
            request = frame_request(frames[1:], self.config.max_message_bytes)
            operation = request.operation
            if self._stop.is_set():
                raise ProtocolError(ErrorCode.SHUTTING_DOWN, "the server is shutting down")
            tenant = self._tenant_of(frames[0])
            reserved = self._reserve(request.size, operation)
            spec, payloads = decode_request(request)
        except ProtocolError as exc:
            self._release(reserved)
            self._reply_error(identity, uid_frame, exc.code, exc, operation)
            return
        except BaseException:
            self._release(reserved)
            raise
        handler = self._handlers[operation]
        head = (identity, uid_frame, request.op_frame, operation, tenant)
        if spec.pool is Pool.INLINE:
            try:
                self._send(self._run(head, handler, payloads))
            finally:
                self._release(reserved)
        else:
            self._submit(head, handler, payloads, spec.pool is Pool.AFFINITY, reserved)

    def _tenant_of(self, identity_frame: zmq.Frame) -> Tenant | None:
        """The tenant of the key ZAP admitted for this connection (None without tenants).
        With tenants, ZAP admits only keys that have one, so it is never missing."""
        tenants = self.engine.settings.tenants
        if tenants is None:
            return None
        tenant = tenants.for_key(peer_key(identity_frame))
        if tenant is None:  # unreachable while ZAP and the tenants file agree
            raise ProtocolError(ErrorCode.FORBIDDEN, "this connection's key has no tenant")
        return tenant

    def _reserve(self, size: int, operation: str) -> int:
        """Count ``size`` bytes in flight until the request is answered (the bytes to give
        back); ``busy`` when that would pass the budget.  Small requests are exempt."""
        if size <= protocol.BUDGET_EXEMPT_BYTES:
            return 0
        with self._in_flight_lock:
            held = self._in_flight_bytes
            if held + size <= self.max_in_flight_bytes:
                self._in_flight_bytes = held + size
                return size
        self._busy_log.note(operation, f"{size} bytes with {held} in flight")
        raise ProtocolError(
            ErrorCode.BUSY,
            f"the server holds {held} bytes of requests not yet answered; this {size}-byte "
            f"request would pass its budget of {self.max_in_flight_bytes} bytes "
            f"(--max-inflight-mb): retry once earlier requests are answered",
        )

    def _release(self, reserved: int) -> None:
        if reserved:
            with self._in_flight_lock:
                self._in_flight_bytes -= reserved

    @property
    def in_flight_bytes(self) -> int:
        """Bytes of (non-exempt) requests read and not yet answered."""
        return self._in_flight_bytes

    def _reply_error(
        self, identity: bytes, uid_frame: bytes, code: ErrorCode, exc: Exception, operation: str
    ) -> None:
        message = exc.message if isinstance(exc, ProtocolError) else _describe(exc)
        self._count_error()
        metrics = self.engine.metrics
        if metrics is not None:
            metrics.count_rejected(operation or "unknown", code.value)
        self._send([identity, *protocol.encode_error(uid_frame, code, message, operation)])

    def _submit(
        self,
        head: Head,
        handler: Callable[..., Any],
        payloads: list[Any],
        affinity: bool,
        reserved: int,
    ) -> None:
        """Run the handler on a pool; the request's ``reserved`` bytes go with it."""
        self._begin()
        try:
            if affinity:
                self._affinity.submit(
                    self._run_and_push, head, handler, payloads, reserved, affinity_key=head[0]
                )
            else:
                self._pool.submit(self._run_and_push, head, handler, payloads, reserved)
        except RuntimeError as exc:  # the pool is shut down: answer here, keep the count right
            self._end(reserved)
            self._reply_error(head[0], head[1], ErrorCode.SHUTTING_DOWN, exc, head[3])

    def _begin(self) -> None:
        with self._in_flight_lock:
            self._in_flight += 1

    def _end(self, reserved: int) -> None:
        with self._in_flight_lock:
            self._in_flight -= 1
            self._in_flight_bytes -= reserved

    def _count_error(self) -> None:
        self.engine._count(errors=1)

    def _run(
        self,
        head: Head,
        handler: Callable[..., Any],
        payloads: list[Any],
    ) -> list[Any]:
        identity, uid_frame, op_frame, operation, tenant = head
        metrics = self.engine.metrics
        start = time.perf_counter() if metrics is not None else 0.0
        try:
            with calling_as(tenant):
                response = handler(*payloads)
            reply = [identity, *protocol.encode_success(uid_frame, op_frame, response)]
            if metrics is not None:
                metrics.observe_request(operation, "ok", time.perf_counter() - start)
                if tenant is not None:
                    metrics.observe_tenant(tenant.name, "ok")
            return reply
        except ProtocolError as exc:
            code, message = exc.code, exc.message
        except Exception as exc:
            self._errors.exception(operation, exc)
            code, message = ErrorCode.INTERNAL, _describe(exc)
        self._count_error()
        try:
            if metrics is not None:
                metrics.observe_request(operation, code.value, time.perf_counter() - start)
                if tenant is not None:
                    metrics.observe_tenant(tenant.name, code.value)
        except Exception as exc:
            self._errors.exception("metrics", exc)
        return [identity, *protocol.encode_error(uid_frame, code, message, operation)]

    def _run_and_push(
        self,
        head: Head,
        handler: Callable[..., Any],
        payloads: list[Any],
        reserved: int,
    ) -> None:
        try:
            reply = self._run(head, handler, payloads)
            # The request's frames go now, and its bytes are given back before the reply
            # leaves: a client that resends at once after a reply finds the room.
            payloads.clear()
            self._release(reserved)
            reserved = 0
            # copy=False: bulk reply frames (chunk bytes) pass to the ROUTER by reference.
            self._push_socket().send_multipart(reply, copy=False)
        except Exception as exc:  # a handler thread must survive to serve the next request
            self._errors.exception("reply", exc)
        finally:
            payloads.clear()
            self._end(reserved)

    def _push_socket(self) -> zmq.Socket[Any]:
        sock = getattr(self._local, "push", None)
        if sock is None:
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self._reply_endpoint)
            self._local.push = sock
            with self._push_lock:
                self._push_sockets.append(sock)
        return sock

    # -- replies ------------------------------------------------------------------------------

    def _pump_replies(self) -> None:
        for _ in range(1024):
            try:
                frames = self._replies.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._send(frames)

    def _send(self, frames: list[Any]) -> None:
        try:
            self._router.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.engine._count(dropped_replies=1)
            logger.debug("client send queue full (not reading replies); reply dropped")
        except zmq.ZMQError as exc:
            self.engine._count(dropped_replies=1)
            logger.debug("reply to a departed client dropped: %s", exc)


def _describe(exc: BaseException) -> str:
    """One line for an ``internal`` error reply: the exception type and its first line."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 300:
        first = first[:300] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
