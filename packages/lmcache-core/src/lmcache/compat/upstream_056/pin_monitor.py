"""Upstream LMCache 0.5.6's ``lmcache.v1.pin_monitor``: force-unpins objects pinned too long.

A pinned memory object cannot be evicted.  A caller that pins and then never unpins (a
crashed request, a lost retrieve) would hold its memory forever; :class:`PinMonitor`
remembers when each object was last pinned and, every ``pin_check_interval_sec`` seconds,
unpins the ones pinned for more than ``pin_timeout_sec`` seconds, logs a warning for each
and counts them in :class:`~upstream_056.observability.LMCStatsMonitor`
(``interval_forced_unpin_count``).  :class:`~lmcache.v1.memory.objects.TensorMemoryObj`
reports every pin and its last unpin here.

``PinMonitor.GetOrCreate(config)`` is a **per-process singleton**, as upstream has it: one
watchdog thread serves every allocator of the process.  Differences from upstream:
  * pins are watched only in a process that created the monitor (the in-process engine
    path, or a caller of ``GetOrCreate``): a pin does not create it.  ``lmcache server``
    keeps a lookup's chunks pinned until that request retrieves them or its session
    ends, and releases them itself, so a watchdog there would unpin chunks a live
    request still needs;
  * without a config the first instance uses upstream's config defaults
    (:data:`DEFAULT_PIN_TIMEOUT_SEC`, :data:`DEFAULT_PIN_CHECK_INTERVAL_SEC`) instead of
    failing an assertion, so pinning works in a process that built no engine config;
  * there is no Prometheus gauge (``GetOrCreate`` takes no ``metadata``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, ClassVar, Protocol

from lmcache.compat.upstream_056.observability import LMCStatsMonitor
from lmcache.compat.upstream_056.periodic_thread import (
    PeriodicThread,
    PeriodicThreadRegistry,
    ThreadLevel,
    ThreadRunSummary,
)
from lmcache.v1.memory.pin_hooks import PIN_HOOKS

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_PIN_CHECK_INTERVAL_SEC",
    "DEFAULT_PIN_TIMEOUT_SEC",
    "PinMonitor",
    "PinMonitorConfig",
]

# Upstream's defaults of the pin_timeout_sec / pin_check_interval_sec config keys.
DEFAULT_PIN_TIMEOUT_SEC = 300
DEFAULT_PIN_CHECK_INTERVAL_SEC = 30


class PinMonitorConfig(Protocol):
    """What the monitor reads of a config (``LMCacheEngineConfig`` has both keys)."""

    pin_timeout_sec: int
    pin_check_interval_sec: int


class PinMonitor(PeriodicThread):
    """Watchdog over pinned memory objects (see the module docstring)."""

    _instance: ClassVar[PinMonitor | None] = None
    _instance_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, config: PinMonitorConfig | None = None) -> None:
        timeout = DEFAULT_PIN_TIMEOUT_SEC if config is None else config.pin_timeout_sec
        interval = (
            DEFAULT_PIN_CHECK_INTERVAL_SEC if config is None else config.pin_check_interval_sec
        )
        if timeout <= 0:
            raise ValueError(f"pin_timeout_sec must be > 0, got {timeout}")
        super().__init__(name="PinMonitor-thread", interval=interval, level=ThreadLevel.CRITICAL)
        # id(obj) -> (obj, when it was last pinned).  Keyed by id because memory objects
        # are not hashable by value; holding the object keeps the id from being reused.
        self._pinned_objects: dict[int, tuple[Any, float]] = {}
        self._objects_lock = threading.Lock()
        self._check_interval = interval
        self._pin_timeout_sec = timeout
        PeriodicThreadRegistry.get_instance().register(self)
        self.start_monitoring()

    @staticmethod
    def GetOrCreate(config: PinMonitorConfig | None = None) -> PinMonitor:
        """The process's monitor; ``config`` only matters when it is created."""
        with PinMonitor._instance_lock:
            if PinMonitor._instance is None:
                PinMonitor._instance = PinMonitor(config)
            return PinMonitor._instance

    @staticmethod
    def GetIfCreated() -> PinMonitor | None:
        """The process's monitor if one was created, else None (pins are then unwatched)."""
        return PinMonitor._instance

    @staticmethod
    def DestroyInstance() -> None:
        """Stop the process's monitor and forget it (tests start from a clean slate)."""
        with PinMonitor._instance_lock:
            if PinMonitor._instance is not None:
                PinMonitor._instance.stop_monitoring()
                PinMonitor._instance = None

    def on_pin(self, memory_obj: Any) -> None:
        """``memory_obj`` was pinned (again): its timeout restarts now."""
        with self._objects_lock:
            self._pinned_objects[id(memory_obj)] = (memory_obj, time.time())

    def on_unpin(self, memory_obj: Any) -> None:
        """``memory_obj``'s pin count reached zero: stop watching it."""
        with self._objects_lock:
            self._pinned_objects.pop(id(memory_obj), None)

    def get_monitored_count(self) -> int:
        with self._objects_lock:
            return len(self._pinned_objects)

    def _check_timeouts(self) -> tuple[int, int, int]:
        """One scan: (objects watched, objects timed out, objects force-unpinned)."""
        now = time.time()
        with self._objects_lock:
            watched = len(self._pinned_objects)
            expired = [
                (obj, now - pinned_at)
                for obj, pinned_at in self._pinned_objects.values()
                if obj.meta.pin_count > 0 and now - pinned_at > self._pin_timeout_sec
            ]
        # Unpin outside the lock: unpin() calls back into on_unpin().
        released = sum(self._force_unpin(obj, elapsed) for obj, elapsed in expired)
        if released:
            logger.warning(
                "PinMonitor force-unpinned %d of %d pinned objects (pinned > %ss)",
                released,
                watched,
                self._pin_timeout_sec,
            )
        return watched, len(expired), released

    def _force_unpin(self, memory_obj: Any, elapsed: float) -> bool:
        """Unpin ``memory_obj`` down to zero; False if that failed (logged)."""
        pins = memory_obj.meta.pin_count
        if pins <= 0:
            return False
        logger.warning(
            "Pin timeout: memory object at address %s pinned %d time(s) for %.1fs; unpinning",
            memory_obj.meta.address,
            pins,
            elapsed,
        )
        try:
            # unpin() once per pin so the object releases what each pin held; a bounded
            # loop, so a pin taken meanwhile (which restarted its timeout) is kept.
            for _ in range(pins):
                if memory_obj.meta.pin_count <= 0:
                    break
                memory_obj.unpin()
        except Exception:
            logger.exception("force unpin of memory object %s failed", id(memory_obj))
            return False
        LMCStatsMonitor.GetOrCreate().update_forced_unpin_count(1)
        return True

    def _execute(self) -> ThreadRunSummary:
        watched, expired, released = self._check_timeouts()
        return ThreadRunSummary(
            message=f"Checked {watched} objects, {expired} timeouts, {released} force unpinned",
            extra_info={
                "pinned_count": str(watched),
                "timeout_count": str(expired),
                "force_unpin_count": str(released),
            },
        )

    def start_monitoring(self) -> None:
        if self.is_running:
            return
        self.start()
        logger.debug("PinMonitor started (timeout %ss)", self._pin_timeout_sec)

    def stop_monitoring(self) -> None:
        if not self.is_running:
            return
        registry = PeriodicThreadRegistry.get_instance()
        if registry.get(self.name) is self:
            registry.unregister(self.name)
        self.stop()
        logger.debug("PinMonitor stopped")


class _WatchdogFeed:
    """Feeds the process's monitor, once one was created: every pin restarts an object's
    timeout, its last unpin stops watching it."""

    def on_pin(self, obj: object, pin_count: int) -> None:
        watchdog = PinMonitor.GetIfCreated()
        if watchdog is not None:
            watchdog.on_pin(obj)

    def on_unpin(self, obj: object, pin_count: int) -> None:
        watchdog = PinMonitor.GetIfCreated() if pin_count == 0 else None
        if watchdog is not None:
            watchdog.on_unpin(obj)


WATCHDOG_FEED = _WatchdogFeed()
PIN_HOOKS.register(WATCHDOG_FEED)
