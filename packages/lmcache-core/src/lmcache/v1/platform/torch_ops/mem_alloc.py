"""Host memory for LMCache buffers, returned as integer addresses.

Every allocation is owned by a registry keyed by its address; ``free_*`` removes the entry
and releases the memory, so nothing outlives its free. What each kind means here:

- *pinned*: with an accelerator, a torch pinned tensor; on a host-only machine an anonymous
  mapping that is ``mlock``-ed when the memlock limit allows (otherwise plain pageable
  memory, logged at debug level).
- *numa*: an anonymous mapping bound to the node with libnuma's ``numa_tonode_memory`` when
  the machine has libnuma and NUMA; otherwise unbound (debug log).
- *hugepage*: ``MAP_HUGETLB`` when huge pages are reserved; otherwise a normal mapping with
  ``MADV_HUGEPAGE`` (transparent huge pages) as the fallback (debug log).
- *shm*: ``multiprocessing.shared_memory`` (POSIX shm), named when ``shm_name`` is given so
  another process can attach; the creator unlinks it on free.

Where a device runtime (CUDA / HIP) is loaded, numa, hugepage and shm buffers are also
registered with it (``cudaHostRegister``) so DMA engines can use them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import mmap
import threading
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import torch

from lmcache.v1.platform.torch_ops._tensor_from_ptr import _device_runtime
from lmcache.v1.platform.torch_ops.mem_kernels import _runtime_memcpy

logger = logging.getLogger(__name__)

__all__ = [
    "alloc_hugepage_pinned_numa_ptr",
    "alloc_hugepage_pinned_ptr",
    "alloc_numa_ptr",
    "alloc_pinned_numa_ptr",
    "alloc_pinned_ptr",
    "alloc_shm_pinned_ptr",
    "batched_memcpy",
    "free_hugepage_pinned_numa_ptr",
    "free_hugepage_pinned_ptr",
    "free_numa_ptr",
    "free_pinned_numa_ptr",
    "free_pinned_ptr",
    "free_shm_pinned_ptr",
]

_MAP_HUGETLB = getattr(mmap, "MAP_HUGETLB", 0x40000)  # Linux value on x86 and arm
_HUGE_PAGE_BYTES = 2 * 1024 * 1024
_HOST_REGISTER_SYMBOLS = (
    ("cudaHostRegister", "cudaHostUnregister"),
    ("hipHostRegister", "hipHostUnregister"),
)


@dataclass
class _SharedSegment:
    shm: shared_memory.SharedMemory
    owner: bool


# The per-process allocation registries (keyed by address). They are the only record that
# keeps each buffer alive, so a free that pops the entry is what releases the memory.
_tensor_registry: dict[int, torch.Tensor] = {}
_shm_registry: dict[int, _SharedSegment] = {}
_buf_registry: dict[int, mmap.mmap] = {}
_pinned_ptr_registry: dict[int, tuple[int, str]] = {}  # address -> (bytes, "mlock"|symbol)
_registry_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


@functools.lru_cache(maxsize=1)
def _libnuma() -> Any:
    """libnuma when it is installed and the kernel reports NUMA support; else None."""
    name = ctypes.util.find_library("numa")
    if name is None:
        logger.debug("libnuma not found; NUMA allocations are not node-bound")
        return None
    try:
        lib = ctypes.CDLL(name)
        if lib.numa_available() < 0:
            logger.debug("libnuma reports no NUMA support; allocations are not node-bound")
            return None
    except (OSError, AttributeError):
        logger.debug("libnuma could not be loaded; allocations are not node-bound")
        return None
    lib.numa_tonode_memory.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.numa_tonode_memory.restype = None
    return lib


def _address_of(buffer: Any) -> int:
    # The ctypes view exports the buffer; dropping it at once keeps the mapping closable.
    view = ctypes.c_char.from_buffer(buffer)
    address = ctypes.addressof(view)
    del view
    return address


def _check_size(size: int) -> int:
    size = int(size)
    if size <= 0:
        raise ValueError(f"allocation size must be positive, got {size}")
    return size


def _map_anonymous(size: int, hugepages: bool) -> mmap.mmap:
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    if hugepages:
        rounded = -(-size // _HUGE_PAGE_BYTES) * _HUGE_PAGE_BYTES
        try:
            return mmap.mmap(-1, rounded, flags=flags | _MAP_HUGETLB)
        except OSError as exc:
            logger.debug("MAP_HUGETLB unavailable (%s); using transparent huge pages", exc)
        buffer = mmap.mmap(-1, size, flags=flags)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                buffer.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                logger.debug("MADV_HUGEPAGE refused; using normal pages")
        return buffer
    return mmap.mmap(-1, size, flags=flags)


def _bind_to_node(address: int, size: int, numa_id: int) -> None:
    lib = _libnuma()
    if lib is None:
        return
    max_node = int(lib.numa_max_node())
    if not 0 <= numa_id <= max_node:
        raise ValueError(f"numa_id {numa_id} is out of range (nodes 0..{max_node})")
    lib.numa_tonode_memory(address, size, numa_id)


def _runtime_host_register(address: int, size: int) -> str | None:
    lib = _device_runtime()
    if lib is None:
        return None
    for register, _unregister in _HOST_REGISTER_SYMBOLS:
        fn = getattr(lib, register, None)
        if fn is not None and fn(ctypes.c_void_p(address), ctypes.c_size_t(size), 0) == 0:
            return register
    return None


def _pin(address: int, size: int) -> None:
    """Page-lock ``address`` with the device runtime, else ``mlock``; soft on failure."""
    how = _runtime_host_register(address, size)
    if how is None and _libc().mlock(ctypes.c_void_p(address), ctypes.c_size_t(size)) == 0:
        how = "mlock"
    if how is None:
        logger.debug("could not page-lock %d bytes (memlock limit); memory stays pageable", size)
        return
    _pinned_ptr_registry[address] = (size, how)


def _unpin(address: int) -> None:
    entry = _pinned_ptr_registry.pop(address, None)
    if entry is None:
        return
    size, how = entry
    if how == "mlock":
        _libc().munlock(ctypes.c_void_p(address), ctypes.c_size_t(size))
        return
    unregister = dict(_HOST_REGISTER_SYMBOLS)[how]
    getattr(_device_runtime(), unregister)(ctypes.c_void_p(address))


def _alloc_mapped(size: int, *, numa_id: int | None, hugepages: bool, pin: bool) -> int:
    size = _check_size(size)
    buffer = _map_anonymous(size, hugepages)
    address = _address_of(buffer)
    try:
        if numa_id is not None:
            _bind_to_node(address, len(buffer), int(numa_id))
        with _registry_lock:
            _buf_registry[address] = buffer
            if pin:
                _pin(address, size)
    except BaseException:
        buffer.close()
        raise
    return address


def _free(ptr: int) -> None:
    """Release whatever allocation owns ``ptr``; ValueError for an unknown address."""
    ptr = int(ptr)
    with _registry_lock:
        _unpin(ptr)
        tensor = _tensor_registry.pop(ptr, None)
        buffer = _buf_registry.pop(ptr, None)
        segment = _shm_registry.pop(ptr, None)
    if buffer is not None:
        buffer.close()
    if segment is not None:
        segment.shm.close()
        if segment.owner:
            segment.shm.unlink()
    if tensor is None and buffer is None and segment is None:
        raise ValueError(f"free of unknown host pointer {ptr:#x}")


def _accelerator_present() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator is not None and accelerator.is_available())


def alloc_pinned_ptr(size: int, device_id: int = 0) -> int:
    """Page-locked host memory (a torch pinned tensor when an accelerator is present)."""
    if not _accelerator_present():
        return _alloc_mapped(size, numa_id=None, hugepages=False, pin=True)
    tensor = torch.empty(_check_size(size), dtype=torch.uint8, pin_memory=True)
    with _registry_lock:
        _tensor_registry[tensor.data_ptr()] = tensor
    return tensor.data_ptr()


def free_pinned_ptr(ptr: int) -> None:
    _free(ptr)


def alloc_pinned_numa_ptr(size: int, numa_id: int = 0) -> int:
    return _alloc_mapped(size, numa_id=numa_id, hugepages=False, pin=True)


def free_pinned_numa_ptr(ptr: int, size: int | None = None) -> None:
    _free(ptr)


def alloc_numa_ptr(size: int, numa_id: int = 0) -> int:
    return _alloc_mapped(size, numa_id=numa_id, hugepages=False, pin=False)


def free_numa_ptr(ptr: int, size: int | None = None) -> None:
    _free(ptr)


def alloc_hugepage_pinned_ptr(size: int, device_id: int = 0) -> int:
    return _alloc_mapped(size, numa_id=None, hugepages=True, pin=True)


def free_hugepage_pinned_ptr(ptr: int, size: int = 0) -> None:
    _free(ptr)


def alloc_hugepage_pinned_numa_ptr(size: int, numa_id: int = 0) -> int:
    return _alloc_mapped(size, numa_id=numa_id, hugepages=True, pin=True)


def free_hugepage_pinned_numa_ptr(ptr: int, size: int = 0) -> None:
    _free(ptr)


def _open_segment(size: int, shm_name: str) -> _SharedSegment:
    try:
        shm = shared_memory.SharedMemory(name=shm_name or None, create=True, size=size)
        return _SharedSegment(shm, owner=True)
    except FileExistsError:
        shm = shared_memory.SharedMemory(name=shm_name, create=False)
    # An attaching process must not let its resource tracker unlink the creator's segment.
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    if shm.size < size:
        shm.close()
        raise ValueError(f"shared memory {shm_name!r} holds {shm.size} bytes, {size} requested")
    return _SharedSegment(shm, owner=False)


def alloc_shm_pinned_ptr(size: int, shm_name: str = "") -> int:
    """POSIX shared memory (created, or attached when ``shm_name`` already exists)."""
    segment = _open_segment(_check_size(size), shm_name)
    address = _address_of(segment.shm.buf)
    with _registry_lock:
        _shm_registry[address] = segment
        how = _runtime_host_register(address, size)
        if how is not None:
            _pinned_ptr_registry[address] = (size, how)
    return address


def free_shm_pinned_ptr(ptr: int, size: int = 0, shm_name: str = "") -> None:
    _free(ptr)


def batched_memcpy(src_ptrs: list[int], dst_ptrs: list[int], sizes: list[int]) -> None:
    """Copy ``sizes[i]`` bytes from ``src_ptrs[i]`` to ``dst_ptrs[i]`` for every i."""
    if not len(src_ptrs) == len(dst_ptrs) == len(sizes):
        raise ValueError(
            f"batched_memcpy needs equal lengths, got {len(src_ptrs)} sources, "
            f"{len(dst_ptrs)} destinations and {len(sizes)} sizes"
        )
    for src, dst, size in zip(src_ptrs, dst_ptrs, sizes):
        if size < 0:
            raise ValueError(f"negative copy size {size}")
        if size and not _runtime_memcpy(int(dst), int(src), int(size)):
            ctypes.memmove(int(dst), int(src), int(size))
