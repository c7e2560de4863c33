"""The disk tier's own health: failed writes in a row, free space below one chunk, and the
rate-limited log of failed writes.  Real file systems only (a small private tmpfs filled
to ENOSPC; a directory squatting on a chunk's file name)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from conftest import fill_obj, make_config, make_key
from small_tmpfs import SmallTmpfs

from lmcache.utils import CacheEngineKey
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import (
    UNHEALTHY_AFTER_FAILED_WRITES,
    LocalDiskBackend,
    file_name_for,
)

BIG_SHAPE = torch.Size([2, 2, 64, 32])  # 16 KiB of half: one chunk file is ~16.5 KiB
DISK_LOGGER = "lmcache.v1.storage_backend.local_disk_backend"


@pytest.fixture
def cpu() -> Iterator[LocalCPUBackend]:
    backend = LocalCPUBackend(make_config(max_local_cpu_size="4MiB", local_cpu=False))
    yield backend
    backend.close()


def _disk(path: Path, cpu: LocalCPUBackend, **extra: object) -> LocalDiskBackend:
    config = make_config(
        local_disk=f"file://{path}", max_local_disk_size="4MiB", extra_config=extra or None
    )
    return LocalDiskBackend(config, cpu)


def _put(disk: LocalDiskBackend, cpu: LocalCPUBackend, key: CacheEngineKey) -> bool:
    """Store one big chunk and wait for its write; True if it landed."""
    obj = fill_obj(cpu, key.chunk_hash, BIG_SHAPE)
    try:
        disk.batched_submit_put_task([key], [obj])
        disk.wait_for_puts()
    finally:
        obj.ref_count_down()
    return disk.contains(key)


def _block(folder: Path, key: CacheEngineKey) -> Path:
    """A directory on the chunk file's name: the write's final rename fails (EISDIR or
    ENOTEMPTY) while the file system has all the room it wants."""
    squatter = folder / file_name_for(key)
    squatter.mkdir()
    (squatter / "keep").write_bytes(b"x")
    return squatter


def _unblock(squatter: Path) -> None:
    (squatter / "keep").unlink()
    squatter.rmdir()


def test_failed_writes_in_a_row_are_counted_and_a_success_resets_them(
    tmp_path: Path, cpu: LocalCPUBackend
) -> None:
    disk = _disk(tmp_path, cpu)
    try:
        assert _put(disk, cpu, make_key(0)) and disk.health_problems() == []
        below_k = UNHEALTHY_AFTER_FAILED_WRITES - 1
        keys = [make_key(i) for i in range(1, 2 * below_k + 1)]
        squatters = [_block(tmp_path, k) for k in keys]
        for key in keys[:below_k]:
            assert not _put(disk, cpu, key)
        assert disk.failed_writes_in_a_row == below_k
        assert disk.health_problems() == []  # fewer than K in a row: a fluke, not a disk
        assert _put(disk, cpu, make_key(100))
        assert disk.failed_writes_in_a_row == 0
        for key in keys[below_k:]:
            assert not _put(disk, cpu, key)
        assert disk.failed_writes_in_a_row == below_k  # not 2 x below_k >= K
        assert disk.errors == 2 * below_k
        for squatter in squatters:
            _unblock(squatter)
    finally:
        disk.close()


def test_failed_writes_stay_unhealthy_until_a_write_succeeds(
    small_tmpfs: Callable[[int], SmallTmpfs], cpu: LocalCPUBackend
) -> None:
    fs = small_tmpfs(512 << 10)
    folder = fs.path / "cache"
    disk = _disk(folder, cpu, **{"local_disk.unhealthy_after_failed_writes": 2})
    try:
        assert _put(disk, cpu, make_key(0))
        chunk = disk.used_bytes
        filler = fs.fill(leave_bytes=chunk // 2)  # a 2-byte probe still fits; a chunk not
        assert not _put(disk, cpu, make_key(1))
        assert not _put(disk, cpu, make_key(2))
        problems = disk.health_problems()
        assert any("less than one chunk" in p for p in problems), problems
        assert any("the last 2 writes" in p and "No space left" in p for p in problems), problems
        filler.unlink()
        # Room again and no write since: the health check's own chunk-sized trial write
        # succeeds and ends the failure streak (an idle tier recovers with its disk).
        assert disk.health_problems() == []
        assert _put(disk, cpu, make_key(3)) and disk.health_problems() == []
    finally:
        disk.close()


def test_free_space_below_one_chunk_is_unhealthy_and_recovers(
    small_tmpfs: Callable[[int], SmallTmpfs], cpu: LocalCPUBackend
) -> None:
    fs = small_tmpfs(512 << 10)
    disk = _disk(fs.path / "cache", cpu)
    try:
        assert _put(disk, cpu, make_key(0))
        chunk = disk.used_bytes
        filler = fs.fill(leave_bytes=chunk - 4096)
        assert 0 < fs.free_bytes() < chunk
        (problem,) = disk.health_problems()  # before any write failed
        assert f"less than one chunk ({chunk} bytes)" in problem
        filler.unlink()
        assert disk.health_problems() == []
    finally:
        disk.close()


def test_failed_writes_log_once_per_interval_with_no_traceback(
    small_tmpfs: Callable[[int], SmallTmpfs],
    cpu: LocalCPUBackend,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fs = small_tmpfs(512 << 10)
    disk = _disk(fs.path / "cache", cpu)
    try:
        assert _put(disk, cpu, make_key(0))
        fs.fill(leave_bytes=disk.used_bytes // 2)
        with caplog.at_level(logging.WARNING, logger=DISK_LOGGER):
            for i in range(1, 21):
                assert not _put(disk, cpu, make_key(i))
        failures = [r for r in caplog.records if "chunk write failed" in r.getMessage()]
        assert len(failures) == 1, [r.getMessage() for r in failures]
        assert failures[0].exc_info is None and "No space left" in failures[0].getMessage()
        assert disk.errors == 20  # every failure is counted, only the log is limited
    finally:
        disk.close()
