"""Who hears about pins: observers of every pin and unpin of a memory object.

The memory layer counts pins itself (:mod:`.objects`); anything that wants to watch them
(a stats monitor, a watchdog that force-unpins objects pinned too long) registers a
:class:`PinObserver` here instead of the memory objects importing it.  Observers run under
the object's lock, so a concurrent unpin cannot overtake the pin that precedes it; they
must be quick and must not take the object's lock again.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

logger = logging.getLogger(__name__)


class PinObserver(Protocol):
    def on_pin(self, obj: object, pin_count: int) -> None:
        """``obj`` was just pinned; ``pin_count`` is its count after the pin."""

    def on_unpin(self, obj: object, pin_count: int) -> None:
        """``obj`` was just unpinned; ``pin_count`` is its count after the unpin."""


class PinHooks:
    """The observers of one process, notified in registration order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._observers: tuple[PinObserver, ...] = ()

    def register(self, observer: PinObserver) -> None:
        """Add ``observer`` (idempotent)."""
        with self._lock:
            if observer not in self._observers:
                self._observers = (*self._observers, observer)

    def unregister(self, observer: PinObserver) -> None:
        with self._lock:
            self._observers = tuple(o for o in self._observers if o is not observer)

    def pinned(self, obj: object, pin_count: int) -> None:
        for observer in self._observers:
            observer.on_pin(obj, pin_count)

    def unpinned(self, obj: object, pin_count: int) -> None:
        for observer in self._observers:
            observer.on_unpin(obj, pin_count)


#: The process's pin observers (empty unless something registered one).
PIN_HOOKS = PinHooks()
