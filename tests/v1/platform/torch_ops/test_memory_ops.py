"""lmcache_memcpy_async, batched_memcpy, the host allocators and their registries."""

from __future__ import annotations

import ctypes
import os
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import torch

from lmcache.v1.platform.ops_types import TransferDirection
from lmcache.v1.platform.torch_ops import mem_alloc

D2H, H2D = TransferDirection.D2H, TransferDirection.H2D


def test_memcpy_pointer_mode(ops: Any) -> None:
    src = torch.arange(64, dtype=torch.int32)
    dst = torch.zeros(64, dtype=torch.int32)
    ops.lmcache_memcpy_async(dst.data_ptr(), src.data_ptr(), 100, H2D, 0, 0)
    assert torch.equal(dst[:25], src[:25]) and not dst[25:].any()


def test_memcpy_tensor_mode(ops: Any) -> None:
    src = torch.randn(4, 16)
    dst = torch.zeros(4, 16)
    ops.lmcache_memcpy_async(dst, src, src.numel() * 4, D2H, 0, 4096)
    assert torch.equal(dst, src)


def test_memcpy_is_positional_only_and_validates() -> None:
    from lmcache.v1.platform import torch_ops

    buf = torch.zeros(4)
    with pytest.raises(TypeError):
        torch_ops.lmcache_memcpy_async(dest=buf, src=buf, nbytes=4, direction=H2D,
                                       host_buffer_offset=0, host_buffer_alignments=0)  # fmt: skip
    with pytest.raises(ValueError, match="direction"):
        torch_ops.lmcache_memcpy_async(buf, buf, 4, 9, 0, 0)
    with pytest.raises(ValueError, match="bytes"):
        torch_ops.lmcache_memcpy_async(buf, torch.zeros(1), 16, H2D, 0, 0)


def test_batched_memcpy(ops: Any) -> None:
    srcs = [torch.randint(0, 255, (n,), dtype=torch.uint8) for n in (1, 7, 4096)]
    dsts = [torch.zeros_like(s) for s in srcs]
    ops.batched_memcpy([s.data_ptr() for s in srcs], [d.data_ptr() for d in dsts],
                       [s.numel() for s in srcs])  # fmt: skip
    assert all(torch.equal(s, d) for s, d in zip(srcs, dsts))
    with pytest.raises(ValueError, match="equal lengths"):
        ops.batched_memcpy([0], [], [1])


def _pairs() -> list[tuple[str, Callable[[int], int], Callable[[int], None]]]:
    m = mem_alloc
    return [
        ("pinned", m.alloc_pinned_ptr, m.free_pinned_ptr),
        ("pinned_numa", m.alloc_pinned_numa_ptr, m.free_pinned_numa_ptr),
        ("numa", m.alloc_numa_ptr, m.free_numa_ptr),
        ("hugepage", m.alloc_hugepage_pinned_ptr, m.free_hugepage_pinned_ptr),
        ("hugepage_numa", m.alloc_hugepage_pinned_numa_ptr, m.free_hugepage_pinned_numa_ptr),
        ("shm", m.alloc_shm_pinned_ptr, m.free_shm_pinned_ptr),
    ]


def _live_entries() -> int:
    m = mem_alloc
    return len(m._tensor_registry) + len(m._shm_registry) + len(m._buf_registry)


@pytest.mark.parametrize(("kind", "alloc", "free"), _pairs(), ids=[p[0] for p in _pairs()])
def test_allocation_is_usable_and_freed(ops: Any, kind: str, alloc: Any, free: Any) -> None:
    alloc_op, free_op = getattr(ops, alloc.__name__), getattr(ops, free.__name__)
    before = _live_entries()
    ptr = alloc_op(1 << 20)
    assert isinstance(ptr, int) and ptr
    view = (ctypes.c_ubyte * (1 << 20)).from_address(ptr)
    view[0], view[(1 << 20) - 1] = 7, 9
    assert (view[0], view[(1 << 20) - 1]) == (7, 9)
    assert _live_entries() == before + 1
    free_op(ptr)
    assert _live_entries() == before
    assert ptr not in mem_alloc._pinned_ptr_registry
    with pytest.raises(ValueError, match="unknown host pointer"):
        free_op(ptr)


def test_allocation_size_must_be_positive(ops: Any) -> None:
    with pytest.raises(ValueError, match="positive"):
        ops.alloc_numa_ptr(0)


def test_named_shared_memory_is_visible_to_an_attacher(ops: Any) -> None:
    from multiprocessing import shared_memory

    name = f"lmc_test_{uuid.uuid4().hex[:12]}"
    ptr = ops.alloc_shm_pinned_ptr(4096, name)
    try:
        ctypes.memmove(ptr, b"hello", 5)
        peer = shared_memory.SharedMemory(name=name)
        assert bytes(peer.buf[:5]) == b"hello"
        peer.close()
    finally:
        ops.free_shm_pinned_ptr(ptr, 4096, name)
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=name)


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_ten_thousand_alloc_free_cycles_do_not_grow_resident_memory(ops: Any) -> None:
    size = 64 * 1024
    kinds = _pairs()
    for _kind, alloc, free in kinds:  # warm up every code path once
        free(alloc(size))
    start = _resident_bytes()
    for i in range(10_000):
        _kind, alloc, free = kinds[i % len(kinds)]
        ptr = getattr(ops, alloc.__name__)(size)
        ctypes.memset(ptr, 1, size)  # touch every page: a leak would stay resident
        getattr(ops, free.__name__)(ptr)
    growth = _resident_bytes() - start
    # A leak would keep 10,000 x 64 KiB = 625 MiB resident.
    assert growth < 32 * 1024 * 1024, f"resident memory grew by {growth / 2**20:.1f} MiB"
    assert _live_entries() == 0
