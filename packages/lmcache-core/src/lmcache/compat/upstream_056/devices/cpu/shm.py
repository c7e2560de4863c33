"""Upstream's ``devices.cpu.shm`` path: the POSIX-SHM KV wrapper and the raw SHM helpers."""

from lmcache.compat.upstream_056.posix_shm import (
    shm_create_readwrite,
    shm_map_readwrite,
    shm_munmap,
    shm_unlink,
)
from lmcache.v1.platform.cpu.shm import CpuShmTensorWrapper, migrate_to_shm_and_wrap

__all__ = [
    "CpuShmTensorWrapper",
    "migrate_to_shm_and_wrap",
    "shm_create_readwrite",
    "shm_map_readwrite",
    "shm_munmap",
    "shm_unlink",
]
