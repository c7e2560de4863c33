"""The L1 host allocator's POSIX shared-memory segment: create, attach from another process,
release.

Creating a segment is owned by :mod:`lmcache.v1.platform.cpu.shm` (the one place that
creates POSIX shm segments, and unlinks one it could not size or map); this module gives
the allocator's segments their names and maps them in other processes.
"""

from __future__ import annotations

import os
import uuid

import torch

from lmcache.v1.platform.cpu.shm import (
    SHM_DIR,
    create_segment,
    map_segment,
    reserve_segment_range,
    unlink_segment,
)

__all__ = [
    "SHM_DIR",
    "attach_shared_buffer",
    "create_host_segment",
    "new_host_segment_name",
    "release_host_segment",
    "reserve_host_segment_range",
]


def new_host_segment_name() -> str:
    """A fresh allocator segment name (``lmcache_<pid>_<random>``, no KV-segment prefix)."""
    return f"lmcache_{os.getpid()}_{uuid.uuid4().hex[:12]}"


def create_host_segment(
    nbytes: int, shm_name: str | None = None, reserve: int | None = None
) -> tuple[str, torch.Tensor]:
    """(name, flat uint8 tensor) of a new segment of ``nbytes`` for an allocator buffer;
    only the first ``reserve`` bytes are reserved when given (a lazy allocator reserves
    the rest with :func:`reserve_host_segment_range` as it grows).

    torch maps the file itself (MAP_SHARED); no Python buffer export pins the mapping, so
    :func:`release_host_segment` can unlink while views are still alive.
    """
    return create_segment(nbytes, shm_name or new_host_segment_name(), reserve=reserve)


def reserve_host_segment_range(shm_name: str, offset: int, nbytes: int) -> None:
    """Reserve more of an allocator's segment before it is used."""
    reserve_segment_range(shm_name, offset, nbytes)


def attach_shared_buffer(shm_name: str, size: int) -> torch.Tensor:
    """Map an allocator's shared-memory segment in another process (e.g. a worker).

    Objects are then ``buffer[obj.shm_offset : obj.shm_offset + obj.shm_byte_length]``.
    The segment is a POSIX shm object, so ``multiprocessing.shared_memory.SharedMemory(
    shm_name)`` opens it too.  A missing segment raises FileNotFoundError and one smaller
    than ``size`` a ValueError (nothing is created or grown).
    """
    return map_segment(shm_name, size)


def release_host_segment(shm_name: str) -> None:
    """Unlink the segment's name; its pages live on until every mapping is gone."""
    unlink_segment(shm_name)
