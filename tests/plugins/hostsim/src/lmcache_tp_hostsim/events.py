"""``HostSimEventIPCBackend``: event IPC with its own handle format (``HSIM`` + sequence).

Host copies are synchronous, so an event is complete once recorded; but handles are 12
bytes with a magic prefix, which the cpu backend refuses, and waiting on an event this
backend did not make is an error -- so a server that used the wrong backend fails loudly.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING

from lmcache_tp_hostsim._trace import trace

if TYPE_CHECKING:
    from lmcache.v1.platform.base.streams import DeviceLike, DeviceStream, IPCEvent

_MAGIC = b"HSIM"
_HANDLE_BYTES = len(_MAGIC) + 8


class HostSimEvent:
    __slots__ = ("recorded", "sequence")

    def __init__(self, sequence: int, recorded: bool = False) -> None:
        self.sequence = sequence
        self.recorded = recorded


def _device_type(device: DeviceLike) -> str:
    return str(getattr(device, "type", device)).split(":", 1)[0]


def _require_hostsim_event(event: IPCEvent, action: str) -> HostSimEvent:
    if not isinstance(event, HostSimEvent):
        raise RuntimeError(f"hostsim cannot {action} a foreign event {event!r}")
    return event


class HostSimEventIPCBackend:
    device_type = "hostsim"

    def __init__(self) -> None:
        self._sequence = itertools.count(1)
        self._lock = threading.Lock()

    def check_event_support(self, device: DeviceLike) -> None:
        # hostsim tensors are torch host tensors.
        if _device_type(device) not in ("cpu", "hostsim"):
            raise RuntimeError(f"hostsim events order host memory only, not {device!r}")

    def create_event(self, device: DeviceLike) -> HostSimEvent:
        with self._lock:
            return HostSimEvent(next(self._sequence))

    def export_event(self, event: IPCEvent, device: DeviceLike) -> bytes:
        event = _require_hostsim_event(event, "export")
        return _MAGIC + event.sequence.to_bytes(8, "little")

    def import_event(self, handle: bytes, device: DeviceLike) -> HostSimEvent:
        if len(handle) != _HANDLE_BYTES or not handle.startswith(_MAGIC):
            raise ValueError(f"not a hostsim event handle: {handle!r}")
        return HostSimEvent(int.from_bytes(handle[len(_MAGIC) :], "little"), recorded=True)

    def record_event(self, event: IPCEvent, stream: DeviceStream | None) -> None:
        _require_hostsim_event(event, "record").recorded = True

    def wait_event(self, event: IPCEvent, stream: DeviceStream | None) -> None:
        _require_hostsim_event(event, "wait on")

    def query_event(self, event: IPCEvent) -> bool:
        return _require_hostsim_event(event, "query").recorded

    def synchronize_event(self, event: IPCEvent, device: DeviceLike) -> None:
        event = _require_hostsim_event(event, "synchronize")
        if not event.recorded:
            raise RuntimeError(f"hostsim event {event.sequence} was never recorded")
        trace("synchronize", sequence=event.sequence)
