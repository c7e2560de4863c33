"""``MPClient``: a worker's blocking request client for the MP cache server (ZMQ DEALER).

Every call has a bounded timeout: a server that is down or wedged raises
:class:`ServerUnavailableError` with the address and a hint, never hangs.  A typed error
reply raises :class:`ServerError` carrying the server's error code;
:class:`ServerBusyError` (``busy``: the server's in-flight byte budget was full, nothing
was done) is the one whose ``retryable`` is true.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import zmq

from lmcache.v1.multiprocess.wire import protocol
from lmcache.v1.multiprocess.wire.curve import CurveClientKeys
from lmcache.v1.multiprocess.wire.custom_types import (
    IPCCacheServerKey,
    ObjectScope,
    PrefetchProgress,
    PrepareRetrieveResponse,
    PrepareStoreResponse,
    RegisterEngineDrivenContextPayload,
    RegisterEngineDrivenContextResponse,
    ServerStats,
)
from lmcache.v1.multiprocess.wire.security import ADMIN_TOKEN_ENV

logger = logging.getLogger(__name__)

DEFAULT_URL = "tcp://127.0.0.1:5555"
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0


def _release_socket(sock: zmq.Socket[Any], context: zmq.Context[Any] | None) -> None:
    """Close ``sock`` at once and terminate ``context`` (None: a shared one, left open)."""
    sock.close(linger=0)
    if context is not None:
        context.term()


class MPClientError(RuntimeError):
    """Base of the client's errors."""


class ServerUnavailableError(MPClientError):
    """No reply in time: the server is not running, unreachable, or overloaded."""


class ServerError(MPClientError):
    """The server answered with a typed error reply."""

    # Whether the very same request may succeed when sent again later.
    retryable = False

    def __init__(self, code: str, message: str, operation: str) -> None:
        super().__init__(f"[{code}] {operation or 'request'}: {message}")
        self.code = code
        self.message = message
        self.operation = operation


class ServerBusyError(ServerError):
    """``busy``: the server's budget of request bytes in flight (``--max-inflight-mb``)
    was full, so it refused this request without acting on it; send it again later."""

    retryable = True


def server_error(code: str, message: str, operation: str) -> ServerError:
    """The typed exception of an error reply."""
    cls = ServerBusyError if code == protocol.ErrorCode.BUSY.value else ServerError
    return cls(code, message, operation)


def normalize_url(url: str) -> str:
    """``host:port`` -> ``tcp://host:port``; ``tcp|ipc|inproc`` schemes pass through."""
    if "://" in url:
        scheme = url.split("://", 1)[0]
        if scheme not in ("tcp", "ipc", "inproc"):
            raise ValueError(f"unsupported MP server URL scheme {scheme!r} in {url!r}")
        return url
    return f"tcp://{url}"


def free_url(host: str = "127.0.0.1") -> str:
    """A ``tcp://`` URL on a port nothing listens on right now (tests, demos)."""
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return f"tcp://{host}:{sock.getsockname()[1]}"


