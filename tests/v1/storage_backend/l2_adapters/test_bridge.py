"""The bridge (``L2AdapterBackend``): any L2 adapter as a storage tier.  Errors, faults and
hangs in the adapter are misses within the bounded wait, and no L1 memory leaks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from conftest import OBJ_DTYPE, expected_tensor, fill_obj, make_config, make_key

from lmcache.utils import CacheEngineKey
from lmcache.v1.storage_backend.cache_salt import configs_with_salt
from lmcache.v1.storage_backend.l2_adapters.bitmap import Bitmap
from lmcache.v1.storage_backend.l2_adapters.bridge import L2AdapterBackend
from lmcache.v1.storage_backend.l2_adapters.config import L2EvictionSpec
from lmcache.v1.storage_backend.l2_adapters.fault_inject_l2_adapter import FaultInjectL2Adapter
from lmcache.v1.storage_backend.l2_adapters.keys import object_key_of
from lmcache.v1.storage_backend.l2_adapters.mock_l2_adapter import (
    MockL2Adapter,
    MockL2AdapterConfig,
)
from lmcache.v1.storage_backend.l2_adapters.types import L2StoreResult
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

FAST = 0.3  # the bridge's bounded wait in these tests, seconds


def _mock(max_size_gb: float = 0.01) -> MockL2Adapter:
    return MockL2Adapter(MockL2AdapterConfig(max_size_gb=max_size_gb, mock_bandwidth_gb=10))


class GatedMock(MockL2Adapter):
    """A mock whose lookup and load answers are held back until ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__(MockL2AdapterConfig(max_size_gb=0.01, mock_bandwidth_gb=10))
        self.gate = threading.Event()

    def query_lookup_and_lock_result(self, task_id: int) -> Bitmap | None:
        return super().query_lookup_and_lock_result(task_id) if self.gate.is_set() else None

    def query_load_result(self, task_id: int) -> Bitmap | None:
        return super().query_load_result(task_id) if self.gate.is_set() else None


class BrokenMock(MockL2Adapter):
    """Every operation but close raises."""

    def __init__(self) -> None:
        super().__init__(MockL2AdapterConfig(max_size_gb=0.01, mock_bandwidth_gb=10))

    def submit_store_task(self, keys: Any, objects: Any) -> int:
        raise OSError("store path gone")

    def submit_lookup_and_lock_task(self, keys: Any, group_layout_descs: Any) -> int:
        raise OSError("lookup path gone")

    def submit_load_task(self, keys: Any, objects: Any) -> int:
        raise OSError("load path gone")


class FailingStores(MockL2Adapter):
    """Stores report failure (nothing is kept)."""

    def __init__(self) -> None:
        super().__init__(MockL2AdapterConfig(max_size_gb=0.01, mock_bandwidth_gb=10))

    def pop_completed_store_tasks(self) -> dict[int, L2StoreResult]:
        return {task: L2StoreResult(False, 0) for task in super().pop_completed_store_tasks()}


class NoEventFds(MockL2Adapter):
    """An adapter that signals nothing: the bridge must poll."""

    def __init__(self) -> None:
        super().__init__(MockL2AdapterConfig(max_size_gb=0.01, mock_bandwidth_gb=10))

    def get_store_event_fd(self) -> int:
        return -1

    def get_lookup_and_lock_event_fd(self) -> int:
        return -1

    def get_load_event_fd(self) -> int:
        return -1


@pytest.fixture
def l1() -> Iterator[LocalCPUBackend]:
    cpu = LocalCPUBackend(make_config(local_cpu=False))
    yield cpu
    cpu.close()


@pytest.fixture
def bridge_of(l1: LocalCPUBackend) -> Iterator[Callable[..., L2AdapterBackend]]:
    made: list[L2AdapterBackend] = []

    def make(adapter: Any, **kwargs: Any) -> L2AdapterBackend:
        kwargs.setdefault("op_timeout_s", FAST)
        bridge = L2AdapterBackend(adapter, "L2Adapter0:test", l1, **kwargs)
        made.append(bridge)
        return bridge

    yield make
    for bridge in made:
        bridge.close()


def _used(l1: LocalCPUBackend) -> int:
    return int(l1.get_memory_allocator().used_bytes)


def _store(bridge: L2AdapterBackend, keys: list[CacheEngineKey], first_value: int = 0) -> None:
    objs = [fill_obj(bridge, first_value + i) for i in range(len(keys))]
    bridge.batched_submit_put_task(keys, objs)
    for obj in objs:
        obj.ref_count_down()
    assert bridge.wait_for_puts(timeout=5)


