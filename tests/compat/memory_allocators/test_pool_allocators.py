"""Host, pinned, device and mixed allocators (each makes its own buffer)."""

from __future__ import annotations

import pytest
import torch

from lmcache.compat.upstream_056.memory_allocators.gpu_memory_allocator import (
    GPUMemoryAllocator,
    default_device,
)
from lmcache.compat.upstream_056.memory_allocators.host_memory_allocator import HostMemoryAllocator
from lmcache.compat.upstream_056.memory_allocators.mixed_memory_allocator import (
    MixedMemoryAllocator,
)
from lmcache.compat.upstream_056.memory_allocators.pin_memory_allocator import PinMemoryAllocator
from lmcache.v1.memory.format import MemoryFormat
from lmcache.v1.memory.objects import BytesBufferMemoryObj, TensorMemoryObj

POOLS = [HostMemoryAllocator, PinMemoryAllocator, GPUMemoryAllocator, MixedMemoryAllocator]


@pytest.mark.parametrize("cls", POOLS)
def test_objects_free_through_the_pool_on_last_reference(cls: type) -> None:
    allocator = cls(1 << 16)
    obj = allocator.allocate(torch.Size([1024]), torch.float32)
    assert obj is not None and obj.parent() is allocator
    assert allocator.num_active_allocations == 1
    obj.ref_count_down()
    assert allocator.num_active_allocations == 0 and allocator.memcheck()
    allocator.close()
    allocator.close()  # idempotent


@pytest.mark.parametrize("cls", POOLS)
def test_paging_needs_the_page_layout(cls: type) -> None:
    with pytest.raises(ValueError, match="shapes, dtypes and fmt"):
        cls(1 << 16, use_paging=True)


def test_gpu_allocator_uses_the_backends_device() -> None:
    allocator = GPUMemoryAllocator(1 << 16)
    assert allocator.tensor.device.type == torch.device(default_device()).type
    allocator.close()


def test_mixed_allocator_serves_byte_buffers_and_refuses_unknown_formats() -> None:
    allocator = MixedMemoryAllocator(1 << 16)
    buf = allocator.allocate(torch.Size([100]), [], MemoryFormat.BINARY_BUFFER)
    assert isinstance(buf, BytesBufferMemoryObj) and len(buf.byte_array) == 100
    batch = allocator.batched_allocate(torch.Size([5]), [], 3, MemoryFormat.BINARY_BUFFER)
    assert batch is not None and len(batch) == 3
    tensor = allocator.allocate(torch.Size([16]), torch.float32, MemoryFormat.KV_T2D)
    assert isinstance(tensor, TensorMemoryObj)
    allocator.batched_free([*batch, tensor])
    assert not tensor.is_valid() and all(not b.is_valid() for b in batch)
    assert allocator.num_active_allocations == 0
    with pytest.raises(ValueError, match="Unsupported memory format"):
        allocator.allocate(torch.Size([16]), torch.float32, MemoryFormat.BINARY)
    allocator.close()


@pytest.mark.parametrize("cls", POOLS)
def test_rejects_a_non_positive_size(cls: type) -> None:
    with pytest.raises(ValueError, match="size must be > 0"):
        cls(0)
