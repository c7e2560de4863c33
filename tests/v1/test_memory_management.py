"""MemoryFormat facts, memory objects and the buddy host allocator."""

from __future__ import annotations

import subprocess
import sys

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from lmcache.v1.memory_management import (
    BytesBufferMemoryObj,
    FreeBlock,
    HostMemoryAllocator,
    MemoryFormat,
    MemoryObjMetadata,
    TensorMemoryObj,
)


def test_memory_format_members() -> None:
    expected = {
        "UNDEFINED": (0, 0),
        "KV_2LTD": (1, 2),
        "KV_T2D": (2, 1),
        "KV_2TD": (3, 0),
        "BINARY": (4, 0),
        "BINARY_BUFFER": (5, 0),
        "KV_MLA_FMT": (6, 2),
        "EC_TD": (7, 0),
        "HS_TD": (8, 0),
    }
    assert [m.name for m in MemoryFormat] == list(expected)
    for name, (value, token_dim) in expected.items():
        assert MemoryFormat[name].value == value and MemoryFormat[name].token_dim() == token_dim


def test_object_counters_and_views() -> None:
    allocator = HostMemoryAllocator(1 << 16)
    obj = allocator.allocate(torch.Size([2, 3, 16, 8]), torch.half, MemoryFormat.KV_2LTD)
    assert obj is not None and obj.get_num_tokens() == 16 and obj.get_size() == 2 * 3 * 16 * 8 * 2
    assert obj.get_physical_size() >= obj.get_size() and obj.shm_offset is None
    assert obj.can_evict and not obj.is_pinned
    obj.pin()
    assert obj.is_pinned and not obj.can_evict
    assert obj.unpin() and not obj.unpin()
    obj.ref_count_up()
    assert not obj.can_evict
    obj.ref_count_down()
    obj.tensor.fill_(1.5)
    assert bytes(obj.byte_array[:2]) == torch.tensor([1.5], dtype=torch.half).numpy().tobytes()
    assert (
        obj.parent() is allocator
        and obj.data_ptr == allocator.buffer.data_ptr() + obj.metadata.address
    )
    obj.ref_count_down()
    assert not obj.is_valid() and allocator.used_bytes == 0
    meta = MemoryObjMetadata.from_dict(obj.metadata.to_dict())
    assert meta.shape == obj.get_shape() and meta.fmt is MemoryFormat.KV_2LTD
    assert FreeBlock(0, 4).can_be_coalesced(FreeBlock(4, 1))


def test_standalone_objects() -> None:
    t = torch.randn(4, 4)
    obj = TensorMemoryObj.from_tensor(t)
    assert torch.equal(obj.tensor, t) and obj.parent() is None
    blob = BytesBufferMemoryObj(b"xyz")
    assert blob.get_memory_format() is MemoryFormat.BINARY_BUFFER and blob.get_size() == 3


def test_tail_trimming_wastes_less_than_one_block() -> None:
    allocator = HostMemoryAllocator(1 << 20, min_block_size=256)
    size = 3 * 65536 + 100  # plain buddy would reserve 256 KiB
    objs = [allocator.allocate(torch.Size([size]), torch.uint8) for _ in range(5)]
    assert all(o is not None for o in objs)
    assert all(o.get_physical_size() - size < 256 for o in objs if o is not None)
    assert allocator.memcheck()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 20000)), max_size=120))
def test_random_alloc_free_never_loses_memory(ops: list[tuple[bool, int]]) -> None:
    allocator = HostMemoryAllocator(1 << 18, min_block_size=256)
    live = []
    for free_one, size in ops:
        if free_one and live:
            live.pop(size % len(live)).ref_count_down()
        else:
            obj = allocator.allocate(torch.Size([size]), torch.uint8)
            if obj is not None:
                obj.tensor.fill_(size % 256)
                live.append(obj)
        assert allocator.memcheck()
    for obj in live:
        assert bool((obj.tensor == obj.get_size() % 256).all())
        obj.ref_count_down()
    # No fragmentation left behind: everything coalesces back into the full buffer.
    assert allocator.used_bytes == 0 and allocator.largest_free_block() == 1 << 18


def test_batched_allocate_is_all_or_nothing() -> None:
    allocator = HostMemoryAllocator(1 << 14, min_block_size=1024)
    assert allocator.batched_allocate(torch.Size([1024]), torch.uint8, 32) is None
    assert allocator.used_bytes == 0
    objs = allocator.batched_allocate(torch.Size([1024]), torch.uint8, 16)
    assert objs is not None and allocator.allocate(torch.Size([1]), torch.uint8) is None
    allocator.batched_free(objs)
    assert allocator.used_bytes == 0


def test_bad_sizes() -> None:
    with pytest.raises(ValueError):
        HostMemoryAllocator(1 << 10, min_block_size=300)
    with pytest.raises(ValueError):
        HostMemoryAllocator(10, min_block_size=256)


def test_shared_memory_allocator_is_readable_from_another_process() -> None:
    with HostMemoryAllocator(1 << 16, use_shm=True) as allocator:
        assert allocator.shm_name
        obj = allocator.allocate(torch.Size([8]), torch.int64)
        assert obj is not None and obj.shm_offset is not None
        obj.tensor.copy_(torch.arange(8) * 7)
        code = (
            "import sys, torch\n"
            "from multiprocessing import shared_memory\n"
            "shm = shared_memory.SharedMemory(sys.argv[1])\n"
            "off = int(sys.argv[2])\n"
            "data = bytes(shm.buf[off:off+64])\n"
            "print(torch.frombuffer(data, dtype=torch.int64).tolist())\n"
            "shm.close()\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, allocator.shm_name, str(obj.shm_offset)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out.strip() == str([7 * i for i in range(8)])
        obj.ref_count_down()