def _eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_round_trip_counts_bytes_per_tenant(bridge_of: Any, l1: LocalCPUBackend) -> None:
    adapter = _mock()
    bridge = bridge_of(adapter)
    salted = CacheEngineKey("org/model", 1, 0, 7, OBJ_DTYPE, configs_with_salt({}, "tenant-a"))
    _store(bridge, [salted, make_key(8)], first_value=3)
    assert bridge.batched_contains([salted, make_key(8)]) == 2
    got = bridge.get_blocking(salted)
    assert got is not None and torch.equal(got.tensor, expected_tensor(3))
    got.ref_count_down()
    usage = adapter.get_usage().bytes_by_cache_salt
    size = got.get_size()
    assert dict(usage) == {"tenant-a": size, "": size}


def test_adapter_side_delete_is_forgotten(bridge_of: Any) -> None:
    adapter = _mock()
    bridge = bridge_of(adapter)
    _store(bridge, [make_key(1), make_key(2)])
    adapter.delete([object_key_of(make_key(1))])
    assert len(bridge) == 1
    assert not bridge.contains(make_key(1))
    assert bridge.get_blocking(make_key(1)) is None


def test_key_the_adapter_skipped_is_a_miss(bridge_of: Any) -> None:
    adapter = _mock(max_size_gb=4096 / 1024**3)  # room for exactly one object
    bridge = bridge_of(adapter)
    _store(bridge, [make_key(1), make_key(2)])
    assert bridge.batched_contains([make_key(1), make_key(2)]) == 1
    assert len(bridge) == 1  # the lookup taught the index that key 2 is not there


def test_pin_holds_the_adapter_lock_until_unpin(bridge_of: Any) -> None:
    adapter = _mock()
    bridge = bridge_of(adapter)
    _store(bridge, [make_key(1)])
    assert bridge.pin(make_key(1))
    assert _eventually(lambda: adapter.debug_get_locked_key_count() == 1)
    assert bridge.unpin(make_key(1))
    assert not bridge.unpin(make_key(1))
    assert _eventually(lambda: adapter.debug_get_locked_key_count() == 0)
    assert bridge.contains(make_key(1))  # a plain lookup keeps no lock
    assert _eventually(lambda: adapter.debug_get_locked_key_count() == 0)


def test_injected_load_faults_are_misses_and_leak_nothing(
    bridge_of: Any, l1: LocalCPUBackend
) -> None:
    adapter = FaultInjectL2Adapter(_mock(), rate=0.0, seed=0, gap_indices=(1,))
    bridge = bridge_of(adapter)
    keys = [make_key(i) for i in range(3)]
    _store(bridge, keys)
    baseline = _used(l1)
    assert bridge.batched_contains(keys) == 3  # lookups are not faulted
    got = bridge.batched_get_blocking(keys)
    assert got[1] is None
    assert got[0] is not None and got[2] is not None
    assert torch.equal(got[2].tensor, expected_tensor(2))
    for obj in (got[0], got[2]):
        obj.ref_count_down()
    assert _used(l1) == baseline
    assert bridge.stats["misses"] == 1 and bridge.stats["hits"] == 2


def test_hung_adapter_is_a_miss_within_the_bound_and_frees_late(
    bridge_of: Any, l1: LocalCPUBackend
) -> None:
    adapter = GatedMock()
    bridge = bridge_of(adapter)
    _store(bridge, [make_key(1)])
    baseline = _used(l1)
    started = time.monotonic()
    assert bridge.get_blocking(make_key(1)) is None
    assert not bridge.contains(make_key(1))
    assert time.monotonic() - started < 4 * FAST
    # The buffer handed to the adapter is not reused while it may still write into it...
    assert _used(l1) > baseline
    adapter.gate.set()
    # ...and is freed once the late answer comes; the late lookup's lock is released.
    assert _eventually(lambda: _used(l1) == baseline)
    assert _eventually(lambda: adapter.debug_get_locked_key_count() == 0)
    assert bridge.stats["timeouts"] == 2


def test_hung_load_buffer_is_freed_at_close(l1: LocalCPUBackend) -> None:
    adapter = GatedMock()
    bridge = L2AdapterBackend(adapter, "L2Adapter0:test", l1, op_timeout_s=FAST)
    _store(bridge, [make_key(1)])
    baseline = _used(l1)
    assert bridge.get_blocking(make_key(1)) is None
    assert _used(l1) > baseline
    bridge.close()
    assert _used(l1) == baseline


def test_adapter_exceptions_are_misses(bridge_of: Any, l1: LocalCPUBackend) -> None:
    bridge = bridge_of(BrokenMock())
    baseline = _used(l1)
    obj = fill_obj(bridge, 1)
    assert bridge.batched_submit_put_task([make_key(1)], [obj]) is not None
    obj.ref_count_down()
    assert bridge.wait_for_puts(timeout=5)
    assert _used(l1) == baseline  # the failed store dropped its reference
    assert not bridge.exists_in_put_tasks(make_key(1))
    assert bridge.stats["puts_failed"] == 1
    assert bridge.get_blocking(make_key(1)) is None


