"""LazyMemoryAllocator: a reserved host buffer whose usable prefix grows in the background."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lmcache.compat.upstream_056.memory_allocators.lazy_memory_allocator import LazyMemoryAllocator
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.memory.format import MemoryFormat

KIB = 1 << 10
MIB = 1 << 20
THREAD_NAME = "lazy-mem-expand-thread"


class SmallChunks(LazyMemoryAllocator):
    """The real allocator with 64 KiB chunks, so that tests can use small buffers."""

    PIN_CHUNK_SIZE = 64 * KIB


class GatedChunks(SmallChunks):
    """Each chunk's page-locking step waits for the test to open ``gate``."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.gate = threading.Event()
        self.steps = 0
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def _lock_pages(self, offset: int, size: int) -> None:
        if offset > 0:  # the initial prefix is locked in the constructor
            assert self.gate.wait(10), "test never opened the gate"
            self.steps += 1
        super()._lock_pages(offset, size)


class SlowChunks(SmallChunks):
    """Each chunk takes 10 ms, so a 64 MiB expansion would take about ten seconds."""

    def _lock_pages(self, offset: int, size: int) -> None:
        if offset > 0:
            time.sleep(0.01)
        super()._lock_pages(offset, size)


def _expand_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def _alloc(allocator: LazyMemoryAllocator, nbytes: int) -> MemoryObj | None:
    return allocator.allocate(torch.Size([nbytes]), torch.uint8)


def test_allocation_beyond_the_committed_prefix_fails_until_it_is_expanded() -> None:
    allocator = GatedChunks(init_size=100 * KIB, final_size=512 * KIB)
    try:
        # 100 KiB rounds up to two 64 KiB chunks.
        assert allocator.committed_bytes == 128 * KIB
        assert allocator.final_size == 512 * KIB
        assert allocator.capacity_bytes == 128 * KIB
        assert _alloc(allocator, 256 * KIB) is None
        assert allocator.batched_allocate(torch.Size([64 * KIB]), torch.uint8, 3) is None
        assert not allocator.wait_until_expanded(0.05)
        allocator.gate.set()
        assert allocator.wait_until_expanded(10)
        assert allocator.steps == 6
        assert allocator.committed_bytes == allocator.capacity_bytes == 512 * KIB
        big = _alloc(allocator, 256 * KIB)
        assert big is not None and big.is_valid()
        batch = allocator.batched_allocate(torch.Size([64 * KIB]), torch.uint8, 4)
        assert batch is not None and len(batch) == 4
        assert _alloc(allocator, 64 * KIB) is None  # all 512 KiB now in use
        assert allocator.memcheck()
    finally:
        allocator.gate.set()
        allocator.close()


def test_objects_written_before_expansion_survive_it_in_place() -> None:
    allocator = GatedChunks(init_size=64 * KIB, final_size=1 * MIB)
    try:
        base = allocator.get_underlying_buffer().data_ptr()
        obj = allocator.allocate(torch.Size([1024]), torch.float32)
        assert obj is not None and obj.tensor is not None
        obj.tensor.copy_(torch.arange(1024, dtype=torch.float32))
        address = obj.data_ptr
        allocator.gate.set()
        assert allocator.wait_until_expanded(10)
        later = _alloc(allocator, 512 * KIB)
        assert later is not None and later.tensor is not None
        later.tensor.fill_(0xAB)
        # Same buffer, same place, same bytes.
        assert allocator.get_underlying_buffer().data_ptr() == base
        assert obj.data_ptr == address
        assert torch.equal(obj.tensor, torch.arange(1024, dtype=torch.float32))
        assert later.data_ptr >= address + obj.metadata.phy_size
    finally:
        allocator.gate.set()
        allocator.close()


@pytest.mark.parametrize("align_bytes", [512, 4096, 1 << 16])
def test_buffer_base_and_objects_are_aligned(align_bytes: int) -> None:
    allocator = SmallChunks(256 * KIB, 512 * KIB, align_bytes=align_bytes)
    try:
        assert allocator.get_underlying_buffer().data_ptr() % align_bytes == 0
        objs = [_alloc(allocator, n) for n in (100, 5000, align_bytes, 3)]
        for obj in objs:
            assert obj is not None
            assert obj.data_ptr % align_bytes == 0
        allocator.batched_free([o for o in objs if o is not None])
        assert allocator.memcheck()
    finally:
        allocator.close()


