"""Pin observers hear every pin and unpin, with the count after it, under the object's lock."""

from __future__ import annotations

import threading

import torch

from lmcache.v1.memory.objects import TensorMemoryObj
from lmcache.v1.memory.pin_hooks import PIN_HOOKS, PinHooks


class _Recorder:
    def __init__(self, obj: TensorMemoryObj | None = None) -> None:
        self.events: list[tuple[str, int]] = []
        self.obj = obj
        self.lock_held: list[bool] = []

    def on_pin(self, obj: object, pin_count: int) -> None:
        self.events.append(("pin", pin_count))
        self._note_lock(obj)

    def on_unpin(self, obj: object, pin_count: int) -> None:
        self.events.append(("unpin", pin_count))
        self._note_lock(obj)

    def _note_lock(self, obj: object) -> None:
        lock = getattr(obj, "_lock", None)
        if isinstance(lock, type(threading.Lock())):
            self.lock_held.append(lock.locked())


def test_observers_see_each_pin_and_unpin_with_the_new_count() -> None:
    obj = TensorMemoryObj.from_tensor(torch.zeros(4))
    recorder = _Recorder()
    PIN_HOOKS.register(recorder)
    try:
        obj.pin()
        obj.pin()
        obj.unpin()
        obj.unpin()
        assert not obj.unpin()  # an unpin of an unpinned object is refused, not reported
    finally:
        PIN_HOOKS.unregister(recorder)
    assert recorder.events == [("pin", 1), ("pin", 2), ("unpin", 1), ("unpin", 0)]
    assert recorder.lock_held == [True] * 4


def test_unregistered_observers_hear_nothing_and_registration_is_idempotent() -> None:
    hooks = PinHooks()
    recorder = _Recorder()
    hooks.register(recorder)
    hooks.register(recorder)
    hooks.pinned(object(), 1)
    assert recorder.events == [("pin", 1)]
    hooks.unregister(recorder)
    hooks.pinned(object(), 1)
    assert recorder.events == [("pin", 1)]


def test_the_memory_layer_imports_no_observer() -> None:
    import lmcache.v1.memory.objects as objects

    with open(objects.__file__) as f:
        source = f.read()
    assert "pin_monitor" not in source and "observability" not in source