def test_failed_store_is_not_indexed(bridge_of: Any, l1: LocalCPUBackend) -> None:
    bridge = bridge_of(FailingStores())
    baseline = _used(l1)
    _store(bridge, [make_key(1)])
    assert len(bridge) == 0 and bridge.stats["puts_failed"] == 1
    assert _used(l1) == baseline


def test_stuck_stores_are_bounded(l1: LocalCPUBackend) -> None:
    class StuckStores(MockL2Adapter):
        def pop_completed_store_tasks(self) -> dict[int, L2StoreResult]:
            return {}

    adapter = StuckStores(MockL2AdapterConfig(max_size_gb=0.01, mock_bandwidth_gb=10))
    bridge = L2AdapterBackend(
        adapter, "L2Adapter0:test", l1, put_queue_chunks=2, close_timeout_s=FAST
    )
    baseline = _used(l1)
    objs = [fill_obj(bridge, i) for i in range(3)]
    bridge.batched_submit_put_task([make_key(0), make_key(1)], objs[:2])
    assert bridge.batched_submit_put_task([make_key(2)], objs[2:]) == []
    assert bridge.stats["puts_refused"] == 1
    for obj in objs:
        obj.ref_count_down()
    assert not bridge.wait_for_puts(timeout=FAST)
    bridge.close()  # bounded, and the stuck stores' references are dropped
    assert _used(l1) == baseline


def test_adapter_without_event_fds_is_polled(bridge_of: Any) -> None:
    bridge = bridge_of(NoEventFds())
    _store(bridge, [make_key(1)], first_value=5)
    got = bridge.get_blocking(make_key(1))
    assert got is not None and torch.equal(got.tensor, expected_tensor(5))
    got.ref_count_down()


def test_multi_part_layout_round_trips(bridge_of: Any, l1: LocalCPUBackend) -> None:
    bridge = bridge_of(_mock())
    shapes = [torch.Size([4, 8]), torch.Size([2, 3])]
    dtypes = [torch.bfloat16, torch.float32]
    obj = l1.allocate(shapes, dtypes)
    assert obj is not None
    first, second = obj.get_tensor(0), obj.get_tensor(1)
    assert first is not None and second is not None
    first.copy_(torch.arange(32).reshape(4, 8))
    second.copy_(torch.arange(6).reshape(2, 3) / 3)
    bridge.batched_submit_put_task([make_key(9)], [obj])
    assert bridge.wait_for_puts(timeout=5)
    got = bridge.get_blocking(make_key(9))
    assert got is not None and got.get_shapes() == shapes and got.get_dtypes() == dtypes
    assert torch.equal(got.get_tensor(0), first) and torch.equal(got.get_tensor(1), second)
    for o in (obj, got):
        o.ref_count_down()


def _mock_of_objects(n: int) -> MockL2Adapter:
    """A mock with room for exactly ``n`` default-sized objects (4 KiB each)."""
    return MockL2Adapter(MockL2AdapterConfig(max_size_gb=n * 4096 / 1024**3, mock_bandwidth_gb=10))


def test_lru_eviction_keeps_the_adapter_below_capacity(bridge_of: Any) -> None:
    adapter = _mock_of_objects(10)
    spec = L2EvictionSpec("LRU", trigger_watermark=0.8, eviction_ratio=0.2)
    bridge = bridge_of(adapter, eviction=spec)
    _store(bridge, [make_key(0)])
    assert bridge.pin(make_key(0))  # pinned: never chosen
    for i in range(1, 30):
        _store(bridge, [make_key(i)])
        assert _eventually(lambda: adapter.get_usage().usage_fraction < 0.8)
    # Every store landed (none skipped for lack of room), the oldest went first.
    assert bridge.stats["puts"] == 30 and bridge.stats["evictions"] >= 20
    assert bridge.batched_contains([make_key(i) for i in (27, 28, 29)]) == 3
    assert not bridge.contains(make_key(1))
    assert bridge.contains(make_key(0))


