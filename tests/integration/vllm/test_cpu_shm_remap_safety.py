"""Moving a CPU KV cache into shared memory in place is refused where it is unsafe."""

from __future__ import annotations

import pytest
import torch

from lmcache.integration.vllm.cpu_shm_remap import remap_storage_to_shm
from lmcache.v1.platform.cpu.shm import unlink_segment


def test_a_kv_cache_in_the_malloc_heap_is_refused_not_remapped() -> None:
    """Its pages hold other objects too: a write to them between the copy and the remap
    would be lost (heap corruption), so the remap refuses with the way out."""
    small = torch.zeros(1024)  # 4 KiB: a heap allocation
    with pytest.raises(ValueError, match="engine-driven transfer mode"):
        remap_storage_to_shm(small)


def test_a_kv_cache_with_pages_of_its_own_is_remapped_in_place() -> None:
    big = torch.arange(33 * 1024**2 // 4, dtype=torch.float32)  # over glibc's mmap threshold
    before = big.data_ptr()
    name = remap_storage_to_shm(big)
    try:
        assert big.data_ptr() == before
        assert torch.equal(big[:5], torch.arange(5, dtype=torch.float32))
        assert remap_storage_to_shm(big) == name  # already in its segment: nothing to do
    finally:
        unlink_segment(name)
