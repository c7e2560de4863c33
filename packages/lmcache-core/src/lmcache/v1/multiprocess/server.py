"""The MP cache server's transport: a ZMQ ROUTER loop dispatching to handler pools.

* The main thread owns the ROUTER socket: it frames and validates requests, answers
  cheap operations inline and hands the rest to thread pools.  Store/retrieve-family
  operations (and registration) go to an *affinity* pool keyed by the client identity, so
  one client's requests run in order; lookups and management go to a plain pool.
* Handler threads send replies back through an inproc PUSH/PULL pair; only the main
  thread touches the ROUTER.  Replies are sent non-blocking: a client that never reads
  fills its queue and then loses replies (counted), never stalls the server.
* ``request_stop`` (SIGINT/SIGTERM): new requests get ``shutting_down`` errors, in-flight
  ones finish and are answered, then storage is flushed and shared memory removed.
* No request can kill or wedge the loop: framing, decoding and handling failures all end
  as exactly one typed error reply (``internal`` for anything unexpected, whose traceback
  is logged once per kind and then rate-limited), and a request over the size or frame
  bound is refused before its frames are copied out of the transport.

``python -m lmcache.v1.multiprocess.server`` runs it without the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import zmq

from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.multiprocess import protocol
from lmcache.v1.multiprocess.config import MPServerConfig
from lmcache.v1.multiprocess.mp_cache_server import CacheServerSettings, MPCacheServer
from lmcache.v1.multiprocess.protocol import ErrorCode, ProtocolError
from lmcache.v1.multiprocess.security import admin_policy, rpc_reach, warn_if_exposed
from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface
from lmcache.v1.storage_backend.disk_folder import inspect_disk_folder
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.storage_manager import (
    L1_NAME,
    StorageManager,
    create_storage_backends,
)

logger = logging.getLogger(__name__)

AFFINITY_OPERATIONS = frozenset(
    {
        "register_kv_cache",
        "unregister_kv_cache",
        "store",
        "retrieve",
        "register_kv_cache_engine_driven_context",
        "unregister_kv_cache_engine_driven_context",
        "set_engine_driven_sub_path",
        "prepare_store",
        "commit_store",
        "prepare_retrieve",
        "commit_retrieve",
    }
)
BLOCKING_OPERATIONS = frozenset(
    {
        "lookup",
        "query_prefetch_status",
        "wait_prefetch_status",
        "free_lookup_locks",
        "end_session",
        "ping",
        "clear",
        "get_stats",
    }
)
_POLL_MS = 100
_REAP_INTERVAL_S = 1.0
_SEND_HWM = 1000
# A valid request_uid frame is a msgpack int (at most 9 bytes); a longer one is not echoed.
_MAX_ECHOED_UID_BYTES = 16
# Requests queued or running in the handler pools; beyond it the loop stops reading new
# ones (ZeroMQ holds them, pushing back on senders) so a flood cannot grow memory unbounded.
MAX_IN_FLIGHT = 1024
_ERROR_LOG_INTERVAL_S = 60.0
_ERROR_LOG_MAX_KINDS = 256


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


class AffinityThreadPool:
    """Single-thread executors; a key always lands on the same one (ordering per key)."""

    def __init__(self, size: int, name: str) -> None:
        self._executors = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-{i}")
            for i in range(max(1, size))
        ]

    def submit(self, key: bytes, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        executor = self._executors[hash(key) % len(self._executors)]
        return executor.submit(fn, *args)

    def shutdown(self, wait: bool = True) -> None:
        for executor in self._executors:
            executor.shutdown(wait=wait)


def build_cache_server(config: MPServerConfig) -> MPCacheServer:
    """Storage (L1 with optional SHM, optional disk L2) and the server state around it.

    Every input is checked and the device backend resolved *before* anything is allocated;
    if construction fails after that, every segment made here is removed again (a crash
    loop must not fill /dev/shm).
    """
    from lmcache.v1.platform import get_device_spec
    from lmcache.v1.platform.cpu.shm import unlink_orphaned_segment, unlink_segment

    config.validate()
    check_device_selection()
    admin = admin_policy(
        config.enable_admin_ops,
        config.enable_http_cache_clear,
        config.admin_token,
        config.admin_token_file,
        os.environ,
    )
    adapters = [parse_l2_adapter(raw) for raw in config.l2_adapters]
    disk_path, disk_size_gb = _disk_tier(config, adapters)
    disk_adopt = _disk_adopt(config, adapters)
    if disk_path:
        inspect_disk_folder(disk_path, disk_adopt)  # refused before L1 memory exists
    engine_config = LMCacheEngineConfig(
        chunk_size=config.chunk_size,
        max_local_cpu_size=config.resolved_l1_size_gb(),
        cache_policy=config.eviction_policy,
        local_disk=disk_path,
        max_local_disk_size=disk_size_gb,
        blocking_timeout_secs=config.blocking_timeout_secs,
        extra_config={"local_disk.adopt": True} if disk_adopt else None,
    )
    shm_name = config.resolved_shm_name()
    check_l1_fits(engine_config.max_local_cpu_size, in_shm=shm_name is not None)
    shm_preexisting = shm_name is not None and _segment_exists(shm_name)
    backends: OrderedDict[str, StorageBackendInterface] = OrderedDict()
    storage: StorageManager | None = None
    try:
        try:
            backends = create_storage_backends(engine_config, shm_name=shm_name)
        except OSError as exc:
            tiers = f"L1 and the disk tier at {disk_path!r}" if disk_path else "L1"
            raise OSError(f"cannot create {tiers}: {exc}") from exc
        _add_remote_adapters(adapters, backends)
        storage = StorageManager(engine_config, backends=backends)
        _prefault(storage)
        settings = CacheServerSettings(
            chunk_size=config.chunk_size,
            supported_transfer_mode=config.supported_transfer_mode,
            worker_reap_timeout_seconds=config.worker_reap_timeout_seconds,
            pending_transfer_timeout_seconds=config.pending_transfer_timeout_seconds,
            session_ttl_seconds=config.session_ttl_seconds,
            instance_id=config.instance_id,
            admin=admin,
        )
        return MPCacheServer(
            settings,
            storage,
            get_device_spec,
            unlink_orphaned_segment=unlink_orphaned_segment,
            enable_metrics=not config.disable_metrics,
        )
    except BaseException:
        _release_partial_storage(storage, backends)
        if shm_name is not None and not shm_preexisting:
            unlink_segment(shm_name)
        raise


def check_l1_fits(size_gb: float, in_shm: bool) -> None:
    """L1 is touched page by page at start-up: more than /dev/shm (or memory) holds would
    end in SIGBUS or the OOM killer, with the segment left behind."""
    from lmcache.v1.multiprocess.config import meminfo_available_bytes

    size = int(size_gb * 1024**3)
    if in_shm:
        from lmcache.v1.platform.cpu.shm import SHM_DIR

        st = os.statvfs(SHM_DIR)
        free = st.f_bavail * st.f_frsize
        where = f"free space in {SHM_DIR}"
    else:
        free = meminfo_available_bytes() or size
        where = "available memory"
    if size > free:
        raise ValueError(
            f"--l1-size-gb {size_gb:g} does not fit: {where} is {free / 1024**3:.2f} GiB"
        )


def check_device_selection() -> None:
    """The selected device backend (``LMCACHE_DEVICE_BACKEND``, else by priority) must
    resolve: a bad selection is refused before anything is allocated."""
    from lmcache.v1.platform import get_selection

    get_selection()


def _segment_exists(shm_name: str) -> bool:
    from lmcache.v1.platform.cpu.shm import SHM_DIR

    return os.path.exists(os.path.join(SHM_DIR, shm_name.lstrip("/")))


def _release_partial_storage(
    storage: StorageManager | None, backends: OrderedDict[str, StorageBackendInterface]
) -> None:
    """Close what a failed construction made (L1's close unlinks its segment)."""
    try:
        if storage is not None:
            storage.close()
            return
        for backend in reversed(list(backends.values())):
            backend.close()
    except Exception:
        logger.exception("cleanup after a failed start-up")


_DISK_ADAPTER_TYPES = ("disk", "fs")
_DEFAULT_DISK_ADAPTER_SIZE_GB = 10.0


def parse_l2_adapter(raw: str) -> dict[str, Any]:
    """One ``--l2-adapter`` JSON object; errors name the flag and the bad value."""
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--l2-adapter {raw!r} is not valid JSON: {exc}") from exc
    if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
        raise ValueError(f'--l2-adapter {raw!r} must be a JSON object with a "type"')
    from lmcache.v1.storage_backend.redis.settings import L2_ADAPTER_TYPES

    known = (*L2_ADAPTER_TYPES, *_DISK_ADAPTER_TYPES)
    if spec["type"] not in known:
        raise ValueError(
            f"--l2-adapter type {spec['type']!r} is not supported; supported: {', '.join(known)}"
        )
    return spec


def _disk_tier(config: MPServerConfig, adapters: list[dict[str, Any]]) -> tuple[str | None, float]:
    """(path, size GB) of the disk tier from --l2-disk-* or a disk adapter (one at most)."""
    disks = [a for a in adapters if a["type"] in _DISK_ADAPTER_TYPES]
    if config.l2_disk_path and config.l2_disk_size_gb > 0:
        disks.insert(0, {"path": config.l2_disk_path, "size_gb": config.l2_disk_size_gb})
    if len(disks) > 1:
        raise ValueError("only one disk tier is supported (--l2-disk-path or one disk adapter)")
    if not disks:
        return None, 0.0
    disk = disks[0]
    if not isinstance(disk.get("path"), str) or not disk["path"]:
        raise ValueError('--l2-adapter of type disk needs a "path"')
    size = float(disk.get("size_gb", _DEFAULT_DISK_ADAPTER_SIZE_GB))
    if size <= 0:
        raise ValueError(f"--l2-adapter disk size_gb must be positive, got {size}")
    return disk["path"], size


def _disk_adopt(config: MPServerConfig, adapters: list[dict[str, Any]]) -> bool:
    """Whether the disk tier may adopt a folder holding foreign files (--l2-disk-adopt or
    ``"adopt": true`` in the disk adapter)."""
    adopt = config.l2_disk_adopt
    for spec in adapters:
        if spec["type"] in _DISK_ADAPTER_TYPES and "adopt" in spec:
            if not isinstance(spec["adopt"], bool):
                raise ValueError(
                    f'--l2-adapter disk "adopt" must be true or false, got {spec["adopt"]!r}'
                )
            adopt = adopt or spec["adopt"]
    return adopt


def _add_remote_adapters(
    adapters: list[dict[str, Any]], backends: OrderedDict[str, StorageBackendInterface]
) -> None:
    from lmcache.v1.storage_backend.redis.factory import create_from_l2_adapter
    from lmcache.v1.storage_backend.redis.settings import L2_ADAPTER_TYPES

    cpu = backends[L1_NAME]
    assert isinstance(cpu, LocalCPUBackend)
    for index, spec in enumerate(a for a in adapters if a["type"] in L2_ADAPTER_TYPES):
        backends[f"L2Adapter{index}:{spec['type']}"] = create_from_l2_adapter(spec, cpu)
        logger.info("L2 adapter %d: %s tier added", index, spec["type"])


def _prefault(storage: StorageManager) -> None:
    """Touch every L1 page now: first-touch faults on shared memory would otherwise land
    inside the first stores (several times slower than the copy itself)."""
    buffer = getattr(storage.get_memory_allocator(), "buffer", None)
    if isinstance(buffer, torch.Tensor):
        step = 64 * 1024**2
        for start in range(0, buffer.numel(), step):
            buffer[start : start + step].zero_()


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
        # The transport drops (and disconnects) anything far beyond the limit; between the
        # limit and this cap the request is answered with message_too_large.
        self._router.setsockopt(zmq.MAXMSGSIZE, 2 * config.max_message_bytes)
        self._router.bind(self.endpoint)
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
        self._affinity = AffinityThreadPool(transfer_threads, "lmc-transfer")
        self._pool = ThreadPoolExecutor(other_threads, thread_name_prefix="lmc-handler")
        self._stop = threading.Event()
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self.max_in_flight = MAX_IN_FLIGHT
        self._closed = False
        self._errors = RateLimitedErrorLog(logger)
        self.http_url: str | None = None

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
            self._router.close(linger=0)
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

    def _check_bounds(self, frames: list[zmq.Frame]) -> None:
        """Refuse a request by its frame count and total size (identity frame excluded)."""
        count = len(frames) - 1
        if count < 2:
            raise ProtocolError(
                ErrorCode.MALFORMED_FRAME,
                f"a request is [request_uid, operation, *payloads]; got {count} frame(s)",
            )
        if count > protocol.MAX_REQUEST_FRAMES:
            raise ProtocolError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"request of {count} frames exceeds the limit of {protocol.MAX_REQUEST_FRAMES} "
                f"frames (uid, operation and at most "
                f"{protocol.MAX_REQUEST_FRAMES - 2} payloads)",
            )
        size = sum(len(f) for f in frames[1:])
        if size > self.config.max_message_bytes:
            raise ProtocolError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"request of {size} bytes in {count} frames exceeds the server limit of "
                f"{self.config.max_message_bytes} bytes per request (--max-message-mb)",
            )

    def _handle(self, identity: bytes, frames: list[zmq.Frame]) -> None:
        uid_frame = self._uid_frame(frames)
        operation = ""
        try:
            self._check_bounds(frames)
            try:
                protocol.decode(frames[1].buffer, int)
            except Exception:
                raise ProtocolError(
                    ErrorCode.MALFORMED_FRAME, "request_uid frame is not a msgpack integer"
                ) from None
            op_frame = frames[2].bytes
            operation = protocol.decode_operation(op_frame)
            if self._stop.is_set():
                raise ProtocolError(ErrorCode.SHUTTING_DOWN, "the server is shutting down")
            spec = protocol.RPC_SPECS[operation]
            payloads = protocol.decode_payloads(spec, [f.buffer for f in frames[3:]])
        except ProtocolError as exc:
            self._reply_error(identity, uid_frame, exc.code, exc, operation)
            return
        handler = getattr(self.engine, operation)
        head = (identity, uid_frame, op_frame, operation)
        if operation in AFFINITY_OPERATIONS:
            self._submit(head, handler, payloads, affinity=True)
        elif operation in BLOCKING_OPERATIONS:
            self._submit(head, handler, payloads, affinity=False)
        else:
            self._send(self._run(head, handler, payloads))

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
        head: tuple[bytes, bytes, bytes, str],
        handler: Callable[..., Any],
        payloads: list[Any],
        affinity: bool,
    ) -> None:
        self._begin()
        try:
            if affinity:
                self._affinity.submit(head[0], self._run_and_push, head, handler, payloads)
            else:
                self._pool.submit(self._run_and_push, head, handler, payloads)
        except RuntimeError as exc:  # the pool is shut down: answer here, keep the count right
            self._end()
            self._reply_error(head[0], head[1], ErrorCode.SHUTTING_DOWN, exc, head[3])

    def _begin(self) -> None:
        with self._in_flight_lock:
            self._in_flight += 1

    def _end(self) -> None:
        with self._in_flight_lock:
            self._in_flight -= 1

    def _count_error(self) -> None:
        self.engine._count(errors=1)

    def _run(
        self,
        head: tuple[bytes, bytes, bytes, str],
        handler: Callable[..., Any],
        payloads: list[Any],
    ) -> list[bytes]:
        identity, uid_frame, op_frame, operation = head
        metrics = self.engine.metrics
        start = time.perf_counter() if metrics is not None else 0.0
        try:
            response = handler(*payloads)
            reply = [identity, *protocol.encode_success(uid_frame, op_frame, response)]
            if metrics is not None:
                metrics.observe_request(operation, "ok", time.perf_counter() - start)
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
        except Exception as exc:
            self._errors.exception("metrics", exc)
        return [identity, *protocol.encode_error(uid_frame, code, message, operation)]

    def _run_and_push(
        self,
        head: tuple[bytes, bytes, bytes, str],
        handler: Callable[..., Any],
        payloads: list[Any],
    ) -> None:
        try:
            reply = self._run(head, handler, payloads)
            self._push_socket().send_multipart(reply)
        except Exception as exc:  # a handler thread must survive to serve the next request
            self._errors.exception("reply", exc)
        finally:
            self._end()

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
                frames = self._replies.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._send(frames)

    def _send(self, frames: list[bytes]) -> None:
        try:
            self._router.send_multipart(frames, zmq.NOBLOCK)
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


