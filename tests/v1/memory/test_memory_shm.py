"""One module creates POSIX shm segments; a creation that fails leaves no segment behind."""

from __future__ import annotations

import os
import uuid

import pytest
import torch

from lmcache.v1.memory import shm as memory_shm
from lmcache.v1.memory.allocator import HostMemoryAllocator
from lmcache.v1.memory.shm import attach_shared_buffer, create_host_segment
from lmcache.v1.platform.cpu import shm as platform_shm

SHM_DIR = "/dev/shm"


def _fresh_name() -> str:
    return f"lmcache_test_{uuid.uuid4().hex[:16]}"


def _exists(name: str) -> bool:
    return os.path.exists(os.path.join(SHM_DIR, name.lstrip("/")))


def test_the_allocator_segment_is_made_by_the_platform_primitive() -> None:
    assert memory_shm.create_segment is platform_shm.create_segment
    assert memory_shm.SHM_DIR == platform_shm.SHM_DIR == SHM_DIR


def test_allocator_segment_round_trip_and_release() -> None:
    name = _fresh_name()
    allocator = HostMemoryAllocator(1 << 16, use_shm=True, shm_name=name)
    try:
        assert allocator.shm_name == name and _exists(name)
        obj = allocator.allocate(torch.Size([64]), torch.float32)
        assert obj is not None and obj.shm_offset is not None
        obj.tensor.copy_(torch.arange(64, dtype=torch.float32))  # type: ignore[union-attr]
        seen = attach_shared_buffer(name, allocator.capacity_bytes)
        part = seen[obj.shm_offset : obj.shm_offset + obj.get_size()].view(torch.float32)
        assert torch.equal(part, torch.arange(64, dtype=torch.float32))
        obj.ref_count_down()
    finally:
        allocator.close()
    assert not _exists(name)
    allocator.close()  # a second close finds nothing to unlink and does not raise


def test_auto_named_allocator_segment_is_not_a_kv_segment() -> None:
    allocator = HostMemoryAllocator(1 << 12, use_shm=True)
    try:
        assert allocator.shm_name is not None
        assert allocator.shm_name.startswith(f"lmcache_{os.getpid()}_")
        assert not allocator.shm_name.startswith("lmcache_kv_")
    finally:
        allocator.close()
    assert not _exists(allocator.shm_name)


@pytest.mark.parametrize("failing", ["posix_fallocate", "from_file"])
def test_failed_allocator_segment_is_unlinked(
    failing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_args: object, **_kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    target = os if failing == "posix_fallocate" else torch
    monkeypatch.setattr(target, failing, boom)
    name = _fresh_name()
    with pytest.raises(OSError, match="No space left"):
        HostMemoryAllocator(1 << 12, use_shm=True, shm_name=name)
    monkeypatch.undo()
    assert not _exists(name)


def test_failed_kv_segment_is_unlinked(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("mmap failed")

    monkeypatch.setattr(torch, "from_file", boom)
    name = platform_shm.new_segment_name()
    with pytest.raises(RuntimeError, match="mmap failed"):
        platform_shm.create_segment(64, shm_name=name)
    monkeypatch.undo()
    assert not _exists(name)


def test_existing_segment_is_refused_and_kept() -> None:
    name, _raw = create_host_segment(64, _fresh_name())
    try:
        with pytest.raises(FileExistsError):
            HostMemoryAllocator(1 << 12, use_shm=True, shm_name=name)
        assert _exists(name)
    finally:
        memory_shm.release_host_segment(name)


@pytest.mark.parametrize("bad", ["a/b", ".", "..", "/"])
def test_bad_segment_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid shared-memory segment name"):
        HostMemoryAllocator(1 << 12, use_shm=True, shm_name=bad)


def test_attach_never_creates_or_grows_a_segment() -> None:
    missing = _fresh_name()
    with pytest.raises(FileNotFoundError):
        attach_shared_buffer(missing, 4096)
    assert not _exists(missing)
    name, _raw = create_host_segment(4096, _fresh_name())
    try:
        with pytest.raises(ValueError, match="holds 4096 bytes"):
            attach_shared_buffer(name, 8192)
        assert os.stat(os.path.join(SHM_DIR, name)).st_size == 4096
    finally:
        memory_shm.release_host_segment(name)
