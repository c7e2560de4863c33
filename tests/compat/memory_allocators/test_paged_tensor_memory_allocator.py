"""PagedTensorMemoryAllocator: one object per fixed-size page."""

from __future__ import annotations

import pytest
import torch

from lmcache.compat.upstream_056.memory_allocators.paged_tensor_memory_allocator import (
    PagedTensorMemoryAllocator,
)
from lmcache.v1.memory.format import MemoryFormat

PAGE = torch.Size([4, 8])  # 32 float32 = 128 bytes


def _allocator(pages: int = 4) -> PagedTensorMemoryAllocator:
    buffer = torch.zeros(pages * 128, dtype=torch.uint8)
    return PagedTensorMemoryAllocator(buffer, [PAGE], [torch.float32], MemoryFormat.KV_2LTD)


def test_pages_are_disjoint_views_of_the_buffer() -> None:
    allocator = _allocator()
    objs = allocator.batched_allocate(PAGE, torch.float32, 4)
    assert objs is not None
    for i, obj in enumerate(objs):
        assert obj.tensor is not None
        obj.tensor.fill_(float(i))
    for i, obj in enumerate(objs):
        assert obj.tensor is not None and bool((obj.tensor == i).all())
    assert allocator.allocate(PAGE, torch.float32) is None


def test_freed_pages_are_reused_and_stale_handles_stay_dead() -> None:
    allocator = _allocator(pages=1)
    first = allocator.allocate(PAGE, torch.float32)
    assert first is not None
    first.set_used_size(10)
    allocator.free(first)
    second = allocator.allocate(PAGE, torch.float32)
    assert second is not None and second is not first
    assert second.metadata.address == first.metadata.address
    assert second.get_size() == 128
    allocator.free(first)  # stale: must not free the page again
    assert second.is_valid() and allocator.num_active_allocations == 1
    assert allocator.memcheck()


def test_a_smaller_shape_uses_the_start_of_a_page() -> None:
    allocator = _allocator()
    obj = allocator.allocate(torch.Size([2, 8]), torch.float32)
    assert obj is not None and obj.tensor is not None
    assert obj.tensor.shape == torch.Size([2, 8])
    assert obj.get_physical_size() == 128


def test_bad_requests_and_buffers_are_errors() -> None:
    allocator = _allocator()
    with pytest.raises(ValueError, match="exceeds"):
        allocator.allocate(torch.Size([8, 8]), torch.float32)
    with pytest.raises(ValueError, match="greater than 0"):
        allocator.allocate(torch.Size([0]), torch.float32)
    assert allocator.batched_allocate(PAGE, torch.float32, -1) is None
    with pytest.raises(ValueError, match="whole number"):
        PagedTensorMemoryAllocator(torch.zeros(200, dtype=torch.uint8), [PAGE], [torch.float32])
