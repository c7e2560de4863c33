"""PinMonitor: pinned objects are watched and force-unpinned after the timeout."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from lmcache.compat.upstream_056.memory_allocators.tensor_memory_allocator import (
    TensorMemoryAllocator,
)
from lmcache.compat.upstream_056.observability import LMCStatsMonitor
from lmcache.compat.upstream_056.pin_monitor import DEFAULT_PIN_TIMEOUT_SEC, PinMonitor
from lmcache.v1.memory.format import MemoryFormat
from lmcache.v1.memory.objects import TensorMemoryObj


@pytest.fixture
def monitor() -> Iterator[PinMonitor]:
    PinMonitor.DestroyInstance()
    instance = PinMonitor.GetOrCreate(SimpleNamespace(pin_timeout_sec=5, pin_check_interval_sec=60))
    yield instance
    PinMonitor.DestroyInstance()


def _obj() -> TensorMemoryObj:
    allocator = TensorMemoryAllocator(torch.empty(8192, dtype=torch.uint8))
    obj = allocator.allocate(torch.Size([16]), torch.float32, MemoryFormat.KV_2LTD)
    assert obj is not None
    return obj


def _age(monitor: PinMonitor, obj: object, seconds: float) -> None:
    with monitor._objects_lock:
        target, pinned_at = monitor._pinned_objects[id(obj)]
        monitor._pinned_objects[id(obj)] = (target, pinned_at - seconds)


def test_pins_are_watched_until_the_last_unpin(monitor: PinMonitor) -> None:
    obj = _obj()
    obj.pin()
    obj.pin()
    assert monitor.get_monitored_count() == 1
    obj.unpin()
    assert monitor.get_monitored_count() == 1
    obj.unpin()
    assert monitor.get_monitored_count() == 0
    assert not obj.unpin()  # not pinned: refused, count stays at zero
    assert obj.metadata.pin_count == 0


def test_timed_out_pins_are_released_counted_and_logged(
    monitor: PinMonitor, caplog: pytest.LogCaptureFixture
) -> None:
    stats = LMCStatsMonitor.GetOrCreate()
    before = stats.interval_forced_unpin_count
    old, fresh = _obj(), _obj()
    old.pin()
    old.pin()
    fresh.pin()
    _age(monitor, old, 10)
    with caplog.at_level(logging.WARNING, logger="lmcache.compat.upstream_056.pin_monitor"):
        assert monitor._check_timeouts() == (2, 1, 1)
    assert old.metadata.pin_count == 0 and old.can_evict
    assert fresh.metadata.pin_count == 1
    assert stats.interval_forced_unpin_count == before + 1
    assert "Pin timeout" in caplog.text
    assert monitor.get_monitored_count() == 1


def test_a_new_pin_restarts_the_timeout(monitor: PinMonitor) -> None:
    obj = _obj()
    obj.pin()
    _age(monitor, obj, 10)
    obj.pin()
    assert monitor._check_timeouts() == (1, 0, 0)
    assert obj.metadata.pin_count == 2


def test_the_background_thread_runs_the_check(monitor: PinMonitor) -> None:
    assert monitor.is_running
    obj = _obj()
    obj.pin()
    _age(monitor, obj, 10)
    monitor.wake()
    deadline = time.monotonic() + 5
    while obj.metadata.pin_count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert obj.metadata.pin_count == 0


def test_without_a_config_upstreams_defaults_apply() -> None:
    PinMonitor.DestroyInstance()
    try:
        assert PinMonitor.GetOrCreate()._pin_timeout_sec == DEFAULT_PIN_TIMEOUT_SEC
    finally:
        PinMonitor.DestroyInstance()


def test_rejects_a_non_positive_timeout() -> None:
    with pytest.raises(ValueError, match="pin_timeout_sec"):
        PinMonitor(SimpleNamespace(pin_timeout_sec=0, pin_check_interval_sec=1))


def test_a_pin_does_not_start_a_watchdog() -> None:
    """Only an explicit GetOrCreate starts the monitor: lmcache server releases its own
    pins and must not have them force-released under a live request."""
    PinMonitor.DestroyInstance()
    obj = _obj()
    obj.pin()
    assert PinMonitor.GetIfCreated() is None
    assert obj.metadata.pin_count == 1 and obj.unpin()
    assert PinMonitor.GetIfCreated() is None
