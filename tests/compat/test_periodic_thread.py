"""Our ``lmcache.v1.periodic_thread`` (upstream 0.5.6's API): edge cases upstream's own
tests (tests/v1/test_periodic_thread.py there) do not cover."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from lmcache.compat.upstream_056.exceptions import IrrecoverableException
from lmcache.compat.upstream_056.periodic_thread import (
    PeriodicThread,
    PeriodicThreadRegistry,
    ThreadLevel,
    ThreadRunSummary,
    create_periodic_thread,
)


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    PeriodicThreadRegistry.reset()
    yield
    PeriodicThreadRegistry.reset()


def _wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


class _Raising(PeriodicThread):
    def __init__(self) -> None:
        super().__init__("raising", interval=0.01, level=ThreadLevel.LOW)
        self.calls = 0

    def _execute(self) -> ThreadRunSummary:
        self.calls += 1
        if self.calls % 2:
            raise RuntimeError(f"boom {self.calls}")
        return ThreadRunSummary(message="fine")


@pytest.mark.parametrize(("interval", "init_wait"), [(0.0, 0.0), (-1.0, 0.0), (1.0, -0.5)])
def test_rejects_intervals_that_would_spin(interval: float, init_wait: float) -> None:
    with pytest.raises(ValueError):
        create_periodic_thread("bad", interval, ThreadRunSummary, init_wait=init_wait)
    assert PeriodicThreadRegistry.get_instance().get_all() == []


def test_a_failing_cycle_is_counted_and_the_loop_goes_on() -> None:
    thread = _Raising()
    thread.start()
    try:
        assert _wait_for(lambda: thread.total_runs >= 4)
    finally:
        thread.stop()
    assert not thread.is_running
    assert thread.failed_runs >= 2
    assert thread.total_runs - thread.failed_runs >= 2
    status = thread.get_status()
    assert status["name"] == "raising" and status["level"] == "low"
    assert status["failed_runs"] == thread.failed_runs
    assert 0.0 < status["success_rate"] < 100.0
    assert status["last_summary"]["duration_ms"] >= 0.0


def test_irrecoverable_error_ends_the_loop_with_a_failed_summary() -> None:
    def execute() -> ThreadRunSummary:
        raise IrrecoverableException("disk gone")

    thread = create_periodic_thread("fatal", 0.01, execute, auto_register=False)
    worker = thread.start()
    assert worker is not None
    worker.join(5.0)
    assert not worker.is_alive() and not thread.is_running
    assert thread.total_runs == 1 and thread.failed_runs == 1
    summary = thread.last_summary
    assert summary is not None and not summary.success and summary.message == "disk gone"


def test_start_twice_returns_none_and_stop_is_idempotent() -> None:
    thread = create_periodic_thread("twice", 60.0, ThreadRunSummary)
    assert thread.start() is not None
    try:
        assert thread.start() is None
        assert thread.is_running and thread.is_active
    finally:
        thread.stop()
        thread.stop()
    assert thread.stop_requested and not thread.is_running and not thread.is_active


def test_stop_during_init_wait_skips_every_cycle() -> None:
    ran = threading.Event()

    def execute() -> ThreadRunSummary:
        ran.set()
        return ThreadRunSummary()

    thread = create_periodic_thread("late", 60.0, execute, init_wait=60.0)
    thread.start()
    began = time.monotonic()
    thread.stop(timeout=2.0)
    assert time.monotonic() - began < 2.0
    assert not ran.is_set() and thread.total_runs == 0 and thread.last_run_time == 0.0


def test_registry_counts_and_summary_by_level() -> None:
    registry = PeriodicThreadRegistry.get_instance()
    assert PeriodicThreadRegistry.get_instance() is registry
    high = create_periodic_thread("high", 60.0, ThreadRunSummary, level=ThreadLevel.HIGH)
    create_periodic_thread("low", 60.0, ThreadRunSummary, level=ThreadLevel.LOW)
    high.start()
    try:
        assert _wait_for(lambda: high.total_runs == 1)
        assert registry.get_running_count() == 1
        assert registry.get_count_by_level(ThreadLevel.HIGH) == {
            "total": 1,
            "running": 1,
            "active": 1,
        }
        summary = registry.get_summary()
        assert summary["total_count"] == 2 and summary["running_count"] == 1
        assert summary["by_level"]["low"] == {"total": 1, "running": 0, "active": 0}
        assert {t["name"] for t in summary["threads"]} == {"high", "low"}
    finally:
        high.stop()
    assert registry.unregister("high") is high
    assert registry.unregister("high") is None
    assert [t.name for t in registry.get_by_level(ThreadLevel.LOW)] == ["low"]


def test_registering_a_name_again_replaces_the_entry() -> None:
    first = create_periodic_thread("same", 60.0, ThreadRunSummary)
    second = create_periodic_thread("same", 60.0, ThreadRunSummary)
    assert PeriodicThreadRegistry.get_instance().get_all() == [second]
    assert first is not second


def test_reset_gives_a_new_registry_and_leaves_threads_running() -> None:
    thread = create_periodic_thread("survivor", 60.0, ThreadRunSummary)
    old = PeriodicThreadRegistry.get_instance()
    thread.start()
    try:
        PeriodicThreadRegistry.reset()
        assert old.get_all() == []
        assert PeriodicThreadRegistry.get_instance() is not old
        assert thread.is_running
    finally:
        thread.stop()


def test_an_own_registry_is_independent_of_the_process_one() -> None:
    own = PeriodicThreadRegistry()
    thread = create_periodic_thread("mine", 60.0, ThreadRunSummary, auto_register=False)
    own.register(thread)
    assert own.get("mine") is thread
    assert PeriodicThreadRegistry.get_instance().get("mine") is None
