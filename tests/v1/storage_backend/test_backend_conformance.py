"""One conformance suite for StorageBackendInterface, run against every backend."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import torch
from conftest import expected_tensor, fill_obj, make_key, put, wait_all

from lmcache.v1.storage_backend.abstract_backend import (
    AllocatorBackendInterface,
    StorageBackendInterface,
)


def _get_value(backend: StorageBackendInterface, i: int) -> torch.Tensor | None:
    obj = backend.get_blocking(make_key(i))
    if obj is None:
        return None
    assert obj.tensor is not None
    value = obj.tensor.clone()
    obj.ref_count_down()
    return value


def test_put_get_roundtrip_is_bit_exact(backend: StorageBackendInterface) -> None:
    put(backend, make_key(1), 7)
    got = _get_value(backend, 1)
    assert got is not None and torch.equal(got, expected_tensor(7))
    assert backend.get_blocking(make_key(2)) is None


def test_contains_and_prefix_lookup(backend: StorageBackendInterface) -> None:
    for i in range(5):
        put(backend, make_key(i), i)
    keys = [make_key(i) for i in range(5)]
    assert all(backend.contains(k) for k in keys)
    assert not backend.contains(make_key(99))
    assert backend.batched_contains(keys) == 5
    assert backend.batched_contains([*keys[:3], make_key(99), keys[3]]) == 3
    assert backend.batched_contains([make_key(99), *keys]) == 0
    assert backend.batched_contains([]) == 0
    assert asyncio.run(backend.batched_async_contains("lookup", keys[:2])) == 2


def test_pin_unpin(backend: StorageBackendInterface) -> None:
    assert backend.pin(make_key(1)) is False
    put(backend, make_key(1), 1)
    assert backend.pin(make_key(1)) is True
    assert backend.unpin(make_key(1)) is True
    assert backend.unpin(make_key(1)) is False
    assert backend.contains(make_key(1), pin=True)
    assert backend.remove(make_key(1), force=False) is False
    assert backend.unpin(make_key(1)) is True
    assert backend.remove(make_key(1), force=False) is True


def test_remove(backend: StorageBackendInterface) -> None:
    for i in range(3):
        put(backend, make_key(i), i)
    assert backend.remove(make_key(0)) is True
    assert not backend.contains(make_key(0))
    assert backend.remove(make_key(0)) is False
    assert backend.get_blocking(make_key(0)) is None
    assert backend.batched_remove([make_key(1), make_key(2), make_key(3)]) == 2
    assert backend.batched_contains([make_key(1)]) == 0


def test_put_callback_and_put_tasks(backend: StorageBackendInterface) -> None:
    done: list[object] = []
    keys = [make_key(i) for i in range(3)]
    objs = [fill_obj(backend, i) for i in range(3)]
    result = backend.batched_submit_put_task(keys, objs, on_complete_callback=done.append)
    assert result is None or all(isinstance(f, Future) for f in result)
    wait_all(backend, result)
    for obj in objs:
        obj.ref_count_down()
    assert sorted(done, key=str) == sorted(keys, key=str)
    assert not any(backend.exists_in_put_tasks(k) for k in keys)


def test_duplicate_put_keeps_first_value(backend: StorageBackendInterface) -> None:
    put(backend, make_key(1), 1)
    put(backend, make_key(1), 2)
    got = _get_value(backend, 1)
    assert got is not None and torch.equal(got, expected_tensor(1))


def test_batched_get_and_non_blocking_variants(backend: StorageBackendInterface) -> None:
    for i in (0, 1, 3):
        put(backend, make_key(i), i)
    keys = [make_key(i) for i in range(4)]
    objs = backend.batched_get_blocking(keys)
    assert [o is not None for o in objs] == [True, True, False, True]
    for i, obj in enumerate(objs):
        if obj is not None:
            assert torch.equal(obj.tensor, expected_tensor(i))
            obj.ref_count_down()
    assert backend.get_non_blocking(make_key(2)) is None
    future = backend.get_non_blocking(make_key(0))
    assert future is not None
    future.result().ref_count_down()
    prefix = asyncio.run(backend.batched_get_non_blocking("lookup", keys))
    assert len(prefix) == 2
    for obj in prefix:
        obj.ref_count_down()


def test_put_is_asynchronous_friendly(backend: StorageBackendInterface) -> None:
    obj = fill_obj(backend, 5)
    result = asyncio.run(backend.async_batched_submit_put_task([make_key(5)], [obj]))
    wait_all(backend, result)
    obj.ref_count_down()
    assert backend.contains(make_key(5))


def test_allocator_backend_and_hooks(backend: StorageBackendInterface) -> None:
    assert isinstance(backend.get_allocator_backend(), AllocatorBackendInterface)
    backend.touch_cache()
    backend.cancel_request("req-1")


def test_bfloat16_and_multi_part_objects(backend: StorageBackendInterface) -> None:
    allocator = backend.get_allocator_backend()
    shapes = [torch.Size([3, 5]), torch.Size([7])]
    obj = allocator.allocate(shapes, [torch.bfloat16, torch.int64])
    assert obj is not None
    first, second = obj.get_tensor(0), obj.get_tensor(1)
    assert first is not None and second is not None
    first.copy_(torch.randn(3, 5).bfloat16())
    second.copy_(torch.arange(7) * 1000003)
    want = (first.clone(), second.clone())
    wait_all(backend, backend.batched_submit_put_task([make_key(9)], [obj]))
    obj.ref_count_down()
    got = backend.get_blocking(make_key(9))
    assert got is not None
    assert got.get_shapes() == shapes
    assert torch.equal(got.get_tensor(0), want[0]) and torch.equal(got.get_tensor(1), want[1])
    got.ref_count_down()
