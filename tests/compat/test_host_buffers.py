"""Host-buffer helpers (upstream's _allocate_cpu_memory and friends)."""

from __future__ import annotations

import ctypes

import pytest

from lmcache.compat.upstream_056.host_buffers import (
    allocate_cpu_memory,
    cached_ubyte_array_type,
    free_cpu_memory,
    read_hugepage_info,
)


def test_buffer_is_usable_and_freeing_is_safe() -> None:
    buf = allocate_cpu_memory(1 << 16)
    assert buf.numel() == 1 << 16
    buf.fill_(3)
    view = buf[:8]
    free_cpu_memory(buf, 1 << 16)
    assert int(view.sum()) == 24  # a view that outlives the free keeps its pages


def test_zero_size_and_bad_arguments() -> None:
    assert allocate_cpu_memory(0).numel() == 0
    with pytest.raises(ValueError, match=">= 0"):
        allocate_cpu_memory(-1)
    with pytest.raises(ValueError, match="numa_mapping"):
        allocate_cpu_memory(4096, numa_mapping=object())


def test_ctypes_array_types_are_cached_per_length() -> None:
    assert cached_ubyte_array_type(16) is cached_ubyte_array_type(16)
    assert ctypes.sizeof(cached_ubyte_array_type(16)) == 16
    assert cached_ubyte_array_type(16) is not cached_ubyte_array_type(32)


def test_hugepage_info_is_a_triple_or_none() -> None:
    info = read_hugepage_info()
    assert info is None or (len(info) == 3 and info[2] == 2)
