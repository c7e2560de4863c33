"""Host buffers for allocators: plain, pinned, huge-page backed or POSIX shared memory.

Upstream 0.5.6 keeps these helpers in ``lmcache.v1.memory_management`` under private
names (``_allocate_cpu_memory``, ``_free_cpu_memory``, ``_read_hugepage_info``,
``_get_cached_ubyte_array_type``); that module re-exports them from here.

Differences from upstream, all deliberate:
  * buffers are Python-owned (a torch tensor, or a tensor over an ``mmap`` object), so a
    view that outlives :func:`free_cpu_memory` keeps its pages alive instead of pointing at
    unmapped memory; :func:`free_cpu_memory` releases what must be released explicitly
    (the CUDA host registration of a huge-page buffer, a shared-memory name);
  * without CUDA there is no page-locked memory to ask for, so "pinned" buffers are
    ordinary pageable memory (the copies they serve are CPU copies anyway);
  * NUMA binding (upstream's ``numa_mapping``) is not implemented and is refused.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
from functools import cache
from typing import Any

import torch

from lmcache.v1.memory.shm import create_host_segment, release_host_segment

logger = logging.getLogger(__name__)

__all__ = [
    "HUGEPAGE_SIZE",
    "align_to",
    "allocate_cpu_memory",
    "cached_ubyte_array_type",
    "cuda_status",
    "free_cpu_memory",
    "read_hugepage_info",
]

# The only huge-page size used (the 2 MiB pool), as upstream.
HUGEPAGE_SIZE = 2 * 1024 * 1024
_HUGEPAGE_SYSFS = "/sys/kernel/mm/hugepages/hugepages-2048kB"
# Linux's MAP_HUGETLB (the mmap module does not export it).
_MAP_HUGETLB = 0x40000


def align_to(size: int, align_size: int) -> int:
    """``size`` rounded up to a multiple of ``align_size``."""
    return -(-size // align_size) * align_size


def cuda_status(status: Any) -> int:
    """A ``torch.cuda.cudart()`` call's result as an int error code (0: success)."""
    return int(getattr(status, "value", status))


@cache
def cached_ubyte_array_type(num_bytes: int) -> type[ctypes.Array[ctypes.c_ubyte]]:
    """``ctypes.c_ubyte * num_bytes``, one type object per length.

    ctypes builds a new heap type for every ``c_ubyte * n`` and never frees it; code that
    wraps raw pointers per chunk must reuse the type or it leaks a type per call.
    """
    if num_bytes < 0:
        raise ValueError(f"array length must be >= 0, got {num_bytes}")
    return ctypes.c_ubyte * num_bytes


def read_hugepage_info() -> tuple[int, int, int] | None:
    """(pages in the 2 MiB pool, free pages, page size in MiB), or None if unreadable."""
    try:
        with open(f"{_HUGEPAGE_SYSFS}/nr_hugepages") as f:
            total = int(f.read().strip())
        with open(f"{_HUGEPAGE_SYSFS}/free_hugepages") as f:
            free = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return total, free, HUGEPAGE_SIZE // (1024 * 1024)


def allocate_cpu_memory(
    size: int,
    numa_mapping: Any = None,
    shm_name: str | None = None,
    use_hugepages: bool = False,
) -> torch.Tensor:
    """A flat uint8 host buffer of ``size`` bytes for an allocator.

    ``shm_name`` makes it a POSIX shared-memory segment of that name; ``use_hugepages``
    backs it with 2 MiB huge pages (RuntimeError when the pool is too small).  Otherwise
    the buffer is page-locked when CUDA is present and pageable when not.
    """
    if size < 0:
        raise ValueError(f"buffer size must be >= 0, got {size}")
    if numa_mapping is not None:
        raise ValueError("NUMA-bound host buffers (numa_mapping) are not supported")
    if size == 0:
        return torch.empty(0, dtype=torch.uint8)
    if shm_name is not None:
        if use_hugepages:
            raise ValueError("a shared-memory buffer cannot also use huge pages")
        return create_host_segment(size, shm_name)[1]
    if use_hugepages:
        return _allocate_hugepages(size)
    return torch.empty(size, dtype=torch.uint8, pin_memory=torch.cuda.is_available())


def _allocate_hugepages(size: int) -> torch.Tensor:
    mapped = align_to(size, HUGEPAGE_SIZE)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_HUGETLB
    try:
        region = mmap.mmap(-1, mapped, flags=flags)
    except OSError as e:
        logger.error("huge-page mmap of %d bytes failed: %s (%s)", mapped, e, _pool_summary())
        raise RuntimeError(f"huge-page mmap failed for {size} bytes: {e}") from e
    # The tensor keeps the mmap object (and so the mapping) alive.
    buffer = torch.frombuffer(region, dtype=torch.uint8)[:size]
    if torch.cuda.is_available():
        _check_cuda(torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), mapped, 0))
    return buffer


def _pool_summary() -> str:
    info = read_hugepage_info()
    if info is None:
        return "no 2 MiB huge-page pool found"
    total, free, page_mb = info
    return f"2 MiB pool has {total} pages, {free} free ({page_mb} MiB each)"


def _check_cuda(status: Any) -> None:
    code = cuda_status(status)
    if code != 0:
        raise RuntimeError(f"CUDA host (un)registration failed with error {code}")


def free_cpu_memory(
    buffer: torch.Tensor,
    size: int | None = None,
    numa_mapping: Any = None,
    shm_name: str | None = None,
    use_hugepages: bool = False,
) -> None:
    """Release a buffer from :func:`allocate_cpu_memory` (same arguments).

    The pages themselves go back when the last view of ``buffer`` is gone.
    """
    if buffer.numel() == 0:
        return
    if shm_name is not None:
        release_host_segment(shm_name)
    elif use_hugepages and torch.cuda.is_available():
        torch.cuda.synchronize()
        _check_cuda(torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr()))
