"""The static shapes of devices, streams and events that the platform interfaces pass around.

Each backend has its own stream and event classes (``torch.cuda.Stream``, a host marker, a
vendor's semaphore); these protocols name only what core calls on them.  An event crossing
processes through an ``EventIPCBackend`` is opaque (:data:`IPCEvent`): only the backend that
made it looks inside, so its methods take ``object`` and check what they were given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeAlias

if TYPE_CHECKING:
    import torch

__all__ = ["DeviceLike", "DeviceStream", "IPCEvent", "StreamEvent", "TorchDeviceModule"]

# What torch accepts as a device: a ``torch.device``, ``"cuda:0"``, an index, or the current.
DeviceLike: TypeAlias = "torch.device | str | int | None"

# An event handed out by an ``EventIPCBackend``; opaque to everyone but that backend.
IPCEvent: TypeAlias = object


class DeviceStream(Protocol):
    """A device work queue (``torch.cuda.Stream``-like)."""

    def synchronize(self) -> None: ...


class StreamEvent(Protocol):
    """A stream-ordered event (``torch.cuda.Event``-like)."""

    def record(self, stream: DeviceStream | None = None) -> None: ...

    def wait(self, stream: DeviceStream | None = None) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class TorchDeviceModule(Protocol):
    """A backend's ``torch.<device>`` module, as far as the platform uses it."""

    def current_stream(self, device: DeviceLike = None) -> DeviceStream: ...

    def synchronize(self, device: DeviceLike = None) -> None: ...

    def Event(self) -> StreamEvent: ...
