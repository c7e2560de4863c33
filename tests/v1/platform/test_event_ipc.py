"""DefaultEventIPCBackend capability checks and delegation."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from lmcache.v1.platform.base.event_ipc import DefaultEventIPCBackend, EventIPCBackend


class _FakeEvent:
    handles: dict[bytes, _FakeEvent] = {}

    def __init__(self, interprocess: bool = False) -> None:
        self.interprocess = interprocess
        self.recorded_on: Any = None
        self.waited_on: Any = None

    def ipc_handle(self) -> bytes:
        handle = id(self).to_bytes(8, "little")
        _FakeEvent.handles[handle] = self
        return handle

    @classmethod
    def from_ipc_handle(cls, device: Any, handle: bytes) -> _FakeEvent:
        return cls.handles[handle]

    def record(self, stream: Any) -> None:
        self.recorded_on = stream

    def wait(self, stream: Any) -> None:
        self.waited_on = stream

    def query(self) -> bool:
        return self.recorded_on is not None

    def synchronize(self) -> None:
        return None


def test_module_without_event_class_is_refused() -> None:
    backend = DefaultEventIPCBackend(event_module=types.SimpleNamespace(), device_type="foo")
    with pytest.raises(RuntimeError, match="has no Event class"):
        backend.check_event_support("foo:0")


def test_event_without_interprocess_is_refused() -> None:
    # torch.cpu.Event exists but takes no arguments: no interprocess events on host.
    backend = DefaultEventIPCBackend(event_module=torch.cpu, device_type="cpu")
    with pytest.raises(RuntimeError, match="interprocess=True"):
        backend.check_event_support("cpu")


def test_event_without_from_ipc_handle_is_refused() -> None:
    module = types.SimpleNamespace(Event=type("E", (), {"__init__": _FakeEvent.__init__}))
    backend = DefaultEventIPCBackend(event_module=module, device_type="foo")
    with pytest.raises(RuntimeError, match="from_ipc_handle"):
        backend.check_event_support("foo:0")


def test_export_import_round_trip_preserves_ordering_calls() -> None:
    backend = DefaultEventIPCBackend(
        event_module=types.SimpleNamespace(Event=_FakeEvent), device_type="foo"
    )
    assert isinstance(backend, EventIPCBackend)
    backend.check_event_support("foo:0")
    event = backend.create_event("foo:0")
    assert event.interprocess is True
    assert backend.query_event(event) is False
    backend.record_event(event, "producer-stream")
    imported = backend.import_event(backend.export_event(event, "foo:0"), "foo:0")
    assert imported is event
    backend.wait_event(imported, "consumer-stream")
    assert event.waited_on == "consumer-stream"
    assert backend.query_event(imported) is True


def test_no_argument_backend_uses_the_selected_device() -> None:
    # Upstream's ``DefaultEventIPCBackend()``: base/ reaches the registry only through the
    # resolver the registry installs, never by importing it.
    from lmcache.v1.platform import get_torch_device

    backend = DefaultEventIPCBackend()
    assert (backend.event_module, backend.device_type) == get_torch_device()


def test_get_event_ipc_backend_resolves_every_device_form() -> None:
    from lmcache.v1.platform.base.event_ipc import get_event_ipc_backend
    from lmcache.v1.platform.registry import current_device_spec

    spec = current_device_spec()
    expected = spec.event_ipc_backend
    if expected is None:
        pytest.skip(f"the selected backend ({spec.device_type}) has no event IPC")
    device_type = spec.device_type
    for device in (0, device_type, f"{device_type}:0", torch.device(device_type)):
        assert get_event_ipc_backend(device) is expected, device


def test_get_event_ipc_backend_refuses_unknown_and_unsupported_types(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lmcache.v1.platform.base import event_ipc

    with pytest.raises(RuntimeError, match="No DeviceSpec registered for device type 'nosuch'"):
        event_ipc.get_event_ipc_backend("nosuch:1")
    no_ipc = types.SimpleNamespace(event_ipc_backend=None)
    monkeypatch.setattr(event_ipc, "_device_spec_resolvers", [lambda device_type: no_ipc])
    with pytest.raises(RuntimeError, match="'fake' does not support event IPC"):
        event_ipc.get_event_ipc_backend(types.SimpleNamespace(type="fake"))
