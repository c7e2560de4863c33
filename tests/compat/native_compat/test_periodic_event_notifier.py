"""The per-process periodic notifier: wakeups on registered eventfds and pipes, dormancy,
the singleton's lifecycle, and that shutdown joins its thread."""

from __future__ import annotations

import os
import select
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from lmcache.compat.upstream_056.native_compat.periodic_event_notifier import PeriodicEventNotifier
from lmcache.v1.platform import HAS_EVENTFD

THREAD_NAME = "lmcache-periodic-event-notifier"


def _notifier_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


@pytest.fixture(autouse=True)
def _fresh_notifier() -> Iterator[None]:
    PeriodicEventNotifier.shutdown()
    yield
    PeriodicEventNotifier.shutdown()
    assert not _notifier_threads()


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    yield read_fd, write_fd
    os.close(read_fd)
    os.close(write_fd)


def _readable(fd: int, timeout_s: float) -> bool:
    return bool(select.select([fd], [], [], timeout_s)[0])


def _drain(fd: int) -> bytes:
    data = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return data
        if not chunk:
            return data
        data += chunk


def _notifier() -> PeriodicEventNotifier:
    notifier = PeriodicEventNotifier.get()
    assert notifier is not None
    return notifier


def test_lifecycle_is_a_per_process_singleton() -> None:
    assert PeriodicEventNotifier.get() is None
    PeriodicEventNotifier.create(interval_ms=50, use_eventfd=False)
    first = _notifier()
    PeriodicEventNotifier.create(interval_ms=5, use_eventfd=True)  # a no-op
    assert PeriodicEventNotifier.get() is first
    (thread,) = _notifier_threads()
    assert thread.daemon
    PeriodicEventNotifier.shutdown()
    assert PeriodicEventNotifier.get() is None
    assert not thread.is_alive()  # joined, not just told to stop
    PeriodicEventNotifier.shutdown()  # idempotent


def test_pipe_gets_one_byte_per_tick_and_unregister_stops_them(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    PeriodicEventNotifier.create(interval_ms=10, use_eventfd=False)
    notifier = _notifier()
    notifier.register_fd(write_fd)
    time.sleep(0.3)
    notifier.unregister_fd(write_fd)
    time.sleep(0.05)  # a tick already under way when unregistering may still land
    ticks = _drain(read_fd)
    assert set(ticks) == {1}
    # ~30 ticks at 10 ms; a loaded 2-core machine may deliver far fewer, never almost none.
    assert 2 <= len(ticks) <= 40
    assert not _readable(read_fd, 0.2)


@pytest.mark.skipif(not HAS_EVENTFD, reason="os.eventfd is Linux-only")
def test_eventfd_counter_counts_ticks() -> None:
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    try:
        PeriodicEventNotifier.create(interval_ms=10, use_eventfd=True)
        notifier = _notifier()
        notifier.register_fd(fd)
        assert _readable(fd, 2.0)
        time.sleep(0.2)
        notifier.unregister_fd(fd)
        time.sleep(0.05)
        # Each tick is one 8-byte increment, so the counter is the number of ticks.
        assert 2 <= os.eventfd_read(fd) <= 30
        assert not _readable(fd, 0.2)
    finally:
        os.close(fd)


def test_first_registration_wakes_a_dormant_notifier_at_once(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    PeriodicEventNotifier.create(interval_ms=60_000, use_eventfd=False)
    time.sleep(0.05)  # the thread is now waiting for a first fd
    _notifier().register_fd(write_fd)
    assert _readable(read_fd, 2.0)  # not after the 60 s interval
    assert _drain(read_fd) == b"\x01"


def test_set_interval_changes_the_rate(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    PeriodicEventNotifier.create(interval_ms=400, use_eventfd=False)
    notifier = _notifier()
    notifier.set_interval_ms(0)  # clamped to 1 ms, as upstream
    notifier.register_fd(write_fd)
    time.sleep(0.3)
    fast = len(_drain(read_fd))
    notifier.set_interval_ms(1000)
    time.sleep(0.05)  # let the current 1 ms wait end
    _drain(read_fd)
    time.sleep(0.3)
    slow = len(_drain(read_fd))
    assert fast > 5
    assert slow <= 1


def test_several_fds_and_a_closed_one(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    other_read, other_write = os.pipe()
    os.set_blocking(other_read, False)
    PeriodicEventNotifier.create(interval_ms=5, use_eventfd=False)
    notifier = _notifier()
    notifier.register_fd(other_write)
    notifier.register_fd(write_fd)
    notifier.register_fd(write_fd)  # one registration
    assert _readable(other_read, 2.0)
    os.close(other_read)
    os.close(other_write)  # still registered: its writes fail, the thread carries on
    time.sleep(0.05)
    _drain(read_fd)
    assert _readable(read_fd, 2.0)
    (thread,) = _notifier_threads()
    assert thread.is_alive()
    notifier.unregister_fd(other_write)
    notifier.unregister_fd(12345)  # never registered: ignored


def test_a_full_pipe_does_not_block_the_thread(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    other_read, other_write = os.pipe()
    os.set_blocking(other_write, False)
    try:
        while True:  # fill the pipe
            try:
                os.write(other_write, b"x" * 65536)
            except BlockingIOError:
                break
        PeriodicEventNotifier.create(interval_ms=5, use_eventfd=False)
        notifier = _notifier()
        notifier.register_fd(other_write)
        notifier.register_fd(write_fd)
        assert _readable(read_fd, 2.0)
        _drain(read_fd)
        assert _readable(read_fd, 2.0)  # ticks keep coming past the full pipe
    finally:
        _notifier().unregister_fd(other_write)
        os.close(other_read)
        os.close(other_write)


def test_shutdown_opens_and_leaves_no_fds(pipe: tuple[int, int]) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("counts fds through /proc/self/fd")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        PeriodicEventNotifier.create(interval_ms=1, use_eventfd=False)
        _notifier().register_fd(pipe[1])
        time.sleep(0.01)
        PeriodicEventNotifier.shutdown()
    _drain(pipe[0])
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("bad", [1.5, "10", None])
def test_non_integer_arguments_are_type_errors(bad: object) -> None:
    with pytest.raises(TypeError):
        PeriodicEventNotifier.create(interval_ms=bad, use_eventfd=False)  # type: ignore[arg-type]
    assert PeriodicEventNotifier.get() is None
    PeriodicEventNotifier.create(interval_ms=10, use_eventfd=False)
    with pytest.raises(TypeError):
        _notifier().register_fd(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _notifier().set_interval_ms(bad)  # type: ignore[arg-type]


def test_native_module_reexports_it() -> None:
    from lmcache import lmcache_native

    assert lmcache_native.PeriodicEventNotifier is PeriodicEventNotifier
