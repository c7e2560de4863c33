"""Upstream's storage-manager settings take effect in L1 and the storage manager
(:class:`~lmcache.v1.storage_backend.l1_settings.L1Settings`, ``--l2-store-policy``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import OBJ_DTYPE, OBJ_SHAPE, expected_tensor, fill_obj, make_config, make_key, put

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory import allocator as allocator_module
from lmcache.v1.memory.allocator import HostMemoryAllocator
from lmcache.v1.platform.cpu.shm import SHM_DIR
from lmcache.v1.storage_backend.cache_salt import configs_with_salt
from lmcache.v1.storage_backend.l1_settings import L1Settings
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.storage_manager import StorageManager, create_storage_backends
from lmcache.v1.storage_backend.tier_settings import TierSettings

OBJ_BYTES = 4096  # OBJ_SHAPE of half
# Fast enough for tests, and no wake-up storm on a loaded machine.
QUICK = {"notifier_interval_ms": 5, "use_lazy": False}


def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.005)


@pytest.fixture
def make_l1() -> Iterator[Callable[..., LocalCPUBackend]]:
    made: list[LocalCPUBackend] = []

    def make(size: str = "64KiB", policy: str = "LRU", **settings: Any) -> LocalCPUBackend:
        values = {**QUICK, **settings}
        config = make_config(max_local_cpu_size=size, cache_policy=policy)
        l1 = LocalCPUBackend(config, l1_settings=L1Settings(**values))
        made.append(l1)
        return l1

    yield make
    for l1 in made:
        l1.close()


def _store(l1: LocalCPUBackend, i: int) -> None:
    obj = fill_obj(l1, i)
    l1.batched_submit_put_task([make_key(i)], [obj])
    obj.ref_count_down()


# -- watermark and ratio --------------------------------------------------------------------


def test_crossing_the_watermark_evicts_the_ratio_of_used_bytes_in_policy_order(
    make_l1: Any,
) -> None:
    l1 = make_l1(eviction_trigger_watermark=0.5, eviction_ratio=0.5)  # 16 objects fit
    for i in range(7):  # 7/16 used: below the watermark, nothing goes
        _store(l1, i)
    time.sleep(0.1)
    assert len(l1) == 7 and l1.watermark_evictions == 0
    _store(l1, 7)  # 8/16 = the watermark: the notifier evicts half of the used bytes
    _until(lambda: l1.watermark_evictions > 0)
    assert l1.used_bytes <= 4 * OBJ_BYTES  # (1 - ratio) x the 8 objects used at the trigger
    assert l1.used_bytes < 0.5 * l1.capacity_bytes
    assert [k.chunk_hash for k in l1.get_keys()] == [4, 5, 6, 7]  # LRU: oldest went first
    assert l1.evictions == l1.watermark_evictions == 4


def test_a_lower_watermark_evicts_earlier(make_l1: Any) -> None:
    high = make_l1(eviction_trigger_watermark=1.0, eviction_ratio=0.25)
    low = make_l1(eviction_trigger_watermark=0.25, eviction_ratio=0.25)
    for i in range(6):
        _store(high, i)
        _store(low, i)
    _until(lambda: low.watermark_evictions > 0)
    time.sleep(0.05)
    assert high.watermark_evictions == 0 and len(high) == 6
    assert low.used_bytes < 0.25 * low.capacity_bytes + OBJ_BYTES


def test_on_demand_eviction_stays_the_last_resort(make_l1: Any) -> None:
    """A put that needs room now never fails while something is evictable, whatever the
    notifier is doing (here: too slow to matter)."""
    l1 = make_l1(eviction_trigger_watermark=1.0, notifier_interval_ms=60_000)
    for i in range(40):  # 40 x 4 KiB into 64 KiB
        _store(l1, i)
    assert l1.contains(make_key(39))
    # Every put found room (fill_obj asserts it) by evicting on demand.  A put that fills L1
    # also wakes the notifier (watermark 1.0), which may take its ratio (0.2) at once.
    assert l1.evictions >= 40 - 16
    assert 16 - int(16 * 0.2) - 1 <= len(l1) <= 16


def test_without_settings_l1_only_evicts_on_demand() -> None:
    l1 = LocalCPUBackend(make_config(max_local_cpu_size="64KiB"))
    try:
        for i in range(15):  # 15/16 used: no watermark here
            _store(l1, i)
        time.sleep(0.05)
        assert len(l1) == 15 and l1.evictions == 0
    finally:
        l1.close()


# -- read TTL and the notifier interval ----------------------------------------------------


def _full_with_key0_pinned(l1: LocalCPUBackend) -> None:
    """16 objects fill the 64 KiB L1 with key 0 (the oldest) pinned; at the watermark (1.0)
    the notifier evicted one object (ratio 0.01), which cannot be the pinned key 0."""
    for i in range(15):
        _store(l1, i)
    assert l1.contains(make_key(0), pin=True)  # a lookup pins the oldest key
    _store(l1, 15)
    _until(lambda: l1.watermark_evictions == 1)
    assert l1.contains(make_key(0)) and not l1.contains(make_key(1))


TTL_L1 = {"read_ttl_seconds": 0.3, "eviction_trigger_watermark": 1.0, "eviction_ratio": 0.01}


def test_a_pin_older_than_the_read_ttl_no_longer_protects_its_object(make_l1: Any) -> None:
    l1 = make_l1(**TTL_L1)
    _full_with_key0_pinned(l1)
    time.sleep(0.35)  # the pin expires (upstream's TTL read lock)
    _store(l1, 16)
    _until(lambda: l1.watermark_evictions == 2)
    assert not l1.contains(make_key(0))  # the oldest key went, pinned or not
    assert l1.contains(make_key(2))


def test_a_fresh_pin_renews_the_read_ttl(make_l1: Any) -> None:
    l1 = make_l1(**TTL_L1)
    _full_with_key0_pinned(l1)
    time.sleep(0.2)
    assert l1.pin(make_key(0))  # a second reader: the lock's clock restarts
    time.sleep(0.2)
    _store(l1, 16)
    _until(lambda: l1.watermark_evictions == 2)
    assert l1.contains(make_key(0)) and not l1.contains(make_key(2))


def test_a_pin_after_expiry_starts_over_at_one_holder(make_l1: Any) -> None:
    l1 = make_l1(read_ttl_seconds=0.2, eviction_trigger_watermark=1.0)
    _store(l1, 0)
    assert l1.contains(make_key(0), pin=True)  # a holder that never unpins
    time.sleep(0.25)
    assert l1.pin(make_key(0))  # upstream's TTL lock: the expired holder is forgotten
    assert l1.unpin(make_key(0))
    obj = l1.get_blocking(make_key(0))
    assert obj is not None
    assert obj.metadata.pin_count == 0
    obj.ref_count_down()


def test_an_object_still_read_is_never_taken_even_with_an_expired_pin(make_l1: Any) -> None:
    l1 = make_l1(policy="FIFO", **TTL_L1)  # FIFO: the read leaves key 0 first in line
    _full_with_key0_pinned(l1)
    reader = l1.get_blocking(make_key(0))
    assert reader is not None
    time.sleep(0.35)
    _store(l1, 16)
    _until(lambda: l1.watermark_evictions == 2)
    assert l1.contains(make_key(0)) and not l1.contains(make_key(2))
    reader.ref_count_down()


@pytest.mark.parametrize("interval_ms, evicted", [(5, True), (60_000, False)])
def test_the_notifier_interval_paces_evictions_that_wait_for_pins_to_expire(
    make_l1: Any, interval_ms: int, evicted: bool
) -> None:
    l1 = make_l1(
        eviction_trigger_watermark=0.5,
        eviction_ratio=0.5,
        read_ttl_seconds=0.2,
        notifier_interval_ms=interval_ms,
    )
    for i in range(8):
        _store(l1, i)
        assert l1.contains(make_key(i), pin=True)  # every key pinned: nothing to evict yet
    time.sleep(0.1)
    assert l1.watermark_evictions == 0
    time.sleep(0.4)  # the pins expired; only the periodic check notices
    assert (l1.watermark_evictions > 0) is evicted


# -- alignment ------------------------------------------------------------------------------


@pytest.mark.parametrize("align", [512, 4096, 65536])
def test_every_l1_object_starts_at_a_multiple_of_align_bytes(make_l1: Any, align: int) -> None:
    l1 = make_l1(size="1MiB", align_bytes=align)
    objs = [l1.allocate(torch.Size([100 + i]), torch.uint8) for i in range(8)]
    offsets = [o.metadata.address for o in objs if o is not None]
    assert len(offsets) == 8
    assert all(off % align == 0 for off in offsets)
    assert len(set(offsets)) == 8
    assert offsets[1] - offsets[0] == align  # a 100-byte object takes one aligned block
    for obj in objs:
        assert obj is not None
        obj.ref_count_down()


def test_bad_settings_are_refused_naming_the_flag() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"eviction_trigger_watermark": 0.0}, "--eviction-trigger-watermark"),
        ({"eviction_trigger_watermark": 1.5}, "--eviction-trigger-watermark"),
        ({"eviction_ratio": -0.1}, "--eviction-ratio"),
        ({"align_bytes": 3000}, "--l1-align-bytes"),
        ({"read_ttl_seconds": 0}, "--l1-read-ttl-seconds"),
        ({"notifier_interval_ms": 0}, "--periodic-notifier-interval-ms"),
    ]
    for bad, flag in cases:
        with pytest.raises(ValueError, match=flag):
            L1Settings(**bad).validate()


# -- lazy allocation ------------------------------------------------------------------------


def test_a_lazy_allocator_hands_out_its_init_size_then_grows_on_demand(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(allocator_module, "LAZY_GROW_STEP_BYTES", 64 * 1024)
    with HostMemoryAllocator(256 * 1024, min_block_size=4096, init_size=64 * 1024) as alloc:
        assert alloc.usable_bytes == 64 * 1024 and alloc.capacity_bytes == 256 * 1024
        objs = [alloc.allocate(torch.Size([OBJ_BYTES]), torch.uint8) for _ in range(16)]
        assert all(o is not None for o in objs)
        assert alloc.usable_bytes == 64 * 1024  # 16 x 4 KiB fit the initial part
        more = alloc.allocate(torch.Size([OBJ_BYTES]), torch.uint8)
        assert more is not None  # grew instead of failing
        assert alloc.usable_bytes == 128 * 1024
        assert alloc.memcheck()
        for obj in [*objs, more]:
            assert obj is not None
            alloc.free(obj)


def test_a_lazy_l1_grows_to_its_full_size_in_the_background(
    make_l1: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(allocator_module, "LAZY_GROW_STEP_BYTES", 256 * 1024)
    l1 = make_l1(size="4MiB", use_lazy=True, init_size_gb=1 / 1024)  # 1 MiB at first
    alloc = l1.memory_allocator
    assert isinstance(alloc, HostMemoryAllocator)
    _until(lambda: alloc.usable_bytes == alloc.capacity_bytes == 4 * 1024**2)
    assert alloc.memcheck()


def test_a_lazy_l1_in_shared_memory_reserves_only_what_it_grew_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(allocator_module, "LAZY_GROW_STEP_BYTES", 1024**2)
    alloc = HostMemoryAllocator(8 * 1024**2, min_block_size=4096, use_shm=True, init_size=1024**2)
    try:
        assert alloc.shm_name is not None
        path = os.path.join(SHM_DIR, alloc.shm_name)
        assert os.stat(path).st_size == 8 * 1024**2  # mapped whole: workers see one size
        assert os.stat(path).st_blocks * 512 < 2 * 1024**2  # only the init part is reserved
        assert alloc.grow()
        assert 2 * 1024**2 <= os.stat(path).st_blocks * 512 < 3 * 1024**2
        assert alloc.usable_bytes == 2 * 1024**2
    finally:
        alloc.close()


def test_without_lazy_all_of_l1_is_usable_at_once(make_l1: Any) -> None:
    l1 = make_l1(size="4MiB", use_lazy=False, init_size_gb=1 / 1024)
    assert l1.memory_allocator.usable_bytes == 4 * 1024**2


def test_lazy_settings_size_the_initial_part() -> None:
    settings = L1Settings(use_lazy=True, init_size_gb=1.0)
    assert settings.init_size_bytes(4 * 1024**3) == 1024**3
    assert settings.init_size_bytes(512 * 1024**2) == 512 * 1024**2  # capped at the size
    assert L1Settings(use_lazy=False).init_size_bytes(4 * 1024**3) == 4 * 1024**3
    # hugepages are pre-allocated (upstream turns lazy off for them)
    assert L1Settings(use_hugepages=True).init_size_bytes(4 * 1024**3) == 4 * 1024**3


# -- hugepages ------------------------------------------------------------------------------


def test_hugepages_in_shared_memory_are_refused() -> None:
    with pytest.raises(ValueError, match="--shm-name ''"):
        HostMemoryAllocator(4 * 1024**2, use_shm=True, use_hugepages=True)


def test_hugepages_map_from_the_pool_or_are_refused_with_the_sysctl() -> None:
    free = allocator_module.free_hugepages()
    if not free or free < 2:
        with pytest.raises(RuntimeError, match=r"vm\.nr_hugepages"):
            HostMemoryAllocator(4 * 1024**2, use_hugepages=True)
        return
    with HostMemoryAllocator(4 * 1024**2, use_hugepages=True) as alloc:
        assert alloc.uses_hugepages
        obj = alloc.allocate(torch.Size([OBJ_BYTES]), torch.uint8)
        assert obj is not None and obj.tensor is not None
        obj.tensor.fill_(7)
        assert int(obj.tensor.sum()) == 7 * OBJ_BYTES
        alloc.free(obj)


# -- store policy ---------------------------------------------------------------------------


def _manager(tmp_path: Path, store_policy: str, disk: bool = True) -> StorageManager:
    extra: dict[str, Any] = {"max_local_cpu_size": "64KiB"}
    if disk:
        extra.update(local_disk=str(tmp_path / "disk"), max_local_disk_size="4MiB")
    config = make_config(**extra)
    settings = TierSettings(config, store_policy=store_policy)
    return StorageManager(
        config, backends=create_storage_backends(settings), store_policy=store_policy
    )


def test_skip_l1_leaves_a_stored_key_in_the_lower_tier_only(tmp_path: Path) -> None:
    manager = _manager(tmp_path, "skip_l1")
    try:
        for i in range(3):
            put(manager, make_key(i), i)
        manager.wait_for_puts()
        l1 = manager.local_cpu_backend
        disk = manager.storage_backends["LocalDiskBackend"]
        assert not any(l1.contains(make_key(i)) for i in range(3))
        assert all(disk.contains(make_key(i)) for i in range(3))
        assert l1.used_bytes == 0  # L1 was only a write buffer
        obj = manager.get_blocking(make_key(1))  # still readable, from the disk tier
        assert obj is not None and obj.tensor is not None
        assert torch.equal(obj.tensor, expected_tensor(1))
        obj.ref_count_down()
    finally:
        manager.close()


def test_default_store_policy_keeps_the_key_in_l1_too(tmp_path: Path) -> None:
    manager = _manager(tmp_path, "default")
    try:
        put(manager, make_key(0), 0)
        manager.wait_for_puts()
        assert manager.local_cpu_backend.contains(make_key(0))
        assert manager.storage_backends["LocalDiskBackend"].contains(make_key(0))
    finally:
        manager.close()


def test_skip_l1_keeps_a_key_pinned_when_its_write_finished(tmp_path: Path) -> None:
    manager = _manager(tmp_path, "skip_l1")
    try:
        obj = fill_obj(manager, 0)
        obj.pin()  # e.g. a lookup pinned it before the write-through finished
        futures = manager.batched_submit_put_task([make_key(0)], [obj])
        for future in futures or []:
            future.result()
        manager.wait_for_puts()
        assert manager.local_cpu_backend.contains(make_key(0))
        obj.unpin()
        obj.ref_count_down()
    finally:
        manager.close()


def test_skip_l1_without_a_lower_tier_keeps_keys_in_l1(tmp_path: Path) -> None:
    manager = _manager(tmp_path, "skip_l1", disk=False)
    try:
        put(manager, make_key(0), 0)
        manager.wait_for_puts()
        assert manager.local_cpu_backend.contains(make_key(0))
    finally:
        manager.close()


def test_an_unknown_store_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="store policy"):
        _manager(tmp_path, "write_back")


def test_obj_shape_is_what_the_sizes_above_assume() -> None:
    assert OBJ_SHAPE.numel() * torch.empty((), dtype=OBJ_DTYPE).element_size() == OBJ_BYTES


def test_watermark_eviction_takes_only_over_quota_tenants_under_isolated_lru(
    make_l1: Any,
) -> None:
    """Headroom is no reason to evict a tenant within its quota: the watermark pass takes
    only the over-quota tenant's excess (a put that really needs room may take more)."""
    l1 = make_l1(policy="IsolatedLRU", eviction_trigger_watermark=0.5, eviction_ratio=1.0)
    size = 4096  # 16 objects fill 64 KiB
    l1.quota_manager.set_quota("alice", 8 * size)
    l1.quota_manager.set_quota("bob", 2 * size)
    for i, salt in enumerate(["alice"] * 6 + ["bob"] * 4):
        obj = fill_obj(l1, i)
        key = CacheEngineKey("m", 1, 0, i, OBJ_DTYPE, configs_with_salt(None, salt))
        l1.batched_submit_put_task([key], [obj])
        obj.ref_count_down()
    _until(lambda: l1.salt_usage.bytes_of("bob") <= 2 * size)
    time.sleep(0.05)  # further passes must not touch alice
    assert l1.salt_usage.bytes_of("alice") == 6 * size
    assert l1.salt_usage.bytes_of("bob") == 2 * size
