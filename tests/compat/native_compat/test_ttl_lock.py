"""TTLLock against a model of holders and a deadline, on a fake monotonic clock; its
argument conversion; and that concurrent callers lose no update."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from lmcache.compat.upstream_056.native_compat import ttl_lock as ttl_lock_module
from lmcache.compat.upstream_056.native_compat.ttl_lock import TTLLock


class FakeClock:
    """Stands in for the ``time`` module inside ttl_lock: only ``monotonic`` is read."""

    def __init__(self) -> None:
        # Not 0: the lock must not treat "never locked" as a deadline at the clock's origin.
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    fake = FakeClock()
    monkeypatch.setattr(ttl_lock_module, "time", fake)
    yield fake


def test_counts_holders_until_the_last_unlock(clock: FakeClock) -> None:
    lock = TTLLock()
    assert not lock.is_locked()
    for _ in range(3):
        lock.lock()
    for _ in range(2):
        lock.unlock()
        assert lock.is_locked()
    lock.unlock()
    assert not lock.is_locked()
    # Below zero is clamped: one lock after extra unlocks is held again.
    lock.unlock()
    lock.unlock()
    lock.lock()
    assert lock.is_locked()


def test_lapses_at_the_deadline_and_each_lock_moves_it(clock: FakeClock) -> None:
    lock = TTLLock(ttl_second=10)
    # Binary fractions of a second keep the fake clock's sums exact.
    lock.lock()
    clock.advance(9.75)
    assert lock.is_locked()
    lock.lock()  # the deadline is now 10 s from here
    clock.advance(9.75)
    assert lock.is_locked()
    clock.advance(0.25)
    assert not lock.is_locked()  # the deadline itself is already expired


def test_a_lock_after_a_lapse_forgets_the_old_holders(clock: FakeClock) -> None:
    lock = TTLLock(ttl_second=1)
    for _ in range(5):
        lock.lock()
    clock.advance(1)
    assert not lock.is_locked()
    lock.lock()
    assert lock.is_locked()
    lock.unlock()
    assert not lock.is_locked()


def test_unlock_after_a_lapse_still_counts_down(clock: FakeClock) -> None:
    # unlock() neither checks nor moves the deadline (as upstream's): three holders, a
    # lapse, two unlocks, then a lock inside a new window restarts at one holder.
    lock = TTLLock(ttl_second=5)
    for _ in range(3):
        lock.lock()
    clock.advance(6)
    lock.unlock()
    lock.unlock()
    assert not lock.is_locked()
    lock.lock()
    lock.unlock()
    assert not lock.is_locked()


def test_reset_forgets_holders_and_deadline(clock: FakeClock) -> None:
    lock = TTLLock()
    lock.lock()
    lock.lock()
    lock.reset()
    assert not lock.is_locked()
    lock.lock()
    lock.unlock()
    assert not lock.is_locked()


def test_zero_ttl_never_reads_locked(clock: FakeClock) -> None:
    lock = TTLLock(0)
    lock.lock()
    lock.lock()
    assert not lock.is_locked()


def test_locks_are_independent(clock: FakeClock) -> None:
    first, second = TTLLock(), TTLLock(ttl_second=1)
    first.lock()
    assert first.is_locked() and not second.is_locked()
    second.lock()
    clock.advance(2)
    assert first.is_locked() and not second.is_locked()


class TTLLockMachine(RuleBasedStateMachine):
    """Any interleaving of lock / unlock / reset / time passing agrees with the model:
    holders counted since the last lapse, locked while some remain and the last lock()
    was under ``ttl`` seconds ago."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.original_time = ttl_lock_module.time
        ttl_lock_module.time = self.clock  # type: ignore[assignment]

    def teardown(self) -> None:
        ttl_lock_module.time = self.original_time

    @initialize(ttl=st.integers(min_value=0, max_value=4))
    def make(self, ttl: int) -> None:
        self.ttl = ttl
        self.lock = TTLLock(ttl)
        self.holders = 0
        self.last_lock: float | None = None

    def _lapsed(self) -> bool:
        return self.last_lock is None or self.clock.now - self.last_lock >= self.ttl

    @rule()
    def lock_once(self) -> None:
        self.holders = 1 if self._lapsed() else self.holders + 1
        self.last_lock = self.clock.now
        self.lock.lock()

    @rule()
    def unlock_once(self) -> None:
        self.holders = max(0, self.holders - 1)
        self.lock.unlock()

    @rule()
    def reset(self) -> None:
        self.holders, self.last_lock = 0, None
        self.lock.reset()

    @rule(seconds=st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 3.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def agrees_with_model(self) -> None:
        if hasattr(self, "lock"):
            assert self.lock.is_locked() == (self.holders > 0 and not self._lapsed())


TestTTLLockMachine = TTLLockMachine.TestCase
TestTTLLockMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


@pytest.mark.parametrize("bad", [-1, 1.5, "3", None, 1 << 32])
def test_a_ttl_that_is_no_uint32_is_a_type_error(bad: object) -> None:
    # pybind11 refuses to convert these to uint32_t: TypeError, as upstream.
    with pytest.raises(TypeError):
        TTLLock(bad)  # type: ignore[arg-type]


def test_ttl_takes_upstreams_keyword_and_range() -> None:
    TTLLock(ttl_second=(1 << 32) - 1).lock()
    TTLLock(ttl_second=True)  # an int subclass converts, as in pybind11


def test_concurrent_calls_lose_no_update() -> None:
    # Real clock: the default 300 s TTL cannot lapse during the test.
    lock = TTLLock()
    threads_n, per_thread = 8, 2000
    start = threading.Barrier(threads_n)

    def hammer() -> None:
        start.wait()
        for _ in range(per_thread):
            lock.lock()
            lock.lock()
            lock.unlock()

    threads = [threading.Thread(target=hammer) for _ in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    held = 0
    while lock.is_locked():
        lock.unlock()
        held += 1
    assert held == threads_n * per_thread


def test_native_module_reexports_it() -> None:
    from lmcache import lmcache_native
    from lmcache.v1 import native_compat

    assert lmcache_native.TTLLock is native_compat.TTLLock is TTLLock
