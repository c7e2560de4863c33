"""Poll-able completion signals between threads: an eventfd, or a pipe where there is none.

An L2 adapter (:mod:`lmcache.v1.storage_backend.l2_adapters`) tells whoever drives it that
a task finished by making a file descriptor readable; the driver polls the descriptor and
drains it.  A notifier is a *binary* signal: several ``notify()`` calls before one
``consume()`` read as one.  ``consume()`` and :func:`consume_fd` only ignore "nothing
pending" (``BlockingIOError``); any other ``OSError`` (a closed descriptor) propagates, so
a driver polling a stale fd finds out.  Upstream's names (``create_event_notifier``,
``consume_fd``) are exported from :mod:`lmcache.v1.platform`.
"""

from __future__ import annotations

import abc
import os
from types import TracebackType

HAS_EVENTFD: bool = hasattr(os, "eventfd")
"""Whether :func:`os.eventfd` exists (Linux, Python 3.10+)."""

_DRAIN_BYTES = 4096


class EventNotifier(abc.ABC):
    """A descriptor that becomes readable on :meth:`notify` until :meth:`consume`."""

    @abc.abstractmethod
    def fileno(self) -> int:
        """The descriptor to poll for readability."""

    @abc.abstractmethod
    def notify(self) -> None:
        """Make :meth:`fileno` readable (a no-op if it already is)."""

    @abc.abstractmethod
    def notify_fileno(self) -> int:
        """The descriptor a writer signals through (the same one for an eventfd)."""

    @abc.abstractmethod
    def consume(self) -> None:
        """Drain the signal; a no-op when none is pending."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the descriptors (idempotent)."""

    def __enter__(self) -> EventNotifier:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class EventfdNotifier(EventNotifier):
    """One non-blocking, close-on-exec eventfd."""

    def __init__(self) -> None:
        if not HAS_EVENTFD:
            raise OSError("os.eventfd is not available on this platform")
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def fileno(self) -> int:
        return self._fd

    def notify(self) -> None:
        os.eventfd_write(self._fd, 1)

    def notify_fileno(self) -> int:
        return self._fd

    def consume(self) -> None:
        try:
            os.eventfd_read(self._fd)
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


class PipeNotifier(EventNotifier):
    """A non-blocking pipe: the read end is polled, the write end signalled."""

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        try:
            os.set_blocking(read_fd, False)
            os.set_blocking(write_fd, False)
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            raise
        self._read_fd = read_fd
        self._write_fd = write_fd

    def fileno(self) -> int:
        return self._read_fd

    def notify(self) -> None:
        try:
            os.write(self._write_fd, b"\x01")
        except BlockingIOError:
            pass  # the pipe is full: a signal is pending already

    def notify_fileno(self) -> int:
        return self._write_fd

    def consume(self) -> None:
        _drain_pipe(self._read_fd)

    def close(self) -> None:
        for name in ("_read_fd", "_write_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                os.close(fd)


def _drain_pipe(fd: int) -> None:
    while True:
        try:
            if not os.read(fd, _DRAIN_BYTES):
                return  # the write end is closed: nothing more will come
        except BlockingIOError:
            return


def create_event_notifier() -> EventNotifier:
    """An eventfd notifier where the OS has eventfd, else a pipe notifier."""
    return EventfdNotifier() if HAS_EVENTFD else PipeNotifier()


def consume_fd(fd: int) -> None:
    """Drain a notifier given only its descriptor (e.g. ``adapter.get_load_event_fd()``)."""
    if HAS_EVENTFD:
        try:
            os.eventfd_read(fd)
        except BlockingIOError:
            pass
        return
    _drain_pipe(fd)
