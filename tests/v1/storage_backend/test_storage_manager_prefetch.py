"""What the cache server's prefetch uses of the storage manager: lower-tier reads that do
not promote, and pins taken in exactly the tiers holding a key."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import expected_tensor, fill_obj, make_config, make_key

from lmcache.v1.storage_backend.storage_manager import StorageManager


def _disk_manager(tmp_path: Path) -> StorageManager:
    return StorageManager(make_config(local_disk=str(tmp_path), max_local_disk_size="1MiB"))


def test_read_lower_tiers_reads_below_l1_without_promoting(tmp_path: Path) -> None:
    storage = _disk_manager(tmp_path)
    try:
        obj = fill_obj(storage, 5)
        storage.batched_submit_put_task([make_key(5)], [obj])
        obj.ref_count_down()
        storage.wait_for_puts()
        assert storage.local_cpu_backend.remove(make_key(5))
        read = storage.read_lower_tiers(make_key(5))
        assert read is not None and torch.equal(read.tensor, expected_tensor(5))  # type: ignore[arg-type]
        read.ref_count_down()
        assert not storage.in_l1(make_key(5))  # the caller decides what enters L1
        assert storage.read_lower_tiers(make_key(6)) is None
    finally:
        storage.close()


def test_pin_tiers_names_exactly_the_tiers_it_pinned(tmp_path: Path) -> None:
    storage = _disk_manager(tmp_path)
    try:
        obj = fill_obj(storage, 1)
        storage.batched_submit_put_task([make_key(1)], [obj])
        obj.ref_count_down()
        storage.wait_for_puts()
        both = storage.pin_tiers(make_key(1))
        assert [type(t).__name__ for t in both] == ["LocalCPUBackend", "LocalDiskBackend"]
        assert storage.local_cpu_backend.remove(make_key(1), force=True)
        below = storage.pin_tiers(make_key(1))
        assert [type(t).__name__ for t in below] == ["LocalDiskBackend"]
        assert storage.pin_tiers(make_key(2)) == ()
        for tier in (*both, *below):
            tier.unpin(make_key(1))
        disk = storage.storage_backends["LocalDiskBackend"]
        assert disk.remove(make_key(1), force=False)  # no pin left behind
    finally:
        storage.close()
