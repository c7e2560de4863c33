"""native_completion: stream-ordered host callbacks drained and dispatched off-thread."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from lmcache.v1.multiprocess import native_completion as nc
from lmcache.v1.platform import torch_ops


@pytest.fixture
def dispatcher() -> Iterator[nc.DeviceHostFuncDispatcher]:
    torch_ops.drain_recorded_completions()
    d = nc.DeviceHostFuncDispatcher(drain_interval_seconds=0.001)
    yield d
    d.stop()


def _wait_for(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():  # type: ignore[operator]
        time.sleep(0.005)


def test_payload_reaches_its_handler_decoded(dispatcher: nc.DeviceHostFuncDispatcher) -> None:
    got: list[list[bytes]] = []
    dispatcher.register("finish_write", got.append, payload_type=list[bytes])
    dispatcher.start()
    nc.submit_callback_to_stream(SimpleNamespace(ptr=0), "finish_write", [b"k0", b"k1"])
    _wait_for(lambda: got)
    assert got == [[b"k0", b"k1"]]
    assert dispatcher.dispatched_count == 1


def test_a_raising_handler_is_counted_and_the_thread_survives(
    dispatcher: nc.DeviceHostFuncDispatcher,
) -> None:
    got: list[int] = []

    def boom(_: int) -> None:
        raise RuntimeError("handler bug")

    dispatcher.register("bad", boom, payload_type=int)
    dispatcher.register("good", got.append, payload_type=int)
    dispatcher.start()
    nc.submit_callback_to_stream(SimpleNamespace(ptr=0), "bad", 1)
    nc.submit_callback_to_stream(SimpleNamespace(ptr=0), "good", 2)
    _wait_for(lambda: got)
    assert got == [2]
    assert dispatcher.handler_exception_counts == {"bad": 1}


def test_wrong_payload_type_is_a_handler_error_not_a_crash(
    dispatcher: nc.DeviceHostFuncDispatcher,
) -> None:
    dispatcher.register("typed", lambda _: None, payload_type=int)
    dispatcher.start()
    nc.submit_callback_to_stream(SimpleNamespace(ptr=0), "typed", "not an int")
    _wait_for(lambda: dispatcher.handler_exception_counts)
    assert dispatcher.handler_exception_counts == {"typed": 1}


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        nc.DeviceHostFuncDispatcher(drain_interval_seconds=0)
    d = nc.DeviceHostFuncDispatcher()
    d.register("k", lambda _: None, payload_type=int)
    with pytest.raises(ValueError, match="already registered"):
        d.register("k", lambda _: None, payload_type=int)
