"""Device-neutral stream helpers (upstream 0.5.6's ``lmcache.v1.platform.stream``).

Each helper finds the ``DeviceSpec`` registered for the device's type and calls its stream
capability, so generic code never names a device.  The spec per device type is cached; a
failed lookup is not (a backend registered later is still found).  An unknown device type
is a ``RuntimeError``: a stream operation must never silently run on another backend.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from lmcache.v1.platform.base.device_spec import DeviceSpec
from lmcache.v1.platform.registry import get_device_spec

__all__ = [
    "CompletionEvent",
    "current_stream",
    "record_completion_event",
    "stream_handle",
    "synchronize_device",
    "synchronize_stream",
]


def _device_type(device: Any) -> str:
    if isinstance(device, str):
        return device.split(":", 1)[0]
    device_type = getattr(device, "type", None)
    if not isinstance(device_type, str) or not device_type:
        raise TypeError(f"expected a device or a device-type string, got {device!r}")
    return device_type


@functools.cache
def _get_spec_for_type(device_type: str) -> DeviceSpec:
    # get_device_spec is looked up in this module's namespace at call time (tests swap it).
    spec = get_device_spec(device_type)
    if spec is None:
        # Raised, so lru_cache does not remember the miss.
        raise RuntimeError(
            f"No platform DeviceSpec registered for device type {device_type!r}; install "
            f"its plugin wheel (`lmcache devices` lists what is installed)"
        )
    return spec


def _spec(device: Any) -> DeviceSpec:
    return _get_spec_for_type(_device_type(device))


@dataclass(frozen=True)
class CompletionEvent:
    """An event recorded on a stream; ``is_complete()`` never blocks."""

    _spec: DeviceSpec
    _event: Any

    def is_complete(self) -> bool:
        return bool(self._spec.is_stream_event_complete(self._event))


def current_stream(device: Any) -> Any:
    return _spec(device).current_stream(device)


def stream_handle(device: Any, stream: Any) -> int:
    """The stream's native handle as an int (e.g. ``cudaStream_t``)."""
    return int(_spec(device).get_stream_handle(stream))


def synchronize_stream(device: Any, stream: Any) -> None:
    _spec(device).synchronize_stream(stream)


def synchronize_device(device: Any) -> None:
    _spec(device).synchronize_device(device)


def record_completion_event(device: Any, stream: Any) -> CompletionEvent:
    """Record a new event on ``stream``; poll it with ``CompletionEvent.is_complete``."""
    spec = _spec(device)
    event = spec.create_stream_event(device)
    spec.record_stream_event(event, stream)
    return CompletionEvent(spec, event)
