"""``lmcache bench ops``' memcpy bound is the best contiguous copy the host does, even at
small sizes and on a loaded host (the issue: a 4 MiB bound of 0.55 GB/s next to an op at
11.6 GB/s).  A fake copy advances a fake clock, so these tests model the host's costs
instead of timing anything."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from lmcache.bench import ops as bench_ops

MIB = 2**20


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


class FakeHost:
    """A copy whose cost in seconds comes from ``cost(threads, call_index)``."""

    def __init__(self, cost: Callable[[int, int], float]) -> None:
        self.cost, self.now, self.calls = cost, 0.0, 0

    def clock(self) -> float:
        return self.now

    def copy(self) -> None:
        self.now += self.cost(torch.get_num_threads(), self.calls)
        self.calls += 1


def _bound(host: FakeHost, nbytes: int, samples: int = 3) -> float:
    return bench_ops.memcpy_bound_gbps(nbytes, samples, copy=host.copy, clock=host.clock)


def test_a_stalled_thread_pool_does_not_lower_the_bound(two_threads: None) -> None:
    # A parallel copy waits for a descheduled pool thread; one thread copies at full speed.
    host = FakeHost(lambda threads, _i: 0.010 if threads > 1 else 0.001)
    assert _bound(host, 4 * MIB) == pytest.approx(4 * MIB / 0.001 / 1e9)


def test_the_best_sample_counts_not_the_median(two_threads: None) -> None:
    # Most samples are hit by a stall; the bound is what the host does without one.
    host = FakeHost(lambda _threads, i: 0.001 if 8 <= i < 20 else 0.050)
    assert _bound(host, 4 * MIB) == pytest.approx(4 * MIB / 0.001 / 1e9)


def test_small_copies_are_timed_in_batches(two_threads: None) -> None:
    # 64 KiB at 10 us a copy: each sample spans BOUND_SAMPLE_SECONDS of copies, so one
    # scheduler tick or timer read cannot be most of it; bounded by BOUND_MAX_COPIES.
    host = FakeHost(lambda _threads, _i: 1e-5)
    assert _bound(host, 64 * 1024) == pytest.approx(64 * 1024 / 1e-5 / 1e9)
    samples = 2 * (1 + bench_ops.BOUND_MIN_SAMPLES)  # both thread counts, one warm-up each
    per_sample = round(bench_ops.BOUND_SAMPLE_SECONDS / 1e-5)
    assert samples * per_sample <= host.calls <= samples * (per_sample + 1)
    tiny = FakeHost(lambda _threads, _i: 1e-9)
    _bound(tiny, 16)
    assert tiny.calls == samples * bench_ops.BOUND_MAX_COPIES


def test_the_thread_count_is_restored(two_threads: None) -> None:
    _bound(FakeHost(lambda _threads, _i: 1e-3), MIB)
    assert torch.get_num_threads() == 2