def test_without_eviction_a_full_adapter_skips_stores(bridge_of: Any) -> None:
    adapter = _mock_of_objects(10)
    bridge = bridge_of(adapter, eviction=L2EvictionSpec("noop"))
    for i in range(15):
        _store(bridge, [make_key(i)])
    assert bridge.stats["evictions"] == 0
    assert adapter.debug_get_stored_object_count() == 10
    assert not bridge.contains(make_key(14))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (L2EvictionSpec("ARC"), "'ARC' is not available on L2 adapter tiers yet"),
        (L2EvictionSpec("LRU", trigger_watermark=0), "must be in"),
    ],
)
def test_eviction_the_bridge_cannot_honour_is_refused(
    bridge_of: Any, spec: L2EvictionSpec, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        bridge_of(_mock(), eviction=spec)


def test_a_blocking_adapter_submit_does_not_block_the_put(
    bridge_of: Any, l1: LocalCPUBackend
) -> None:
    release = threading.Event()

    class BlockingSubmit(MockL2Adapter):
        def submit_store_task(self, keys: Any, objects: Any) -> int:
            release.wait(10)
            return super().submit_store_task(keys, objects)

    adapter = BlockingSubmit(MockL2AdapterConfig(max_size_gb=0.01, mock_bandwidth_gb=10))
    bridge = bridge_of(adapter)
    obj = fill_obj(bridge, 2)
    started = time.monotonic()
    futures = bridge.batched_submit_put_task([make_key(1)], [obj])
    assert time.monotonic() - started < 1.0
    assert futures and not futures[0].done() and bridge.exists_in_put_tasks(make_key(1))
    obj.ref_count_down()
    release.set()
    assert bridge.wait_for_puts(timeout=5)
    got = bridge.get_blocking(make_key(1))
    assert got is not None and torch.equal(got.tensor, expected_tensor(2))
    got.ref_count_down()


def test_blocking_read_submits_stay_within_the_bound(bridge_of: Any) -> None:
    release = threading.Event()

    class BlockingReads(MockL2Adapter):
        def submit_lookup_and_lock_task(self, keys: Any, group_layout_descs: Any) -> int:
            release.wait(10)
            return super().submit_lookup_and_lock_task(keys, group_layout_descs)

        def submit_load_task(self, keys: Any, objects: Any) -> int:
            release.wait(10)
            return super().submit_load_task(keys, objects)

    adapter = BlockingReads(MockL2AdapterConfig(max_size_gb=0.01, mock_bandwidth_gb=10))
    bridge = bridge_of(adapter)
    _store(bridge, [make_key(1)])
    started = time.monotonic()
    assert not bridge.contains(make_key(1))
    assert bridge.get_blocking(make_key(1)) is None
    assert time.monotonic() - started < 4 * FAST
    release.set()


def test_a_store_finished_before_its_submit_returns_still_lands(bridge_of: Any) -> None:
    class AnswersBeforeReturning(MockL2Adapter):
        """Returns a store's task id only after the bridge has popped its result."""

        def __init__(self, config: MockL2AdapterConfig) -> None:
            super().__init__(config)
            self.popped = threading.Event()

        def pop_completed_store_tasks(self) -> dict[int, L2StoreResult]:
            done = super().pop_completed_store_tasks()
            if done:
                self.popped.set()
            return done

        def submit_store_task(self, keys: Any, objects: Any) -> int:
            task_id = super().submit_store_task(keys, objects)
            assert self.popped.wait(5)
            return task_id

    adapter = AnswersBeforeReturning(MockL2AdapterConfig(max_size_gb=0.01, mock_bandwidth_gb=10))
    bridge = bridge_of(adapter)
    _store(bridge, [make_key(1)], first_value=6)
    got = bridge.get_blocking(make_key(1))
    assert got is not None and torch.equal(got.tensor, expected_tensor(6))
    got.ref_count_down()


def test_a_load_never_submitted_frees_its_buffer_at_close(
    l1: LocalCPUBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lmcache.v1.storage_backend.l2_adapters.bridge as bridge_module

    monkeypatch.setattr(bridge_module, "READER_THREADS", 1)
    release = threading.Event()

    class StuckLookups(MockL2Adapter):
        def submit_lookup_and_lock_task(self, keys: Any, group_layout_descs: Any) -> int:
            release.wait(10)
            return super().submit_lookup_and_lock_task(keys, group_layout_descs)

    adapter = StuckLookups(MockL2AdapterConfig(max_size_gb=0.01, mock_bandwidth_gb=10))
    bridge = L2AdapterBackend(adapter, "L2Adapter0:test", l1, op_timeout_s=FAST)
    try:
        _store(bridge, [make_key(1)])
        baseline = _used(l1)
        assert not bridge.contains(make_key(1))  # holds the only reader thread
        assert bridge.get_blocking(make_key(1)) is None  # queued behind it, timed out
        assert _used(l1) > baseline
        bridge.close()
        assert _used(l1) == baseline
    finally:
        release.set()
        bridge.close()


def test_an_event_fd_closed_under_the_bridge_falls_back_to_polling(bridge_of: Any) -> None:
    adapter = _mock()
    bridge = bridge_of(adapter)
    _store(bridge, [make_key(1)], first_value=8)
    adapter._load_efd.close()  # the adapter breaks its own load descriptor
    time.sleep(0.2)
    got = bridge.get_blocking(make_key(1))  # answered by polling, within the bound
    assert got is not None and torch.equal(got.tensor, expected_tensor(8))
    got.ref_count_down()
    assert bridge._thread.is_alive()
