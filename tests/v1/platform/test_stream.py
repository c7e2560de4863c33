"""lmcache.v1.platform.stream: device-neutral stream helpers dispatched by device type."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lmcache.v1.platform import stream


@pytest.fixture(autouse=True)
def _fresh_spec_cache() -> Iterator[None]:
    stream._get_spec_for_type.cache_clear()
    yield
    stream._get_spec_for_type.cache_clear()


class _RecordingSpec:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.complete = False

    def current_stream(self, device: Any) -> str:
        self.calls.append(("current_stream", device))
        return "s"

    def get_stream_handle(self, value: Any) -> int:
        self.calls.append(("get_stream_handle", value))
        return 7

    def synchronize_stream(self, value: Any) -> None:
        self.calls.append(("synchronize_stream", value))

    def synchronize_device(self, device: Any) -> None:
        self.calls.append(("synchronize_device", device))

    def create_stream_event(self, device: Any) -> str:
        self.calls.append(("create_stream_event", device))
        return "e"

    def record_stream_event(self, event: Any, value: Any) -> None:
        self.calls.append(("record_stream_event", event, value))

    def is_stream_event_complete(self, event: Any) -> bool:
        return self.complete


def test_every_helper_goes_through_the_device_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _RecordingSpec()
    looked_up: list[str] = []
    monkeypatch.setattr(stream, "get_device_spec", lambda t: looked_up.append(t) or spec)
    device = SimpleNamespace(type="fake")

    assert stream.current_stream(device) == "s"
    assert stream.stream_handle(device, "s") == 7
    stream.synchronize_stream(device, "s")
    stream.synchronize_device(device)
    event = stream.record_completion_event(device, "s")
    assert event.is_complete() is False
    spec.complete = True
    assert event.is_complete() is True
    assert looked_up == ["fake"]  # cached per device type
    assert spec.calls == [
        ("current_stream", device),
        ("get_stream_handle", "s"),
        ("synchronize_stream", "s"),
        ("synchronize_device", device),
        ("create_stream_event", device),
        ("record_stream_event", "e", "s"),
    ]


def test_a_failed_lookup_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[Any] = [None, _RecordingSpec()]
    monkeypatch.setattr(stream, "get_device_spec", lambda _t: answers.pop(0))
    with pytest.raises(RuntimeError, match=r"No platform DeviceSpec .*'later'"):
        stream.current_stream("later:0")
    assert stream.current_stream("later:0") == "s"


def test_unknown_device_type_is_refused() -> None:
    with pytest.raises(RuntimeError, match="'nosuchdevice'"):
        stream.synchronize_device(SimpleNamespace(type="nosuchdevice"))


def test_not_a_device_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="device"):
        stream.current_stream(42)


def test_cpu_round_trip() -> None:
    device = torch.device("cpu")
    current = stream.current_stream(device)
    stream.synchronize_stream(device, current)
    stream.synchronize_device(device)
    assert stream.record_completion_event(device, current).is_complete() is True
