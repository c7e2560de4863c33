"""TensorMemoryAllocator: buddy placement in a caller's tensor."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lmcache.compat.upstream_056.memory_allocators.tensor_memory_allocator import (
    TensorMemoryAllocator,
)
from lmcache.v1.memory.base import MemoryObj

UNIT = 4096


def _alloc(allocator: TensorMemoryAllocator, nbytes: int) -> MemoryObj | None:
    return allocator.allocate(torch.Size([nbytes]), torch.uint8)


def test_objects_view_the_callers_buffer_and_do_not_overlap() -> None:
    buffer = torch.zeros(8 * UNIT, dtype=torch.uint8)
    allocator = TensorMemoryAllocator(buffer)
    a, b = _alloc(allocator, 100), _alloc(allocator, 3 * UNIT)
    assert a is not None and b is not None
    assert a.tensor is not None and b.tensor is not None
    a.tensor.fill_(7)
    b.tensor.fill_(9)
    assert int(buffer[a.metadata.address]) == 7
    assert bool((a.tensor == 7).all())
    # The 100-byte object takes one whole unit; the next one starts after it.
    assert a.metadata.phy_size == UNIT
    assert b.metadata.address >= a.metadata.address + a.metadata.phy_size


def test_freed_space_coalesces_back_into_the_whole_buffer() -> None:
    allocator = TensorMemoryAllocator(torch.empty(8 * UNIT, dtype=torch.uint8))
    objs = [_alloc(allocator, UNIT) for _ in range(8)]
    assert all(o is not None for o in objs)
    assert _alloc(allocator, 1) is None
    for obj in objs[::2] + objs[1::2]:
        assert obj is not None
        allocator.free(obj)
        assert allocator.memcheck()
    assert allocator.total_allocated_size == 0
    whole = _alloc(allocator, 8 * UNIT)
    assert whole is not None and whole.metadata.address == 0


def test_a_stale_handle_cannot_free_the_blocks_next_owner() -> None:
    allocator = TensorMemoryAllocator(torch.empty(2 * UNIT, dtype=torch.uint8))
    old = _alloc(allocator, UNIT)
    assert old is not None
    allocator.free(old)
    new = _alloc(allocator, UNIT)
    assert new is not None and new.metadata.address == old.metadata.address
    allocator.free(old)  # the stale handle: must leave ``new`` alone
    assert new.is_valid()
    assert allocator.num_active_allocations == 1
    assert allocator.memcheck()


def test_dropping_the_last_reference_frees_through_the_parent() -> None:
    allocator = TensorMemoryAllocator(torch.empty(4 * UNIT, dtype=torch.uint8))
    obj = _alloc(allocator, UNIT)
    assert obj is not None and obj.parent() is allocator
    obj.ref_count_down()
    assert not obj.is_valid()
    assert allocator.num_active_allocations == 0


def test_batched_allocate_is_all_or_nothing() -> None:
    allocator = TensorMemoryAllocator(torch.empty(4 * UNIT, dtype=torch.uint8))
    assert allocator.batched_allocate(torch.Size([UNIT]), torch.uint8, 5) is None
    assert allocator.total_allocated_size == 0
    objs = allocator.batched_allocate(torch.Size([UNIT]), torch.uint8, 4)
    assert objs is not None and len(objs) == 4
    assert allocator.batched_allocate(torch.Size([UNIT]), torch.uint8, 0) == []


@pytest.mark.parametrize("align", [0, -4096, 3, 1000])
def test_rejects_alignment_that_is_not_a_power_of_two(align: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        TensorMemoryAllocator(torch.empty(UNIT, dtype=torch.uint8), align_bytes=align)


def test_rejects_a_buffer_smaller_than_one_unit_and_a_strided_one() -> None:
    with pytest.raises(ValueError, match="smaller than one"):
        TensorMemoryAllocator(torch.empty(100, dtype=torch.uint8))
    with pytest.raises(ValueError, match="contiguous"):
        TensorMemoryAllocator(torch.empty(2 * UNIT, 2, dtype=torch.uint8)[:, 0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5 * UNIT)), max_size=60))
def test_random_allocate_free_keeps_objects_disjoint(ops: list[tuple[bool, int]]) -> None:
    allocator = TensorMemoryAllocator(torch.zeros(32 * UNIT, dtype=torch.uint8))
    live: list[MemoryObj] = []
    for tag, (do_alloc, size) in enumerate(ops):
        if do_alloc or not live:
            obj = _alloc(allocator, size)
            if obj is None:  # full or fragmented: nothing may have changed
                assert allocator.num_active_allocations == len(live)
                continue
            assert obj.tensor is not None
            obj.tensor.fill_(tag % 251 + 1)
            live.append(obj)
        else:
            allocator.free(live.pop(size % len(live)))
        assert allocator.memcheck()
        spans = sorted((o.metadata.address, o.metadata.phy_size) for o in live)
        assert all(a + n <= b for (a, n), (b, _) in itertools.pairwise(spans))
    # No object's bytes were written through another one.
    for obj in live:
        assert obj.tensor is not None
        assert int(obj.tensor.min()) == int(obj.tensor.max())


def test_init_address_space_limits_placement_until_extended() -> None:
    buffer = torch.zeros(8 * UNIT, dtype=torch.uint8)
    allocator = TensorMemoryAllocator(buffer, UNIT, 2 * UNIT)
    assert allocator.capacity_bytes == 2 * UNIT
    a = _alloc(allocator, 2 * UNIT)
    assert a is not None and a.tensor is not None
    a.tensor.fill_(5)
    assert _alloc(allocator, UNIT) is None
    # Partial units add up: two half-unit extensions make one usable unit.
    assert allocator.extend_address_space(UNIT // 2) == 2 * UNIT + UNIT // 2
    assert _alloc(allocator, UNIT) is None
    assert allocator.extend_address_space(UNIT // 2) == 3 * UNIT
    b = _alloc(allocator, UNIT)
    assert b is not None and b.metadata.address == 2 * UNIT
    # Never past the buffer; the object placed first did not move.
    assert allocator.extend_address_space(100 * UNIT) == 8 * UNIT
    assert a.metadata.address == 0 and bool((a.tensor == 5).all())
    assert _alloc(allocator, 5 * UNIT) is not None
    assert allocator.memcheck()


@pytest.mark.parametrize("bad", [-1, 9 * UNIT, 100])
def test_init_address_space_must_fit_the_buffer_and_hold_a_unit(bad: int) -> None:
    with pytest.raises(ValueError):
        TensorMemoryAllocator(torch.empty(8 * UNIT, dtype=torch.uint8), UNIT, bad)


def test_extend_address_space_refuses_negative_sizes() -> None:
    allocator = TensorMemoryAllocator(torch.empty(8 * UNIT, dtype=torch.uint8), UNIT, UNIT)
    with pytest.raises(ValueError):
        allocator.extend_address_space(-UNIT)
