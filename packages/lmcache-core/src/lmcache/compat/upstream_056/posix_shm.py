"""POSIX shared-memory segments mapped at raw addresses (upstream 0.5.6's ``posix_shm`` API).

``shm_create_readwrite`` / ``shm_map_readwrite`` return the address of a read-write
mapping of ``/dev/shm/<name>``; the mapping stays alive until ``shm_munmap(addr)``.  The
``mmap`` objects are kept in a process-wide table keyed by address, so an address handed
out here is always backed by a live mapping.  Upstream's import path is
``lmcache.v1.multiprocess.posix_shm``; it lives here so the platform layer can use it.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading

from lmcache.v1.platform.cpu.shm import SHM_DIR

__all__ = [
    "shm_create_readwrite",
    "shm_map_readwrite",
    "shm_munmap",
    "shm_open_pool_as_mmap",
    "shm_unlink",
]

_lock = threading.Lock()
_mappings: dict[int, mmap.mmap] = {}


def _segment_path(name: str) -> str:
    bare = name.lstrip("/")
    if not bare or "/" in bare or bare in (".", ".."):
        raise ValueError(f"invalid POSIX shared-memory name {name!r}")
    return os.path.join(SHM_DIR, bare)


def _check_size(nbytes: int) -> None:
    if not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"a shared-memory mapping needs a positive size, got {nbytes!r}")


def _address_of(mapping: mmap.mmap) -> int:
    view = ctypes.c_char.from_buffer(mapping)
    try:
        return ctypes.addressof(view)
    finally:
        del view  # a live buffer export would keep mmap.close() from unmapping


def _map(name: str, nbytes: int, flags: int) -> int:
    _check_size(nbytes)
    fd = os.open(_segment_path(name), flags, 0o600)
    try:
        if flags & os.O_CREAT:
            os.ftruncate(fd, nbytes)
        elif os.fstat(fd).st_size < nbytes:
            raise ValueError(
                f"shared-memory segment {name!r} holds {os.fstat(fd).st_size} bytes, "
                f"fewer than the {nbytes} requested"
            )
        mapping = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)  # the mapping keeps the pages; the descriptor is not needed
    address = _address_of(mapping)
    with _lock:
        _mappings[address] = mapping
    return address


def shm_create_readwrite(name: str, nbytes: int) -> int:
    """Create the segment ``name`` (it must not exist) of ``nbytes`` and map it read-write."""
    return _map(name, nbytes, os.O_RDWR | os.O_CREAT | os.O_EXCL)


def shm_map_readwrite(name: str, nbytes: int) -> int:
    """Map the first ``nbytes`` of the existing segment ``name`` read-write."""
    return _map(name, nbytes, os.O_RDWR)


def shm_open_pool_as_mmap(name: str, nbytes: int) -> mmap.mmap:
    """The first ``nbytes`` of the existing segment ``name`` as a read-write ``mmap``.

    For callers that want a buffer (``torch.frombuffer``) rather than an address: the
    mapping is not entered in the address table, so the caller owns it and closes it.
    """
    _check_size(nbytes)
    fd = os.open(_segment_path(name), os.O_RDWR)
    try:
        return mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)  # the mapping keeps the pages


def shm_munmap(addr: int, nbytes: int = 0) -> None:
    """Unmap a mapping made here; address 0 (no mapping) is a no-op, as upstream's;
    any other unknown address is a ``ValueError`` (upstream ignores it, which hides
    double unmaps).

    ``nbytes`` is accepted for upstream's signature; the whole mapping is released.
    """
    if not addr:
        return
    with _lock:
        mapping = _mappings.pop(addr, None)
    if mapping is None:
        raise ValueError(f"address {addr:#x} is not a mapping made by shm_*_readwrite")
    mapping.close()


def shm_unlink(name: str) -> None:
    """Remove the segment's name; existing mappings stay valid.  Missing is not an error."""
    try:
        os.unlink(_segment_path(name))
    except FileNotFoundError:
        pass
