"""Upstream LMCache 0.5.6's ``lmcache.v1.periodic_thread``: named background threads that
run one task every ``interval`` seconds.

* :class:`PeriodicThread` -- subclass it and implement ``_execute`` (one cycle, returning a
  :class:`ThreadRunSummary`).  ``start()`` runs the loop on a daemon thread named after the
  task, ``stop()`` ends it promptly (the interval sleep is interruptible) and ``wake()``
  asks for the next cycle now.  A cycle that raises is recorded as failed and the loop goes
  on; one that raises :class:`~upstream_056.exceptions.IrrecoverableException` ends the loop
  (``start()`` may run it again).
* :func:`create_periodic_thread` -- the same from a plain function, registered in the
  registry unless ``auto_register=False``.
* :class:`PeriodicThreadRegistry` -- what is running, for status pages.
  ``PeriodicThreadRegistry.get_instance()`` is a **per-process registry**: one instance per
  interpreter, created on first use under a class-level lock, as upstream has it.  It only
  lists threads (registering starts nothing, unregistering or ``reset()`` stops nothing);
  an owner that stops its thread unregisters it itself.  Code that wants no shared state
  may create its own ``PeriodicThreadRegistry()`` or pass ``auto_register=False``.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from lmcache.compat.upstream_056.exceptions import IrrecoverableException

logger = logging.getLogger(__name__)

__all__ = [
    "PeriodicThread",
    "PeriodicThreadRegistry",
    "ThreadLevel",
    "ThreadRunSummary",
    "create_periodic_thread",
]

# A thread counts as active while its last cycle began less than this many intervals ago.
_ACTIVE_INTERVALS = 3


class ThreadLevel(Enum):
    """How much the process suffers when the thread stops (for monitoring only)."""

    CRITICAL = "critical"  # severe degradation or data loss
    HIGH = "high"  # a feature or performance is badly hurt
    MEDIUM = "medium"  # noticeable, the process still works
    LOW = "low"  # little effect


@dataclass
class ThreadRunSummary:
    """The outcome of one cycle; the loop fills in ``timestamp`` and ``duration_ms``."""

    timestamp: float = 0.0
    duration_ms: float = 0.0
    success: bool = True
    message: str = ""
    extra_info: dict[str, str] = field(default_factory=dict)


class PeriodicThread(ABC):
    """A task run every ``interval`` seconds on its own daemon thread.

    The first cycle runs ``init_wait`` seconds after ``start()`` (at once by default);
    each later one ``interval`` seconds after the previous cycle *ended*, or sooner after
    ``wake()``.
    """

    def __init__(
        self,
        name: str,
        interval: float,
        level: ThreadLevel = ThreadLevel.MEDIUM,
        init_wait: float = 0.0,
    ) -> None:
        if not interval > 0:
            # Zero would spin a core; NaN never sleeps either.
            raise ValueError(f"PeriodicThread {name!r}: interval must be > 0, got {interval}")
        if not init_wait >= 0:
            raise ValueError(f"PeriodicThread {name!r}: init_wait must be >= 0, got {init_wait}")
        self._name = name
        self._interval = float(interval)
        self._level = level
        self._init_wait = float(init_wait)
        self._stop_event = threading.Event()
        # Set by wake() and stop() to end the interval sleep early.
        self._wake_event = threading.Event()
        self._thread: threading.Thread | None = None
        # Guards the thread handle and the run statistics (read by status pages).
        self._lock = threading.RLock()
        self._start_time = 0.0
        self._last_run_time = 0.0
        self._last_summary: ThreadRunSummary | None = None
        self._total_runs = 0
        self._failed_runs = 0

    # -- configuration and statistics --------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def interval(self) -> float:
        return self._interval

    @property
    def level(self) -> ThreadLevel:
        return self._level

    @property
    def init_wait(self) -> float:
        return self._init_wait

    @property
    def last_run_time(self) -> float:
        """When the last cycle began (``time.time()``), 0.0 before the first."""
        with self._lock:
            return self._last_run_time

    @property
    def last_summary(self) -> ThreadRunSummary | None:
        with self._lock:
            return self._last_summary

    @property
    def total_runs(self) -> int:
        with self._lock:
            return self._total_runs

    @property
    def failed_runs(self) -> int:
        with self._lock:
            return self._failed_runs

    @property
    def is_running(self) -> bool:
        """The loop is alive and no stop was asked for."""
        with self._lock:
            thread = self._thread
        return thread is not None and thread.is_alive() and not self._stop_event.is_set()

    @property
    def stop_requested(self) -> bool:
        """``stop()`` was called since the last ``start()``."""
        return self._stop_event.is_set()

    @property
    def is_active(self) -> bool:
        """Running, and a cycle began within the last three intervals (or, before the first
        cycle, within ``init_wait`` plus three intervals of ``start()``)."""
        if not self.is_running:
            return False
        now = time.time()
        with self._lock:
            if self._last_run_time == 0.0:
                return now - self._start_time < self._init_wait + _ACTIVE_INTERVALS * self._interval
            return now - self._last_run_time < _ACTIVE_INTERVALS * self._interval

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> threading.Thread | None:
        """Start the loop; returns its thread, or None when a previous loop is still alive
        (running, or stopped but not yet finished its cycle)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                logger.warning("PeriodicThread %s is already running", self._name)
                return None
            self._stop_event.clear()
            self._wake_event.clear()
            self._start_time = time.time()
            thread = threading.Thread(target=self._run_loop, name=self._name, daemon=True)
            self._thread = thread
            thread.start()
        logger.info(
            "Started PeriodicThread %s (level=%s, interval=%.3gs, init_wait=%.3gs)",
            self._name,
            self._level.value,
            self._interval,
            self._init_wait,
        )
        return thread

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the loop to end and wait up to ``timeout`` seconds for it (a cycle in
        progress is not interrupted).  Called by the task itself, it returns at once and
        the loop ends after the current cycle."""
        with self._lock:
            thread = self._thread
        if thread is None:
            return
        self._stop_event.set()
        self._wake_event.set()
        if thread is threading.current_thread() or not thread.is_alive():
            return
        thread.join(timeout)
        if thread.is_alive():
            logger.warning(
                "PeriodicThread %s did not finish within %.3gs of stop()", self._name, timeout
            )
        else:
            logger.info("Stopped PeriodicThread %s", self._name)

    def wake(self) -> None:
        """Run the next cycle now rather than after the interval; a no-op unless running."""
        if self.is_running:
            self._wake_event.set()

    @abstractmethod
    def _execute(self) -> ThreadRunSummary:
        """One cycle of the task."""

    def _run_loop(self) -> None:
        # Only stop() ends the initial wait: wake() is about the interval sleep.
        if self._init_wait > 0 and self._stop_event.wait(self._init_wait):
            return
        while not self._stop_event.is_set():
            if not self._run_once():
                logger.info("PeriodicThread %s ends after an irrecoverable error", self._name)
                return
            self._wake_event.wait(self._interval)
            # Cleared after the sleep, not before the cycle: a wake() that lands while a
            # cycle runs (or just after start()) still cuts the next sleep short.  One that
            # lands between the sleep's end and this clear merges with the cycle about to run.
            self._wake_event.clear()

    def _run_once(self) -> bool:
        """Run one cycle and record it; False when the loop must end."""
        began = time.time()
        keep_going = True
        try:
            summary = self._execute()
        except IrrecoverableException as exc:
            logger.exception("PeriodicThread %s: irrecoverable error", self._name)
            summary = ThreadRunSummary(success=False, message=str(exc))
            keep_going = False
        except Exception as exc:
            logger.exception("PeriodicThread %s: cycle failed", self._name)
            summary = ThreadRunSummary(success=False, message=str(exc))
        summary.timestamp = began
        summary.duration_ms = (time.time() - began) * 1000.0
        with self._lock:
            self._last_run_time = began
            self._last_summary = summary
            self._total_runs += 1
            if not summary.success:
                self._failed_runs += 1
        return keep_going

    def get_status(self) -> dict[str, Any]:
        """A JSON-able description (upstream's keys)."""
        running, active = self.is_running, self.is_active
        with self._lock:
            last = self._last_summary
            total, failed, last_run = self._total_runs, self._failed_runs, self._last_run_time
        return {
            "name": self._name,
            "level": self._level.value,
            "interval": self._interval,
            "init_wait": self._init_wait,
            "is_running": running,
            "is_active": active,
            "last_run_time": last_run,
            "last_run_ago": time.time() - last_run if last_run > 0 else None,
            "total_runs": total,
            "failed_runs": failed,
            "success_rate": (total - failed) / total * 100.0 if total else None,
            "last_summary": None
            if last is None
            else {
                "timestamp": last.timestamp,
                "duration_ms": last.duration_ms,
                "success": last.success,
                "message": last.message,
                "extra_info": dict(last.extra_info),
            },
        }


class PeriodicThreadRegistry:
    """Periodic threads by name.  ``get_instance()`` is the per-process registry (see the
    module docstring); instances made directly are independent."""

    _instance: ClassVar[PeriodicThreadRegistry | None] = None
    _instance_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._threads: dict[str, PeriodicThread] = {}
        self._lock = threading.Lock()

    @classmethod
    def get_instance(cls) -> PeriodicThreadRegistry:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    @classmethod
    def reset(cls) -> None:
        """Forget the per-process registry (its threads keep running).  For tests."""
        with cls._instance_lock:
            if cls._instance is not None:
                cls._instance.unregister_all()
            cls._instance = None

    def register(self, thread: PeriodicThread) -> None:
        """Add ``thread``; one already registered under its name is replaced."""
        with self._lock:
            replaced = self._threads.get(thread.name)
            self._threads[thread.name] = thread
        if replaced is not None and replaced is not thread:
            logger.warning("PeriodicThread %s was registered already: replaced", thread.name)

    def unregister(self, name: str) -> PeriodicThread | None:
        with self._lock:
            return self._threads.pop(name, None)

    def unregister_all(self) -> None:
        with self._lock:
            self._threads.clear()

    def get(self, name: str) -> PeriodicThread | None:
        with self._lock:
            return self._threads.get(name)

    def get_all(self) -> list[PeriodicThread]:
        with self._lock:
            return list(self._threads.values())

    def get_by_level(self, level: ThreadLevel) -> list[PeriodicThread]:
        return [t for t in self.get_all() if t.level == level]

    def get_running_count(self) -> int:
        return sum(t.is_running for t in self.get_all())

    def get_active_count(self) -> int:
        return sum(t.is_active for t in self.get_all())

    def get_count_by_level(self, level: ThreadLevel) -> dict[str, int]:
        """``{"total", "running", "active"}`` for one level."""
        threads = self.get_by_level(level)
        return {
            "total": len(threads),
            "running": sum(t.is_running for t in threads),
            "active": sum(t.is_active for t in threads),
        }

    def get_summary(self) -> dict[str, Any]:
        """Counts overall and by level, and every thread's :meth:`~PeriodicThread.get_status`."""
        # One snapshot, so the counts and the thread list describe the same set.
        threads = self.get_all()
        return {
            "total_count": len(threads),
            "running_count": sum(t.is_running for t in threads),
            "active_count": sum(t.is_active for t in threads),
            "by_level": {
                level.value: {
                    "total": sum(t.level == level for t in threads),
                    "running": sum(t.level == level and t.is_running for t in threads),
                    "active": sum(t.level == level and t.is_active for t in threads),
                }
                for level in ThreadLevel
            },
            "threads": [t.get_status() for t in threads],
        }


class _FunctionThread(PeriodicThread):
    """A :class:`PeriodicThread` whose cycle is a plain function."""

    def __init__(
        self,
        name: str,
        interval: float,
        execute_fn: Callable[[], ThreadRunSummary],
        level: ThreadLevel,
        init_wait: float,
    ) -> None:
        super().__init__(name=name, interval=interval, level=level, init_wait=init_wait)
        self._execute_fn = execute_fn

    def _execute(self) -> ThreadRunSummary:
        return self._execute_fn()


def create_periodic_thread(
    name: str,
    interval: float,
    execute_fn: Callable[[], ThreadRunSummary],
    level: ThreadLevel = ThreadLevel.MEDIUM,
    init_wait: float = 0.0,
    auto_register: bool = True,
) -> PeriodicThread:
    """A (not yet started) periodic thread running ``execute_fn`` each cycle; registered in
    the per-process registry unless ``auto_register`` is False."""
    thread = _FunctionThread(name, interval, execute_fn, level, init_wait)
    if auto_register:
        PeriodicThreadRegistry.get_instance().register(thread)
    return thread
