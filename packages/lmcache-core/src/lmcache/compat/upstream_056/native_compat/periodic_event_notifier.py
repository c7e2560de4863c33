"""A per-process ticker that writes to registered fds, as upstream's native one does.

Upstream LMCache 0.5.6 builds ``lmcache_native.PeriodicEventNotifier`` in C++: one
background thread that, while at least one fd is registered, writes a wakeup to every
registered fd, then waits ``interval_ms``; with no fd registered it sleeps until one is.
Event loops poll those fds, so a periodic duty (flushing, expiring) runs without a timer
thread of their own.  This is the same contract in Python:

* one instance per process, made by :meth:`PeriodicEventNotifier.create` (a second call
  is a no-op, whatever its arguments), found by :meth:`get` (``None`` before ``create``
  and after ``shutdown``) and stopped by :meth:`shutdown`, which joins the thread;
* the wakeup written is an 8-byte native-endian ``1`` when the notifier was created with
  ``use_eventfd=True`` (what an eventfd counter accepts), else one ``0x01`` byte (a pipe);
* while no fd is registered the thread sleeps; the first registration wakes it and a
  wakeup goes out at once, then one every ``interval_ms`` (at least 1 ms) to every fd
  registered at that moment; a later registration, and ``set_interval_ms``, take effect
  at the next wakeup (the wait under way is not cut short);
* a write that would block (a full pipe, a saturated eventfd) or fails (a closed fd) is
  dropped: the reader has a wakeup pending, or the fd is gone.  Registering an fd does
  not hand it over: the caller keeps ownership, closes it and should unregister it
  first (a closed fd's number can be reused by another file, which would then be
  written to).

The thread is a daemon, so a process that never calls ``shutdown`` still exits, and the
notifier opens no fds of its own (it waits on a condition variable), so it has none to
leak.
"""

from __future__ import annotations

import logging
import operator
import os
import sys
import threading
from typing import ClassVar

__all__ = ["PeriodicEventNotifier"]

logger = logging.getLogger(__name__)

# What each wakeup writes: an eventfd takes exactly one 8-byte counter increment in host
# byte order; for a pipe one byte is enough to make the read end readable.
_EVENTFD_TICK = (1).to_bytes(8, sys.byteorder)
_PIPE_TICK = b"\x01"

# pybind11 converts upstream's ``int`` arguments to a C ``int``.
_C_INT_MIN = -(1 << 31)
_C_INT_MAX = (1 << 31) - 1


def _as_c_int(value: object, name: str) -> int:
    """``value`` as a C ``int``, or the ``TypeError`` pybind11 raises when it cannot convert."""
    if isinstance(value, float):
        raise TypeError(f"{name} must be an integer, not float")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}") from None
    if not _C_INT_MIN <= number <= _C_INT_MAX:
        raise TypeError(f"{name} must fit a C int, got {number}")
    return number


class PeriodicEventNotifier:
    """The process's periodic fd notifier; use :meth:`create` / :meth:`get`, not the class."""

    # The documented per-process singleton (upstream keeps a static instance too).
    _instance: ClassVar[PeriodicEventNotifier | None] = None
    _instance_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, interval_ms: int, use_eventfd: bool) -> None:
        # Private in upstream (the constructor is not bound); here it is callable but
        # create() is the way in, so that there is one thread per process.
        self._interval_ms = max(1, _as_c_int(interval_ms, "interval_ms"))
        self._tick = _EVENTFD_TICK if use_eventfd else _PIPE_TICK
        self._fds: set[int] = set()
        self._stop = False
        self._wake = threading.Condition(threading.Lock())
        self._thread = threading.Thread(
            target=self._run, name="lmcache-periodic-event-notifier", daemon=True
        )
        self._thread.start()

    # -- the singleton -------------------------------------------------------------------

    @staticmethod
    def create(interval_ms: int, use_eventfd: bool) -> None:
        """Create the process's notifier and start its thread; a no-op if one exists."""
        with PeriodicEventNotifier._instance_lock:
            if PeriodicEventNotifier._instance is None:
                PeriodicEventNotifier._instance = PeriodicEventNotifier(
                    interval_ms, bool(use_eventfd)
                )

    @staticmethod
    def get() -> PeriodicEventNotifier | None:
        """The process's notifier, or ``None`` when none has been created (or it was shut
        down)."""
        return PeriodicEventNotifier._instance

    @staticmethod
    def shutdown() -> None:
        """Stop the process's notifier and join its thread; a no-op if there is none."""
        with PeriodicEventNotifier._instance_lock:
            instance = PeriodicEventNotifier._instance
            if instance is None:
                return
            instance._close()
            PeriodicEventNotifier._instance = None

    # -- the instance --------------------------------------------------------------------

    def register_fd(self, fd: int) -> None:
        """Write a wakeup to ``fd`` at every tick from the next one on (at once when the
        notifier was idle); registering twice is one registration."""
        number = _as_c_int(fd, "fd")
        with self._wake:
            self._fds.add(number)
            self._wake.notify_all()

    def unregister_fd(self, fd: int) -> None:
        """Stop writing to ``fd`` (an fd not registered is ignored).  A wakeup already
        being written when this is called may still arrive."""
        number = _as_c_int(fd, "fd")
        with self._wake:
            self._fds.discard(number)

    def set_interval_ms(self, interval_ms: int) -> None:
        """Wait ``interval_ms`` (at least 1) between wakeups, from the next wait on."""
        value = max(1, _as_c_int(interval_ms, "interval_ms"))
        with self._wake:
            self._interval_ms = value

    def _close(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _signal(self, fd: int) -> None:
        try:
            os.write(fd, self._tick)
        except BlockingIOError:
            pass  # the reader has a wakeup pending already
        except OSError as exc:
            # A closed or foreign fd: upstream drops these writes too; keep the thread.
            logger.debug("periodic notifier: write to fd %d failed: %s", fd, exc)

    def _run(self) -> None:
        while True:
            with self._wake:
                # Dormant while nothing is registered: no wakeups, no CPU.
                self._wake.wait_for(lambda: self._stop or bool(self._fds))
                if self._stop:
                    return
                snapshot = list(self._fds)
            for fd in snapshot:
                self._signal(fd)
            with self._wake:
                # Only stopping ends this wait early (as upstream's wait_for on stop_): a
                # new fd or interval takes effect at the next wakeup, not with an extra one.
                self._wake.wait_for(lambda: self._stop, self._interval_ms / 1000.0)
                if self._stop:
                    return
