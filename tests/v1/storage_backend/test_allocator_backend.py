"""AllocatorBackendInterface suite (CPU tier and the manager), eviction and blocking."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
import torch
from conftest import OBJ_DTYPE, OBJ_SHAPE, expected_tensor, make_config, make_key, put

from lmcache.v1.memory_management import attach_shared_buffer
from lmcache.v1.storage_backend.abstract_backend import AllocatorBackendInterface
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

SLOTS = 1024 * 1024 // (OBJ_SHAPE.numel() * 2)  # objects of 4 KiB in the 1 MiB tier


@pytest.fixture(params=["cpu", "manager"])
def alloc_backend(request: pytest.FixtureRequest, backend_factory: Any) -> Any:
    made = backend_factory(request.param)
    assert isinstance(made, AllocatorBackendInterface)
    return made


def test_allocate_shapes_and_refcount(alloc_backend: Any) -> None:
    obj = alloc_backend.allocate(OBJ_SHAPE, OBJ_DTYPE)
    assert obj is not None and obj.get_shape() == OBJ_SHAPE and obj.get_dtype() == OBJ_DTYPE
    assert obj.get_ref_count() == 1 and obj.get_num_tokens() == OBJ_SHAPE[2]
    objs = alloc_backend.batched_allocate(OBJ_SHAPE, OBJ_DTYPE, 4)
    assert objs is not None and len({o.data_ptr for o in objs}) == 4
    for o in [obj, *objs]:
        o.ref_count_down()
    assert alloc_backend.get_memory_allocator().used_bytes == 0
    assert alloc_backend.allocate(torch.Size([4 << 20]), torch.uint8) is None


def test_eviction_follows_lru(alloc_backend: Any) -> None:
    cpu = alloc_backend.get_allocator_backend()
    for i in range(SLOTS):
        put(cpu, make_key(i), i)
    obj = cpu.get_blocking(make_key(0))  # refresh key 0
    obj.ref_count_down()
    put(cpu, make_key(SLOTS), 0)
    assert cpu.contains(make_key(0)) and not cpu.contains(make_key(1))


def test_pinned_and_referenced_objects_are_never_evicted(backend_factory: Any) -> None:
    cpu = backend_factory("cpu")
    for i in range(SLOTS):
        put(cpu, make_key(i), i)
    assert cpu.pin(make_key(0))
    reader = cpu.get_blocking(make_key(1))
    for i in range(SLOTS, 3 * SLOTS):
        put(cpu, make_key(i), i)
    assert cpu.contains(make_key(0)) and cpu.contains(make_key(1))
    assert torch.equal(reader.tensor, expected_tensor(1))
    reader.ref_count_down()
    assert cpu.used_bytes <= cpu.capacity_bytes


def test_nothing_evictable_waits_bounded_then_fails(backend_factory: Any) -> None:
    cpu = backend_factory("cpu")
    for i in range(SLOTS):
        put(cpu, make_key(i), i)
        cpu.pin(make_key(i))
    assert cpu.allocate(OBJ_SHAPE, OBJ_DTYPE, busy_loop=False) is None
    assert cpu.allocate(OBJ_SHAPE, OBJ_DTYPE, eviction=False) is None
    start = time.monotonic()
    assert cpu.allocate(OBJ_SHAPE, OBJ_DTYPE) is None  # blocking_timeout_secs = 1
    assert 0.9 <= time.monotonic() - start < 5


def test_blocked_allocation_resumes_when_memory_frees(backend_factory: Any) -> None:
    cpu = backend_factory("cpu", blocking_timeout_secs=30)
    held = cpu.batched_allocate(OBJ_SHAPE, OBJ_DTYPE, SLOTS)
    assert held is not None
    threading.Timer(0.2, held[0].ref_count_down).start()
    start = time.monotonic()
    obj = cpu.allocate(OBJ_SHAPE, OBJ_DTYPE)
    assert obj is not None and time.monotonic() - start < 10
    for o in [obj, *held[1:]]:
        o.ref_count_down()


@pytest.mark.parametrize(
    ("policy", "survivor", "victim"), [("LRU", 0, 1), ("FIFO", 1, 0), ("LFU", 0, 1), ("MRU", 1, 0)]
)
def test_policies_by_name(backend_factory: Any, policy: str, survivor: int, victim: int) -> None:
    cpu = backend_factory("cpu", cache_policy=policy.lower(), max_local_cpu_size="16KiB")
    for i in range(4):
        put(cpu, make_key(i), i)
    for _ in range(2):
        cpu.get_blocking(make_key(0)).ref_count_down()
    if policy == "MRU":
        cpu.get_blocking(make_key(2)).ref_count_down()
        survivor, victim = 1, 2
    put(cpu, make_key(10), 10)
    assert cpu.contains(make_key(survivor)) and not cpu.contains(make_key(victim))


def test_threads_hammering_the_tier(backend_factory: Any) -> None:
    cpu = backend_factory("cpu")
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(300):
                i = rng.randrange(3 * SLOTS)
                op = rng.random()
                if op < 0.5:
                    put(cpu, make_key(i), i)
                elif op < 0.8:
                    obj = cpu.get_blocking(make_key(i))
                    if obj is not None:
                        assert torch.equal(obj.tensor, expected_tensor(i))
                        obj.ref_count_down()
                elif op < 0.9:
                    cpu.remove(make_key(i))
                else:
                    cpu.batched_contains([make_key(j) for j in range(i, i + 8)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    allocator = cpu.get_memory_allocator()
    assert allocator.memcheck()
    assert allocator.used_bytes == len(cpu) * OBJ_SHAPE.numel() * 2


def test_shared_memory_backed_tier_is_visible_through_the_segment() -> None:
    name = f"lmcache_test_{random.getrandbits(40):x}"
    cpu = LocalCPUBackend(make_config(), shm_name=name)
    try:
        put(cpu, make_key(1), 3)
        obj = cpu.get_blocking(make_key(1))
        segment = attach_shared_buffer(name, cpu.capacity_bytes)
        view = segment[obj.shm_offset : obj.shm_offset + obj.get_size()]
        assert torch.equal(view.view(OBJ_DTYPE).view(OBJ_SHAPE), expected_tensor(3))
        assert obj.shm_byte_length >= obj.get_size()
        obj.ref_count_down()
    finally:
        cpu.close()
    assert cpu.get_memory_allocator().shm_name == name


def test_chunk_budget_and_foreign_objects(backend_factory: Any) -> None:
    from lmcache.v1.config import LMCacheMetadata
    from lmcache.v1.memory_management import BytesBufferMemoryObj, TensorMemoryObj

    meta = LMCacheMetadata("m", kv_shape=(2, 2, 16, 2, 8), chunk_size=16, kv_dtype=torch.half)
    cpu = LocalCPUBackend(make_config(), meta)
    try:
        assert cpu.calculate_chunk_budget() == cpu.capacity_bytes // meta.chunk_bytes()
        foreign = TensorMemoryObj.from_tensor(expected_tensor(4))
        blob = BytesBufferMemoryObj(b"hello world")
        cpu.batched_submit_put_task([make_key(1), make_key(2)], [foreign, blob])
        got = cpu.get_blocking(make_key(1))
        assert got.parent() is cpu.get_memory_allocator()
        assert torch.equal(got.tensor, expected_tensor(4))
        got.ref_count_down()
        got = cpu.get_blocking(make_key(2))
        assert bytes(got.byte_array) == b"hello world"
        got.ref_count_down()
    finally:
        cpu.close()
