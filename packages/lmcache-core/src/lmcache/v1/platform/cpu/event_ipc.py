"""``HostEventIPCBackend``: event IPC for KV caches in host memory.

Host copies (the torch baseline and native CPU ops) are synchronous: by the time a worker
sends ``store`` its KV writes are already in memory, and by the time the server replies
to ``retrieve`` its writes to the worker's shared pages are done.  So an event here is a
*completed marker*: exporting yields an 8-byte sequence handle, importing yields an event
that is already complete, waits and synchronizations return at once, and ``query_event``
never blocks.  The wire format stays the same as for device events (opaque handle bytes).
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmcache.v1.platform.base.streams import DeviceLike, DeviceStream, IPCEvent

_HANDLE_BYTES = 8
# Upstream LMCache 0.5.6's CPU event (``StubEvent``) exports this constant: its host events
# are completed markers too, so the handle carries nothing to wait on.
UPSTREAM_STUB_EVENT_HANDLE = b"stub_ipc_handle"


class HostEvent:
    """An event on the host timeline: complete once recorded (host work is synchronous)."""

    __slots__ = ("sequence",)

    def __init__(self, sequence: int = 0) -> None:
        self.sequence = sequence

    def record(self, stream: DeviceStream | None = None) -> None:
        return None

    def wait(self, stream: DeviceStream | None = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


def _device_type(device: DeviceLike) -> str:
    if device is None:
        return "cpu"
    if isinstance(device, int):
        return "cpu"
    return str(getattr(device, "type", device)).split(":", 1)[0]


class HostEventIPCBackend:
    device_type = "cpu"

    def __init__(self) -> None:
        self._sequence = itertools.count(1)
        self._lock = threading.Lock()

    def check_event_support(self, device: DeviceLike) -> None:
        if _device_type(device) != "cpu":
            raise RuntimeError(
                f"HostEventIPCBackend orders host memory only; device {device!r} is not cpu"
            )

    def create_event(self, device: DeviceLike) -> HostEvent:
        with self._lock:
            return HostEvent(next(self._sequence))

    def export_event(self, event: IPCEvent, device: DeviceLike) -> bytes:
        sequence = getattr(event, "sequence", 0)
        return int(sequence).to_bytes(_HANDLE_BYTES, "little", signed=False)

    def import_event(self, handle: bytes, device: DeviceLike) -> HostEvent:
        if handle == UPSTREAM_STUB_EVENT_HANDLE:
            return HostEvent(0)
        if len(handle) not in (0, _HANDLE_BYTES):
            raise ValueError(
                f"host event handles are {_HANDLE_BYTES} bytes (or upstream LMCache's "
                f"{UPSTREAM_STUB_EVENT_HANDLE!r}), got {len(handle)}"
            )
        return HostEvent(int.from_bytes(handle, "little") if handle else 0)

    def record_event(self, event: IPCEvent, stream: DeviceStream | None) -> None:
        return None

    def wait_event(self, event: IPCEvent, stream: DeviceStream | None) -> None:
        return None

    def query_event(self, event: IPCEvent) -> bool:
        return True

    def synchronize_event(self, event: IPCEvent, device: DeviceLike) -> None:
        return None
