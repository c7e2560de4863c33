"""Event IPC: ordering KV-cache memory access between a worker and the cache server.

LMCache-driven transfers let the server touch a worker's device memory directly, so both
sides must agree on *when* the memory is ready.  A backend exports an event the producer
recorded on its stream; the consumer imports it and makes its own stream wait on it --
no device-wide synchronization.  ``query_event`` must never block.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

from lmcache.v1.platform.base.streams import DeviceLike, DeviceStream, IPCEvent, StreamEvent

if TYPE_CHECKING:
    from types import ModuleType

# Exported events must outlive the consumer's import; keep a bounded ring of them.
_EXPORTED_EVENT_RING_SIZE = 2048

# ``(torch module, device type)`` of the selected backend, for upstream's no-argument
# ``DefaultEventIPCBackend()``. Set by :mod:`lmcache.v1.platform.registry` on import (the
# platform package always imports it first) so that ``base`` never imports the registry.
_active_device_resolvers: list[Callable[[], tuple[ModuleType | None, str]]] = []


def set_active_device_resolver(resolver: Callable[[], tuple[ModuleType | None, str]]) -> None:
    """Install the function that names the selected backend's torch module and device type."""
    _active_device_resolvers[:] = [resolver]


# The registry's ``get_device_spec``, for upstream's ``get_event_ipc_backend(device)``;
# installed by :mod:`lmcache.v1.platform.registry` like the resolver above.
_device_spec_resolvers: list[Callable[[str], DeviceSpecLike | None]] = []


class DeviceSpecLike(Protocol):
    """What ``get_event_ipc_backend`` reads from a ``DeviceSpec``."""

    @property
    def event_ipc_backend(self) -> EventIPCBackend | None: ...


def set_device_spec_resolver(resolver: Callable[[str], DeviceSpecLike | None]) -> None:
    """Install the function that finds the ``DeviceSpec`` serving a device type."""
    _device_spec_resolvers[:] = [resolver]


def _active_device() -> tuple[ModuleType | None, str]:
    if not _active_device_resolvers:
        raise RuntimeError(
            "DefaultEventIPCBackend() needs event_module and device_type: no device registry "
            "is loaded (import lmcache.v1.platform first)"
        )
    return _active_device_resolvers[0]()


@runtime_checkable
class EventIPCBackend(Protocol):
    """The event-IPC contract; a device opts in through ``DeviceSpec.event_ipc_backend``."""

    device_type: str

    def check_event_support(self, device: DeviceLike) -> None:
        """Raise ``RuntimeError`` when the device cannot export/import events."""

    def create_event(self, device: DeviceLike) -> IPCEvent: ...

    def export_event(self, event: IPCEvent, device: DeviceLike) -> bytes: ...

    def import_event(self, handle: bytes, device: DeviceLike) -> IPCEvent: ...

    def record_event(self, event: IPCEvent, stream: DeviceStream | None) -> None: ...

    def wait_event(self, event: IPCEvent, stream: DeviceStream | None) -> None: ...

    def query_event(self, event: IPCEvent) -> bool: ...

    def synchronize_event(self, event: IPCEvent, device: DeviceLike) -> None: ...


class _InterprocessEvent(StreamEvent, Protocol):
    """A ``torch.cuda.Event(interprocess=True)``-like event."""

    def ipc_handle(self) -> bytes: ...


def _interprocess(event: IPCEvent) -> _InterprocessEvent:
    # Only events this backend created or imported reach it (the server pairs them).
    return cast(_InterprocessEvent, event)


class DefaultEventIPCBackend:
    """Event IPC over a CUDA-style event module (``torch.cuda``-like).

    Requires ``Event(interprocess=True)`` with ``ipc_handle()``, ``Event.from_ipc_handle``,
    ``record``, ``wait``, ``query`` and ``synchronize``.
    """

    def __init__(
        self, event_module: ModuleType | None = None, device_type: str | None = None
    ) -> None:
        if event_module is None or device_type is None:
            active_module, active_type = _active_device()
            event_module = event_module if event_module is not None else active_module
            device_type = device_type if device_type is not None else active_type
        # The selected backend always has a torch module (selection checks it).
        self.event_module = cast("ModuleType", event_module)
        self.device_type = device_type
        self._exported: collections.deque[IPCEvent] = collections.deque(
            maxlen=_EXPORTED_EVENT_RING_SIZE
        )
        self._lock = threading.Lock()

    def check_event_support(self, device: DeviceLike) -> None:
        event_cls = getattr(self.event_module, "Event", None)
        if event_cls is None:
            raise RuntimeError(
                f"event IPC unsupported for device {device!r}: "
                f"{self.event_module!r} has no Event class"
            )
        try:
            event_cls(interprocess=True)
        except TypeError as exc:
            raise RuntimeError(
                f"event IPC unsupported for device {device!r}: "
                f"{self.event_module!r}.Event does not accept interprocess=True ({exc})"
            ) from exc
        except Exception as exc:
            raise RuntimeError(
                f"event IPC unsupported for device {device!r}: cannot create an "
                f"interprocess event ({type(exc).__name__}: {exc})"
            ) from exc
        if not hasattr(event_cls, "from_ipc_handle"):
            raise RuntimeError(
                f"event IPC unsupported for device {device!r}: "
                f"{self.event_module!r}.Event has no from_ipc_handle"
            )

    def create_event(self, device: DeviceLike) -> IPCEvent:
        event: _InterprocessEvent = self.event_module.Event(interprocess=True)
        return event

    def export_event(self, event: IPCEvent, device: DeviceLike) -> bytes:
        with self._lock:
            self._exported.append(event)
        return bytes(_interprocess(event).ipc_handle())

    def import_event(self, handle: bytes, device: DeviceLike) -> IPCEvent:
        event: _InterprocessEvent = self.event_module.Event.from_ipc_handle(device, handle)
        return event

    def record_event(self, event: IPCEvent, stream: DeviceStream | None) -> None:
        _interprocess(event).record(stream)

    def wait_event(self, event: IPCEvent, stream: DeviceStream | None) -> None:
        _interprocess(event).wait(stream)

    def query_event(self, event: IPCEvent) -> bool:
        return bool(_interprocess(event).query())

    def synchronize_event(self, event: IPCEvent, device: DeviceLike) -> None:
        _interprocess(event).synchronize()


def _resolve_device_type(device: object) -> str:
    """The device type of a ``torch.device``-like object, a ``"type[:index]"`` string or an
    int index (an index means the selected backend's device type)."""
    if isinstance(device, int) and not isinstance(device, bool):
        return _active_device()[1]
    device_type = getattr(device, "type", None)
    if isinstance(device_type, str):
        return device_type
    if isinstance(device, str):
        return device.split(":", maxsplit=1)[0]
    return str(device)


def get_event_ipc_backend(device: object) -> EventIPCBackend:
    """The event-IPC backend of ``device``'s type (upstream's lookup).

    Raises ``RuntimeError`` when no backend serves that type or its spec has no event IPC.
    """
    device_type = _resolve_device_type(device)
    if not _device_spec_resolvers:
        raise RuntimeError(
            "get_event_ipc_backend needs the device registry (import lmcache.v1.platform first)"
        )
    spec = _device_spec_resolvers[0](device_type)
    if spec is None:
        raise RuntimeError(f"No DeviceSpec registered for device type {device_type!r}.")
    backend = spec.event_ipc_backend
    if backend is None:
        raise RuntimeError(f"Device type {device_type!r} does not support event IPC.")
    return backend
