"""Upstream's ``lmcache.v1.multiprocess.posix_shm`` path (the code lives in the platform)."""

from lmcache.v1.platform.cpu.posix_shm import (
    shm_create_readwrite,
    shm_map_readwrite,
    shm_munmap,
    shm_open_pool_as_mmap,
    shm_unlink,
)

__all__ = [
    "shm_create_readwrite",
    "shm_map_readwrite",
    "shm_munmap",
    "shm_open_pool_as_mmap",
    "shm_unlink",
]