class MPClient:
    """One DEALER connection; thread-safe (calls are serialized)."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        timeout: float = DEFAULT_TIMEOUT_S,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        context: zmq.Context[Any] | None = None,
        handshake: bool = True,
        admin_token: str | None = None,
        curve: CurveClientKeys | None = None,
    ) -> None:
        """``curve``: the keys for a server with ``--curve-secret-key-file`` (the wire is
        then encrypted); a keyed server never answers a client without an authorized key."""
        self.url = normalize_url(url)
        self.curve = curve
        # Presented only with admin operations (clear); default: $LMCACHE_ADMIN_TOKEN.
        self._admin_token = admin_token
        self.timeout = timeout
        self._own_context = context is None
        self._ctx = context if context is not None else zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.CONNECT_TIMEOUT, 5000)
        self._sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        if curve is not None:
            curve.apply(self._sock)
        self._sock.connect(self.url)
        # A client dropped without close(): garbage collection would finalize the context
        # first (a cycle clears the weak socket list) and its term() would then block
        # forever on the still-open socket, in whichever thread ran the collection.  The
        # finalizer holds both and closes the socket before terminating the context.
        self._release = weakref.finalize(
            self, _release_socket, self._sock, self._ctx if self._own_context else None
        )
        self._uids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False
        # True when the server is upstream LMCache (it has no protocol_handshake).
        self.server_is_upstream = False
        if handshake:
            try:
                self.server_is_upstream = self._handshake(connect_timeout)
            except BaseException:
                self.close()
                raise

    def _handshake(self, wait_s: float) -> bool:
        """Send ``protocol_handshake`` and ``noop`` back to back; True for an upstream server.

        Our server answers both inline and in order.  Upstream LMCache 0.5.6 drops the
        unknown handshake without a reply (it only logs it) but answers ``noop``, so a
        ``noop`` reply arriving first identifies it without waiting for a timeout.
        """
        with self._lock:
            handshake_uid, noop_uid = next(self._uids), next(self._uids)
            self._sock.send_multipart(
                protocol.encode_request(
                    handshake_uid, "protocol_handshake", [protocol.PROTOCOL_VERSION]
                )
            )
            self._sock.send_multipart(protocol.encode_request(noop_uid, "noop", []))
            frames = self._await_reply((handshake_uid, noop_uid), "protocol_handshake", wait_s)
            if protocol.decode(frames[0], int) == noop_uid:
                logger.info(
                    "the server at %s does not speak protocol_handshake: treating it as "
                    "upstream LMCache (0.5.6 wire protocol; lmcache-core extensions off)",
                    self.url,
                )
                return True
            self._decode_reply(frames, "protocol_handshake", tuple[int, bool])
            self._await_reply((noop_uid,), "noop", wait_s)
            return False

    def _keys_hint(self) -> str:
        # A CURVE server never answers a client it does not admit, so silence is also
        # what a key mismatch looks like.
        if self.curve is None:
            return " A server with CURVE keys answers only clients with an authorized key."
        return (
            " This client uses CURVE keys: is its public key in the server's "
            "--authorized-keys, and is the server key the server's own?"
        )

    def _reply_type_and_wait(self, operation: str, timeout: float | None) -> tuple[Any, float]:
        """The operation's response type (``Any`` if unknown) and the wait to apply."""
        spec = protocol.RPC_SPECS.get(operation)
        response_type = spec.response_type if spec is not None else Any
        return response_type, self.timeout if timeout is None else timeout

    def _check_open(self) -> None:
        if self._closed:
            raise MPClientError("the MP client is closed")

    def call(self, operation: str, *payloads: Any, timeout: float | None = None) -> Any:
        """Send one request and wait for its reply (decoded as the operation's response)."""
        response_type, wait_s = self._reply_type_and_wait(operation, timeout)
        with self._lock:
            self._check_open()
            uid = next(self._uids)
            self._sock.send_multipart(protocol.encode_request(uid, operation, payloads))
            frames = self._await_reply((uid,), operation, wait_s)
        return self._decode_reply(frames, operation, response_type)

    def call_bulk(
        self,
        operation: str,
        *payloads: Any,
        frames: Sequence[Any] = (),
        timeout: float | None = None,
    ) -> tuple[Any, list[memoryview]]:
        """Like :meth:`call`, with raw data frames after the payloads (any buffers, sent
        zero-copy: they must not change until this returns) and the reply's data frames
        returned as zero-copy, writable memoryviews (the framed inline sub-path)."""
        response_type, wait_s = self._reply_type_and_wait(operation, timeout)
        with self._lock:
            self._check_open()
            uid = next(self._uids)
            request = protocol.encode_request(uid, operation, payloads)
            self._sock.send_multipart([*request, *frames], copy=False)
            reply = self._await_reply((uid,), operation, wait_s, copy=False)
        head = [frame.bytes for frame in reply[:3]]
        return self._decode_reply(head, operation, response_type), [f.buffer for f in reply[3:]]

    def call_bulk_pipelined(
        self,
        operation: str,
        count: int,
        make_request: Callable[[int], tuple[Sequence[Any], Sequence[Any]]],
        on_reply: Callable[[int, Any, list[memoryview]], None],
        *,
        depth: int = 2,
        timeout: float | None = None,
    ) -> None:
        """``count`` framed requests of ``operation`` with up to ``depth`` in flight.

        ``make_request(i)`` returns request ``i``'s (payloads, data frames) and runs while
        the earlier requests are on the wire, so preparing the next request's bytes overlaps
        sending the current one's; ``on_reply(i, response, frames)`` runs as each reply
        arrives (in any order).  The frames of request ``i`` are sent zero-copy: they must
        not change until its reply was handed to ``on_reply``.  An exception stops the
        pipeline; the replies still in flight are discarded by later calls.
        """
        if depth < 1:
            raise ValueError(f"pipeline depth must be >= 1, got {depth}")
        response_type, wait_s = self._reply_type_and_wait(operation, timeout)
        with self._lock:
            self._check_open()
            in_flight: dict[int, int] = {}
            sent = 0
            while sent < count or in_flight:
                if sent < count and len(in_flight) < depth:
                    payloads, frames = make_request(sent)
                    uid = next(self._uids)
                    request = protocol.encode_request(uid, operation, payloads)
                    self._sock.send_multipart([*request, *frames], copy=False)
                    in_flight[uid] = sent
                    sent += 1
                    continue
                reply = self._await_reply(tuple(in_flight), operation, wait_s, copy=False)
                index = in_flight.pop(protocol.decode(reply[0].buffer, int))
                head = [frame.bytes for frame in reply[:3]]
                response = self._decode_reply(head, operation, response_type)
                on_reply(index, response, [frame.buffer for frame in reply[3:]])

    def _await_reply(
        self, uids: tuple[int, ...], operation: str, wait_s: float, copy: bool = True
    ) -> list[Any]:
        deadline = time.monotonic() + wait_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._sock.poll(int(remaining * 1000) + 1, zmq.POLLIN):
                if time.monotonic() < deadline:
                    continue
                raise ServerUnavailableError(
                    f"no reply to {operation} from the LMCache server at {self.url} within "
                    f"{wait_s:.1f}s: is `lmcache server` running there (and reachable)?"
                    + self._keys_hint()
                )
            frames: list[Any] = self._sock.recv_multipart(0, copy)
            try:
                reply_uid = protocol.decode(frames[0] if copy else frames[0].buffer, int)
            except Exception:
                continue
            if reply_uid in uids:
                return frames
            logger.debug("discarding a late reply (uid %s)", reply_uid)

    @staticmethod
    def _decode_reply(frames: Sequence[bytes], operation: str, response_type: Any) -> Any:
        if len(frames) < 2:
            raise MPClientError(f"malformed reply to {operation}: {len(frames)} frame(s)")
        if protocol.is_error_operation(protocol.decode(frames[1])):
            reply = protocol.decode(frames[2], protocol.ErrorReply)
            raise server_error(reply.code, reply.message, reply.operation or operation)
        if len(frames) < 3:
            return None
        try:
            return protocol.decode(frames[2], response_type)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise MPClientError(f"undecodable reply to {operation}: {exc}") from None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._release()

    def __enter__(self) -> MPClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- typed wrappers (names as upstream's RequestClient) -----------------------------------

    def register_kv_cache(
        self,
        instance_id: int,
        kv_cache: list[Any],
        model_name: str,
        world_size: int,
        engine_type: Any = "vllm",
        layout_hints: Any = None,
        engine_group_infos: Any = (),
    ) -> None:
        self.call(
            "register_kv_cache",
            instance_id,
            kv_cache,
            model_name,
            world_size,
            engine_type,
            # Upstream decodes LayoutHints as a (partial) dict and drops a None.
            {} if layout_hints is None else layout_hints,
            list(engine_group_infos),
        )

    def unregister_kv_cache(self, instance_id: int) -> None:
        self.call("unregister_kv_cache", instance_id)

    def store(
        self, key: IPCCacheServerKey, instance_id: int, block_ids: list[list[int]], handle: bytes
    ) -> tuple[bytes, bool]:
        result: tuple[bytes, bool] = self.call("store", key, instance_id, block_ids, handle)
        return result

    def retrieve(
        self,
        key: IPCCacheServerKey,
        instance_id: int,
        block_ids: list[list[int]],
        handle: bytes,
        skip_first_n_tokens: int = 0,
    ) -> tuple[bytes, bool]:
        result: tuple[bytes, bool] = self.call(
            "retrieve", key, instance_id, block_ids, handle, skip_first_n_tokens
        )
        return result

    def lookup(self, key: IPCCacheServerKey, tp_size: int) -> None:
        self.call("lookup", key, tp_size)

    def query_prefetch_status(self, request_id: str) -> int | None:
        result: int | None = self.call("query_prefetch_status", request_id)
        return result

    def wait_prefetch_status(self, request_id: str, timeout: float) -> int | None:
        result: int | None = self.call(
            "wait_prefetch_status", request_id, timeout, timeout=self.timeout + timeout
        )
        return result

    def free_lookup_locks(self, key: IPCCacheServerKey, tp_size: int) -> None:
        self.call("free_lookup_locks", key, tp_size)

    def end_session(self, request_id: str) -> None:
        self.call("end_session", request_id)

    def register_kv_cache_engine_driven_context(
        self, payload: RegisterEngineDrivenContextPayload
    ) -> RegisterEngineDrivenContextResponse:
        result: RegisterEngineDrivenContextResponse = self.call(
            "register_kv_cache_engine_driven_context", payload
        )
        return result

    def unregister_kv_cache_engine_driven_context(self, instance_id: int) -> None:
        self.call("unregister_kv_cache_engine_driven_context", instance_id)

    def prepare_store(self, key: IPCCacheServerKey, instance_id: int) -> PrepareStoreResponse:
        result: PrepareStoreResponse = self.call("prepare_store", key, instance_id)
        return result

    def commit_store(self, key: IPCCacheServerKey, instance_id: int, data: bytes = b"") -> bool:
        return bool(self.call("commit_store", key, instance_id, data))

    def prepare_retrieve(self, key: IPCCacheServerKey, instance_id: int) -> PrepareRetrieveResponse:
        result: PrepareRetrieveResponse = self.call("prepare_retrieve", key, instance_id)
        return result

    def commit_retrieve(self, key: IPCCacheServerKey, instance_id: int) -> bool:
        return bool(self.call("commit_retrieve", key, instance_id))

    def clear(self, force: bool = False, admin_token: str | None = None) -> None:
        """Drop every cached object: an admin operation (the server needs
        ``--enable-admin-ops``).  The admin token is ``admin_token``, else the client's,
        else ``$LMCACHE_ADMIN_TOKEN``; it travels as a trailing payload, which upstream's
        server does not take, so it is never sent there."""
        token = admin_token or self._admin_token or os.environ.get(ADMIN_TOKEN_ENV) or None
        if token is None or self.server_is_upstream:
            self.call("clear", force)
        else:
            self.call("clear", force, token)

    def get_chunk_size(self) -> int:
        return int(self.call("get_chunk_size"))

    def ping(self, instance_id: int | None = None) -> bool:
        return bool(self.call("ping", instance_id))

    def noop(self) -> str:
        return str(self.call("noop"))

    def get_stats(self) -> ServerStats:
        result: ServerStats = self.call("get_stats")
        return result

    def query_prefetch_progress(self, request_id: str) -> PrefetchProgress | None:
        """Chunks done / total of the session's background promotion into L1."""
        result: PrefetchProgress | None = self.call("query_prefetch_progress", request_id)
        return result

    # -- named objects (an engine's pages under its own names, e.g. SGLang HiCache) --------

    def put_objects(
        self, scope: ObjectScope, names: Sequence[str], data: Sequence[Any]
    ) -> list[bool]:
        """Store ``data[i]`` (any buffer, sent zero-copy: unchanged until this returns)
        under ``names[i]``; per name, whether it is stored."""
        if len(names) != len(data):
            raise ValueError(f"{len(names)} names but {len(data)} objects")
        stored, _ = self.call_bulk("put_objects", scope, list(names), frames=data)
        return [bool(s) for s in stored]

    def get_objects(self, scope: ObjectScope, names: Sequence[str]) -> list[memoryview | None]:
        """Per name, its bytes (a writable view of the reply) or None when not stored."""
        found, frames = self.call_bulk("get_objects", scope, list(names))
        if len(found) != len(names) or sum(map(bool, found)) != len(frames):
            raise MPClientError(
                f"malformed get_objects reply: {len(found)} flags and {len(frames)} frames "
                f"for {len(names)} names"
            )
        it = iter(frames)
        return [next(it) if hit else None for hit in found]

    def count_object_prefix(self, scope: ObjectScope, names: Sequence[str]) -> int:
        """How many leading ``names`` are stored."""
        return int(self.call("count_object_prefix", scope, list(names)))
