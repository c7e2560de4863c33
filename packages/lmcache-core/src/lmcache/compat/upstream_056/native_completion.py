"""Stream-ordered host callbacks, dispatched off the device driver's thread.

``submit_callback_to_stream(stream, kind, payload)`` encodes ``payload`` (msgpack) and
asks the device ops to record ``(kind, bytes)`` once the stream reaches that point
(``record_completion_on_stream``; the torch baseline records at once, since host work is
already ordered).  A :class:`DeviceHostFuncDispatcher` thread drains the recorded
completions and calls the handler registered for each kind with the payload decoded to
that kind's type.  Handler errors are counted and logged; they never stop the thread.
Upstream 0.5.6 API.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

logger = logging.getLogger(__name__)

__all__ = ["DeviceHostFunc", "DeviceHostFuncDispatcher", "submit_callback_to_stream"]

DeviceHostFunc = Callable[[Any], None]

# The ops the completions go through; None = the selected backend's, resolved on first use.
# Tests (and upstream's) swap it for another backend's ops.
_device_ops: Any = None


def _ops() -> Any:
    global _device_ops
    if _device_ops is None:
        from lmcache.v1.platform import resolve_device_ops

        _device_ops = resolve_device_ops()
    return _device_ops


@dataclass(frozen=True)
class _Registration:
    handler: DeviceHostFunc
    decoder: msgspec.msgpack.Decoder[Any]


class DeviceHostFuncDispatcher:
    """Drains recorded completions every ``drain_interval_seconds`` and runs the handlers."""

    def __init__(self, drain_interval_seconds: float = 0.005) -> None:
        if drain_interval_seconds <= 0:
            raise ValueError(
                f"drain_interval_seconds must be positive, got {drain_interval_seconds}"
            )
        self._interval = drain_interval_seconds
        self._registry: dict[str, _Registration] = {}
        self._lock = threading.Lock()
        self._exception_counts: dict[str, int] = {}
        self._dispatched = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self, kind: str, handler: DeviceHostFunc, payload_type: Any) -> None:
        """Run ``handler(payload)`` for each ``kind`` completion, decoded as ``payload_type``."""
        with self._lock:
            if kind in self._registry:
                raise ValueError(f"a handler for completion kind {kind!r} is already registered")
            self._registry[kind] = _Registration(handler, msgspec.msgpack.Decoder(payload_type))

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("DeviceHostFuncDispatcher is already started")
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name="lmcache-device-host-func", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread after one last drain, so nothing recorded before is lost."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout)
        if thread.is_alive():
            logger.warning("DeviceHostFuncDispatcher did not stop within %.1f s", timeout)

    @property
    def dispatched_count(self) -> int:
        return self._dispatched

    @property
    def handler_exception_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._exception_counts)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._drain_once()
        self._drain_once()

    def _drain_once(self) -> None:
        try:
            completions = _ops().drain_recorded_completions()
        except Exception:
            logger.exception("DeviceHostFuncDispatcher: draining completions failed")
            return
        with self._lock:
            registry = dict(self._registry)
        for kind, encoded in completions:
            registration = registry.get(kind)
            if registration is None:
                logger.warning("DeviceHostFuncDispatcher: no handler for kind %r; dropped", kind)
                continue
            self._dispatch(kind, registration, encoded)

    def _dispatch(self, kind: str, registration: _Registration, encoded: bytes) -> None:
        try:
            registration.handler(registration.decoder.decode(encoded))
        except Exception:
            with self._lock:
                self._exception_counts[kind] = self._exception_counts.get(kind, 0) + 1
            logger.exception("DeviceHostFuncDispatcher: the handler for %r raised", kind)
            return
        self._dispatched += 1


def submit_callback_to_stream(stream: Any, kind: str, payload: Any) -> None:
    """Record ``(kind, msgpack(payload))`` in ``stream``'s order (reads ``stream.ptr``)."""
    encoded = msgspec.msgpack.encode(payload)
    _ops().record_completion_on_stream(stream.ptr, kind, encoded)