@pytest.mark.parametrize("bad", [0, -4096, 3, 1000])
def test_align_bytes_must_be_a_power_of_two(bad: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        SmallChunks(64 * KIB, 128 * KIB, align_bytes=bad)


@pytest.mark.parametrize(("init", "final"), [(0, 64 * KIB), (128 * KIB, 64 * KIB)])
def test_sizes_must_be_positive_and_ordered(init: int, final: int) -> None:
    with pytest.raises(ValueError, match="init_size"):
        SmallChunks(init, final)


def test_numa_binding_is_refused() -> None:
    with pytest.raises(ValueError, match="numa"):
        SmallChunks(64 * KIB, 128 * KIB, numa_mapping=object())


def test_free_is_idempotent_and_formats_are_kept() -> None:
    allocator = SmallChunks(128 * KIB, 128 * KIB)
    try:
        assert not _expand_threads() or all(not t.is_alive() for t in _expand_threads())
        obj = allocator.allocate(torch.Size([8, 2, 64]), torch.bfloat16, MemoryFormat.KV_T2D)
        assert obj is not None and obj.get_memory_format() is MemoryFormat.KV_T2D
        default = _alloc(allocator, 10)
        assert default is not None and default.get_memory_format() is MemoryFormat.UNDEFINED
        assert obj.parent() is allocator
        allocator.free(obj)
        assert not obj.is_valid() and obj.tensor is None
        allocator.free(obj)
        default.ref_count_down()  # frees through the lazy allocator
        assert not default.is_valid()
        assert allocator.used_bytes == 0
        assert allocator.memcheck()
    finally:
        allocator.close()


def test_close_stops_a_long_expansion_promptly_and_joins_its_thread() -> None:
    before = len(_expand_threads())
    allocator = SlowChunks(64 * KIB, 64 * MIB)
    thread = allocator._thread
    assert thread is not None and thread.daemon and thread.name == THREAD_NAME
    assert thread.is_alive()
    time.sleep(0.05)
    started = time.monotonic()
    allocator.close()
    assert time.monotonic() - started < 2.0
    assert not thread.is_alive()
    assert len(_expand_threads()) == before
    assert allocator.committed_bytes < allocator.final_size
    assert not allocator.wait_until_expanded(0)
    allocator.close()  # a second close is harmless


def test_default_chunks_expand_to_the_final_size() -> None:
    """Upstream's sizes: 32 MiB now (rounded up to one 64 MiB chunk), 128 MiB in the end."""
    allocator = LazyMemoryAllocator(init_size=32 * MIB, final_size=128 * MIB)
    try:
        assert allocator.final_size == 128 * MIB
        assert allocator.committed_bytes in (64 * MIB, 128 * MIB)  # the thread is quick
        assert allocator.wait_until_expanded(30)
        obj = allocator.allocate(torch.Size([24 * MIB]), torch.float32)  # 96 MiB
        assert obj is not None and obj.is_valid()
    finally:
        allocator.close()
    assert allocator._thread is not None and not allocator._thread.is_alive()


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.booleans(), st.integers(1, 96 * KIB), st.integers(0, 1000)),
        max_size=30,
    ),
    expand_after=st.integers(0, 30),
)
def test_random_allocations_and_frees_stay_consistent_across_expansion(
    steps: list[tuple[bool, int, int]], expand_after: int
) -> None:
    allocator = GatedChunks(64 * KIB, 512 * KIB, align_bytes=512)
    live: list[MemoryObj] = []
    try:
        for i, (is_alloc, nbytes, pick) in enumerate(steps):
            if i == expand_after:
                allocator.gate.set()
                assert allocator.wait_until_expanded(10)
            if is_alloc or not live:
                obj = _alloc(allocator, nbytes)
                if obj is not None:
                    start = obj.data_ptr
                    assert start % 512 == 0
                    limit = allocator.get_underlying_buffer().data_ptr()
                    assert start + nbytes <= limit + allocator.committed_bytes
                    live.append(obj)
            else:
                allocator.free(live.pop(pick % len(live)))
            spans = sorted((o.data_ptr, o.data_ptr + o.metadata.phy_size) for o in live)
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
            assert allocator.memcheck()
        allocator.batched_free(live)
        assert allocator.used_bytes == 0 and allocator.memcheck()
    finally:
        allocator.gate.set()
        allocator.close()
