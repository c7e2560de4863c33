"""Move an already-allocated CPU KV cache into POSIX shared memory *in place*.

The LMCache-driven mode on CPU needs the engine's KV pages in an ``lmcache_kv_`` SHM
segment so the server can map them.  vLLM allocates its CPU KV cache with the ordinary
allocator and binds per-layer *views* of it to every attention layer, so re-pointing the
tensors we are given would leave the layers on the old memory.  Instead the pages
themselves are replaced: the covering page range is copied into a new segment, which is
then mapped over the very same virtual addresses (``mmap(MAP_FIXED | MAP_SHARED)``).
Every pointer, tensor and view stays valid and now reads and writes the shared pages.
Linux only; done once at registration, before the engine serves requests.

Only pages the storage has to itself can be replaced: the copy and the remap are two steps,
and a write by another thread to an object sharing those pages in between would be lost
(heap corruption).  A storage inside the malloc heap (``[heap]``: small allocations; vLLM's
KV caches are large and mapped on their own) is therefore refused with the reason, as is
a storage that only partly lies in an earlier segment (its memory was freed and reused).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os

import torch

from lmcache.v1.platform.cpu.shm import (
    SHM_DIR,
    new_segment_name,
    reserve_segment_space,
    shm_segment_of,
)

logger = logging.getLogger(__name__)

_PROT_READ_WRITE = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_FIXED = 0x10  # linux, every architecture vLLM CPU runs on


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    return libc


def remap_storage_to_shm(tensor: torch.Tensor) -> str:
    """Back ``tensor``'s whole storage by a new SHM segment; returns the segment name."""
    if tensor.device.type != "cpu":
        raise ValueError(f"only CPU tensors can be remapped, got {tensor.device}")
    storage = tensor.untyped_storage()
    base, nbytes = storage.data_ptr(), storage.nbytes()
    page = mmap.PAGESIZE
    lo = base - base % page
    hi = -(-(base + nbytes) // page) * page
    size = hi - lo
    existing = shm_segment_of(tensor)
    if existing is not None and _one_mapping_covers(base, base + nbytes):
        return existing
    if _in_malloc_heap(lo, hi):
        raise ValueError(
            f"the {nbytes}-byte CPU KV cache lies in the malloc heap, sharing its pages with "
            "other objects, so it cannot be moved into shared memory safely; use the "
            "engine-driven transfer mode (lmcache.mp.mp_transfer_mode) for KV caches this small"
        )
    name = new_segment_name()
    path = os.path.join(SHM_DIR, name.lstrip("/"))
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        reserve_segment_space(fd, size, name)  # a full /dev/shm is an error here, not a SIGBUS
        with mmap.mmap(fd, size, mmap.MAP_SHARED, _PROT_READ_WRITE) as staging:
            holder = ctypes.c_char.from_buffer(staging)
            try:
                ctypes.memmove(ctypes.addressof(holder), lo, size)
            finally:
                del holder
        result = _libc().mmap(lo, size, _PROT_READ_WRITE, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
        if result != lo:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap(MAP_FIXED) of the KV cache failed: {os.strerror(err)}")
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    logger.info("moved %d bytes of CPU KV cache into shared memory %s", size, name)
    return name


def _mappings() -> list[tuple[int, int, str]]:
    """(start, end, path) of every mapping of this process."""
    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start_s, end_s = fields[0].split("-")
            path = fields[5].strip() if len(fields) == 6 else ""
            found.append((int(start_s, 16), int(end_s, 16), path))
    return found


def _in_malloc_heap(lo: int, hi: int) -> bool:
    return any(s < hi and lo < e and path == "[heap]" for s, e, path in _mappings())


def _one_mapping_covers(lo: int, hi: int) -> bool:
    return any(s <= lo and hi <= e for s, e, _path in _mappings())


def remap_kv_caches_to_shm(tensors: list[torch.Tensor]) -> list[str]:
    """Remap every distinct storage among ``tensors``; the segment names, in order."""
    names: list[str] = []
    seen: set[int] = set()
    for tensor in tensors:
        key = tensor.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        names.append(remap_storage_to_shm(tensor))
    return names
