"""The bounded tiers count their own evictions: objects dropped to make room, never the
removals a caller asks for, never ``close``."""

from __future__ import annotations

from pathlib import Path

from conftest import make_config, make_key, put

from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

PUTS = 8


def _stored(backend: LocalCPUBackend | LocalDiskBackend) -> list[int]:
    return [i for i in range(PUTS) if backend.contains(make_key(i))]


def test_cpu_tier_counts_evictions_not_removals() -> None:
    cpu = LocalCPUBackend(make_config(max_local_cpu_size="16KiB"))  # four 4 KiB objects
    try:
        assert cpu.evictions == 0
        for i in range(PUTS):
            put(cpu, make_key(i), i)
        stored = _stored(cpu)
        assert 0 < len(stored) < PUTS
        assert cpu.evictions == PUTS - len(stored)
        before = cpu.evictions
        assert cpu.remove(make_key(stored[0]))
        assert cpu.evictions == before
    finally:
        cpu.close()
    assert cpu.evictions == before  # dropping everything at close is not eviction


def test_disk_tier_counts_evictions_not_removals(tmp_path: Path) -> None:
    cpu = LocalCPUBackend(make_config(local_cpu=False))
    config = make_config(local_disk=str(tmp_path), max_local_disk_size="16KiB")
    disk = LocalDiskBackend(config, cpu)
    try:
        for i in range(PUTS):
            put(disk, make_key(i), i)
        stored = _stored(disk)
        assert 0 < len(stored) < PUTS
        assert disk.evictions == PUTS - len(stored)
        before = disk.evictions
        assert disk.remove(make_key(stored[0]))
        assert disk.evictions == before
    finally:
        disk.close()
        cpu.close()


def test_disk_tier_counts_evictions_to_fit_a_smaller_size_at_start(tmp_path: Path) -> None:
    cpu = LocalCPUBackend(make_config(local_cpu=False))
    disk = LocalDiskBackend(make_config(local_disk=str(tmp_path), max_local_disk_size="1MiB"), cpu)
    for i in range(3):
        put(disk, make_key(i), i)
    disk.close()
    smaller = LocalDiskBackend(
        make_config(local_disk=str(tmp_path), max_local_disk_size="6KiB"), cpu
    )
    try:
        assert len(smaller) == 1
        assert smaller.evictions == 2
    finally:
        smaller.close()
        cpu.close()