def run_server(config: MPServerConfig, ready: Callable[[MPServer], None] | None = None) -> int:
    """Build, serve until SIGINT/SIGTERM, shut down cleanly; returns an exit status.

    Start-up failures raise (``ValueError``/``RuntimeError``/``OSError`` with a one-line
    message) after releasing everything already made, shared memory included.
    """
    # One id for the whole run (upstream: --instance-id, else a random uuid4 at start-up).
    config = dataclasses.replace(config, instance_id=config.resolved_instance_id())
    with _sigterm_interrupts():  # a SIGTERM while L1 is being made must still clean up
        engine = build_cache_server(config)
        try:
            server = MPServer(config, engine)
        except BaseException as exc:
            engine.close()
            if isinstance(exc, zmq.ZMQError):
                raise RuntimeError(
                    f"cannot listen on tcp://{config.host}:{config.port}: {exc}"
                ) from None
            raise

    def on_signal(signum: int, _frame: Any) -> None:
        logger.info("received %s; stopping", signal.Signals(signum).name)
        server.request_stop()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    logger.info("LMCache MP server instance id %s", config.instance_id)
    frontends: list[Any] = []
    try:
        frontends = start_frontends(config, server)
        if ready is not None:
            ready(server)
        server.serve_forever()
    finally:
        for frontend in frontends:
            frontend.stop()
        server.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt (like SIGINT) inside the block, so construction's
    cleanup runs instead of the process dying with its segments (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def start_frontends(config: MPServerConfig, server: MPServer) -> list[Any]:
    """The HTTP frontend and the Prometheus endpoint, each unless its port is 0.

    A port that cannot be bound is logged as an error and that endpoint stays off: the
    cache keeps serving its clients (a liveness probe on the missing endpoint then fails,
    which is how an orchestrator notices).
    """
    from lmcache.v1.multiprocess.http_server import HTTPFrontend, PrometheusEndpoint

    frontends: list[Any] = []
    server.http_url = None
    if config.http_port:
        try:
            http = HTTPFrontend(
                server.engine,
                config.http_host,
                config.http_port,
                is_serving=server.is_serving,
                allow_cache_clear=config.enable_http_cache_clear,
            )
        except OSError as exc:
            logger.error(
                "HTTP frontend off: cannot listen on %s:%d (%s); pass --http-port",
                config.http_host,
                config.http_port,
                exc,
            )
        else:
            http.start()
            server.http_url = http.url
            frontends.append(http)
    metrics = server.engine.metrics
    if config.prometheus_port and metrics is not None:
        try:
            frontends.append(
                PrometheusEndpoint(metrics.registry, config.http_host, config.prometheus_port)
            )
        except OSError as exc:
            logger.error(
                "Prometheus endpoint off: cannot listen on %s:%d (%s); pass --prometheus-port",
                config.http_host,
                config.prometheus_port,
                exc,
            )
    return frontends


def main(argv: list[str] | None = None) -> int:
    from lmcache.logging import init_logger
    from lmcache.v1.multiprocess.config import add_mp_server_args, config_from_args, log_level

    parser = argparse.ArgumentParser(prog="python -m lmcache.v1.multiprocess.server")
    add_mp_server_args(parser)
    parser.add_argument("--log-level", type=log_level, default=None)
    args = parser.parse_args(argv)
    init_logger(args.log_level)
    try:
        return run_server(config_from_args(args))
    except (ValueError, RuntimeError, OSError) as exc:
        logger.debug("start-up failed", exc_info=True)
        parser.exit(1, f"{parser.prog}: error: {' '.join(str(exc).split())}\n")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
