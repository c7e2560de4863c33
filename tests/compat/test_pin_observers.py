"""Upstream's stats monitor and pin watchdog are fed through the memory layer's pin hooks."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from lmcache.compat.upstream_056.observability import PIN_COUNTER, LMCStatsMonitor
from lmcache.compat.upstream_056.pin_monitor import WATCHDOG_FEED, PinMonitor
from lmcache.v1.memory.objects import TensorMemoryObj
from lmcache.v1.memory.pin_hooks import PIN_HOOKS


def test_both_observers_are_registered_once_imported() -> None:
    observers = PIN_HOOKS._observers
    assert PIN_COUNTER in observers and WATCHDOG_FEED in observers


def test_first_pin_and_last_unpin_move_the_pinned_count() -> None:
    stats = LMCStatsMonitor.GetOrCreate()
    before = stats.pinned_memory_objs_count
    obj = TensorMemoryObj.from_tensor(torch.zeros(2))
    obj.pin()
    obj.pin()
    assert stats.pinned_memory_objs_count == before + 1
    obj.unpin()
    assert stats.pinned_memory_objs_count == before + 1
    obj.unpin()
    assert stats.pinned_memory_objs_count == before


def test_the_watchdog_watches_from_pin_to_last_unpin() -> None:
    PinMonitor.DestroyInstance()
    watchdog = PinMonitor.GetOrCreate(
        SimpleNamespace(pin_timeout_sec=60, pin_check_interval_sec=60)
    )
    try:
        obj = TensorMemoryObj.from_tensor(torch.zeros(2))
        obj.pin()
        obj.pin()
        obj.unpin()
        assert id(obj) in watchdog._pinned_objects
        obj.unpin()
        assert id(obj) not in watchdog._pinned_objects
    finally:
        PinMonitor.DestroyInstance()
