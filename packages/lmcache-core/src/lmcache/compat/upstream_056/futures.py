"""Futures and response streams for MP-mode requests.

This is upstream LMCache 0.5.6's ``lmcache.v1.multiprocess.futures`` API, implemented
for this package:

* :class:`MessagingFuture` -- a result (or failure) that a transport thread delivers
  and any thread waits for; waits that run out raise :class:`LMCacheTimeoutError`, a
  ``TimeoutError``.
* :class:`DeviceMessagingFuture` (alias :data:`CUDAMessagingFuture`) -- a future over a
  raw ``(event handle, result)`` reply: the server exported an IPC event recorded after
  the device work it submitted, so "done" means the reply arrived *and* that event
  completed.  The event is imported through the device's event-IPC backend
  (:func:`~lmcache.v1.platform.base.event_ipc.get_event_ipc_backend`); an empty handle
  means no device work was submitted.  :meth:`DeviceMessagingFuture.wait_on_stream`
  orders a stream after the event without blocking the host.
* :class:`MessagingStream` -- a cancellable iterator of responses.

Unlike upstream: a future settles once (a later ``set_result``/``set_exception`` is
ignored, so a late reply cannot overwrite a local failure); a ``None`` result is a valid
device-future result; a failed raw reply makes the device future done and failed (its
``result`` raises) instead of raising from ``wait``/``query``; and the timeout error does
not publish an observability event (this package has no MP observability bus).
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, cast

from lmcache.v1.platform.base.event_ipc import EventIPCBackend, get_event_ipc_backend

logger = logging.getLogger(__name__)

T = TypeVar("T")


class LMCacheTimeoutError(TimeoutError):
    """A wait on an MP request ran out of time (upstream's name; still a ``TimeoutError``).

    ``session_id`` names the request when the caller knows it.
    """

    def __init__(self, message: str, *, session_id: str = "") -> None:
        super().__init__(message)
        self.session_id = session_id


class MessagingStream(Iterator[T]):
    """An iterator of responses that can be cancelled while a reader is blocked.

    ``read(closed)`` blocks for the next response (raising ``StopIteration`` at the end)
    and should give up once ``closed`` is set; ``cancel`` is what wakes it (for example by
    closing a socket), and runs on :meth:`close`.  The stream owns no thread or timer.
    """

    def __init__(self, read: Callable[[threading.Event], T], cancel: Callable[[], None]) -> None:
        self._read = read
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._on_close: list[Callable[[], None]] = [cancel]

    def __next__(self) -> T:
        if self._closed.is_set():
            raise StopIteration
        return self._read(self._closed)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def add_close_callback(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the stream is closed (at once if it already is)."""
        with self._lock:
            if not self._closed.is_set():
                self._on_close.append(callback)
                return
        callback()

    def close(self) -> None:
        """Cancel the stream, waking a blocked reader; later calls do nothing."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            callbacks, self._on_close = self._on_close, []
        # Outside the lock: a callback may add another callback or read ``closed``.
        for callback in callbacks:
            callback()


class MessagingFuture(Generic[T]):
    """The eventual result of one request, set once by the messaging layer.

    ``is_done_``, ``result_`` and ``exception_`` keep upstream's attribute names.
    """

    def __init__(self) -> None:
        self.is_done_ = threading.Event()
        self.result_: T | None = None
        self.exception_: BaseException | None = None
        self._settle_lock = threading.Lock()
        self._retained_references: list[object] = []

    def query(self) -> bool:
        """Whether the future is done (never blocks)."""
        return self.is_done_.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (``None``: forever); whether it is done."""
        return self.is_done_.wait(timeout)

    def result(self, timeout: float | None = None) -> T:
        """The result, waiting up to ``timeout`` seconds (``None``: forever).

        Raises the request's failure if it failed, :class:`LMCacheTimeoutError` if it is
        not done in time.
        """
        if not self.wait(timeout):
            raise LMCacheTimeoutError("Future result not available within timeout")
        if self.exception_ is not None:
            raise self.exception_
        return cast(T, self.result_)

    def wait_on_stream(self, stream: Any, timeout: float | None = None) -> T:
        """The result, for work that will continue on ``stream``.

        A plain future carries no device event, so this is :meth:`result` and the stream
        is not used; device futures order the stream instead of blocking the host.
        """
        del stream
        return self.result(timeout)

    def _settle(self, result: T | None, exception: BaseException | None) -> bool:
        with self._settle_lock:
            if self.is_done_.is_set():
                logger.debug("Ignoring a second completion of a settled MessagingFuture")
                return False
            self.result_ = result
            self.exception_ = exception
            self.is_done_.set()
            return True

    def set_result(self, result: T) -> None:
        """Complete the future with ``result`` (for the messaging layer, not for users)."""
        self._settle(result, None)

    def set_exception(self, exception: BaseException) -> None:
        """Fail the future; :meth:`result` raises ``exception`` (for the messaging layer)."""
        self._settle(None, exception)

    def retain_reference(self, value: object) -> None:
        """Keep ``value`` alive at least as long as this future (e.g. an exported event
        the remote side still has to import)."""
        self._retained_references.append(value)

    def release_references(self) -> None:
        """Drop what :meth:`retain_reference` kept, once the remote side is done with it."""
        self._retained_references.clear()

    def to_device_future(
        self, device: Any | None = None, event_backend: EventIPCBackend | None = None
    ) -> DeviceMessagingFuture[Any]:
        """A device future over this one, whose result must be ``(event handle, value)``.

        ``device`` defaults to the active device; ``event_backend``, when the caller has
        already resolved and checked one, skips the per-future lookup.
        """
        return DeviceMessagingFuture(
            cast("MessagingFuture[tuple[bytes, Any]]", self), device, event_backend
        )

    def to_cuda_future(self, device: Any | None = None) -> DeviceMessagingFuture[Any]:
        """Deprecated name of :meth:`to_device_future`."""
        warnings.warn(
            "MessagingFuture.to_cuda_future is deprecated: Use to_device_future() instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.to_device_future(device)


def _active_device() -> Any:
    # Resolved on first use so that importing this module never selects a device backend.
    import lmcache

    return lmcache.torch_dev.current_device()


class DeviceMessagingFuture(MessagingFuture[T]):
    """Done when the raw ``(event handle, result)`` reply has arrived and the device work
    behind the handle has completed.

    The handle is imported once, on the first call that finds the reply; an empty handle
    means there is nothing to wait for on the device.  ``timeout`` bounds only the wait
    for the reply: synchronizing the device event is not interruptible.
    """

    def __init__(
        self,
        raw_future: MessagingFuture[tuple[bytes, T]],
        device: Any | None = None,
        event_backend: EventIPCBackend | None = None,
    ) -> None:
        super().__init__()
        self.raw_future_ = raw_future
        self.device_ = device if device is not None else _active_device()
        if event_backend is None:
            # A device without event IPC fails here, not in the middle of a wait.
            event_backend = get_event_ipc_backend(self.device_)
            event_backend.check_event_support(self.device_)
        self._event_backend = event_backend
        self.event_: Any | None = None
        self._prepared = False
        self._event_complete = False
        self._prepare_lock = threading.Lock()

    @staticmethod
    def FromMessagingFuture(  # upstream's name
        raw_future: MessagingFuture[tuple[bytes, T]],
        device: Any | None = None,
        event_backend: EventIPCBackend | None = None,
    ) -> DeviceMessagingFuture[T]:
        return DeviceMessagingFuture(raw_future, device, event_backend)

    def _prepare(self) -> None:
        """Take in the raw reply (which has arrived): its result and imported event."""
        with self._prepare_lock:
            if self._prepared:
                return
            raw = self.raw_future_
            if raw.exception_ is not None:
                self.exception_ = raw.exception_
            elif self.exception_ is None:  # not failed locally through set_exception
                handle, result = cast("tuple[bytes, T]", raw.result_)
                self.result_ = result
                if handle:
                    self.event_ = self._event_backend.import_event(handle, self.device_)
                else:
                    self._event_complete = True
            self._prepared = True

    def _reply(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` for the raw reply and take it in; whether it came."""
        if self._prepared:
            return True
        if self.exception_ is None and not self.raw_future_.wait(timeout):
            return False
        self._prepare()
        return True

    def _sync_event(self) -> None:
        if self.event_ is not None and not self._event_complete:
            self._event_backend.synchronize_event(self.event_, self.device_)
            self._event_complete = True

    def query(self) -> bool:
        """Whether the reply arrived and its device work completed (never blocks)."""
        if not self._prepared and self.exception_ is None and not self.raw_future_.query():
            return False
        self._reply(0)
        if self.exception_ is None and self.event_ is not None and not self._event_complete:
            if not self._event_backend.query_event(self.event_):
                return False
            self._event_complete = True
        self.is_done_.set()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` for the reply, then for its device work; whether done."""
        if not self._reply(timeout):
            return False
        if self.exception_ is None:
            self._sync_event()
        self.is_done_.set()
        return True

    def result(self, timeout: float | None = None) -> T:
        """The result once the device work completed; raises the request's failure, or
        :class:`LMCacheTimeoutError` if the reply does not arrive in time."""
        if not self.wait(timeout):
            raise LMCacheTimeoutError("DeviceMessagingFuture result not available within timeout")
        if self.exception_ is not None:
            raise self.exception_
        return cast(T, self.result_)

    def wait_on_stream(self, stream: Any, timeout: float | None = None) -> T:
        """The result, with ``stream`` made to wait for the device work (no host sync).

        Blocks only until the reply arrives (up to ``timeout``).
        """
        if not self._reply(timeout):
            raise LMCacheTimeoutError(
                "DeviceMessagingFuture raw result not available within timeout"
            )
        if self.exception_ is not None:
            raise self.exception_
        if self.event_ is not None and not self._event_complete:
            self._event_backend.wait_event(self.event_, stream)
        return cast(T, self.result_)

    def set_result(self, result: T) -> None:
        raise NotImplementedError(
            "DeviceMessagingFuture takes its result from the raw future; set that instead"
        )

    def set_exception(self, exception: BaseException) -> None:
        """Fail the future locally (unless the raw reply was already taken in)."""
        with self._prepare_lock:
            if not self._prepared and self.exception_ is None:
                self.exception_ = exception
        self.is_done_.set()


# Upstream's earlier, CUDA-specific name.
CUDAMessagingFuture = DeviceMessagingFuture
