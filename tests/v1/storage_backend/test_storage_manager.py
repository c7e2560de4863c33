"""Tier chaining: write-through, promotion, cross-tier prefix lookups, plugin loading."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import PLUGIN_SPEC, expected_tensor, make_config, make_key, put

from lmcache.v1.storage_backend import storage_plugin_launcher
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.storage_manager import StorageManager


def _manager(tmp_path: Path, **overrides: Any) -> StorageManager:
    values: dict[str, Any] = {
        "local_disk": str(tmp_path / "disk"),
        "max_local_disk_size": "4MiB",
        "max_local_cpu_size": "64KiB",
        "storage_plugins": [PLUGIN_SPEC],
    }
    values.update(overrides)
    return StorageManager(make_config(**values))


def test_tiers_and_write_through(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    assert list(manager.storage_backends) == ["LocalCPUBackend", "LocalDiskBackend", PLUGIN_SPEC]
    put(manager, make_key(1), 1)
    for backend in manager.storage_backends.values():
        assert backend.contains(make_key(1)), backend
    assert manager.lookup_location(make_key(1)) == "LocalCPUBackend"
    manager.close()


def test_lower_tier_hit_is_promoted_to_l1(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    for i in range(40):  # 40 x 4 KiB > 64 KiB of L1: early keys fall out of L1 only
        put(manager, make_key(i), i)
    l1 = manager.local_cpu_backend
    assert not l1.contains(make_key(0))
    assert manager.lookup_location(make_key(0)) == "LocalDiskBackend"
    assert manager.batched_contains([make_key(i) for i in range(40)]) == 40
    obj = manager.get_blocking(make_key(0))
    assert obj is not None and torch.equal(obj.tensor, expected_tensor(0))
    obj.ref_count_down()
    assert l1.contains(make_key(0))
    objs = manager.batched_get_blocking([make_key(i) for i in (1, 2, 39, 99)])
    assert [o is not None for o in objs] == [True, True, True, False]
    for i, o in zip((1, 2, 39), objs):
        assert o is not None and torch.equal(o.tensor, expected_tensor(i))
        o.ref_count_down()
    assert l1.contains(make_key(1)) and l1.contains(make_key(2))
    manager.close()


def test_prefix_lookup_interleaves_tiers(tmp_path: Path) -> None:
    manager = _manager(tmp_path, storage_plugins=None)
    keys = [make_key(i) for i in range(6)]
    for i in range(6):
        put(manager, keys[i], i)
    l1, disk = manager.local_cpu_backend, manager.storage_backends["LocalDiskBackend"]
    l1.remove(keys[1])
    disk.remove(keys[2])
    disk.remove(keys[4])
    l1.remove(keys[4])
    assert manager.batched_contains(keys) == 4
    assert manager.batched_contains(keys, pin=True) == 4
    manager.remove(keys[0], force=False)
    assert l1.contains(keys[0])  # pinned by the lookup in the tier that answered
    manager.close()


def test_l1_disabled_still_allocates_and_stores_below(tmp_path: Path) -> None:
    manager = _manager(tmp_path, local_cpu=False, storage_plugins=None)
    put(manager, make_key(3), 3)
    assert len(manager.local_cpu_backend) == 0
    obj = manager.get_blocking(make_key(3))
    assert obj is not None and torch.equal(obj.tensor, expected_tensor(3))
    obj.ref_count_down()
    manager.close()


def test_plugins_by_extra_config_and_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import storage_test_plugin

    from lmcache.v1.storage_backend import plugins

    class FakeEntryPoint:
        name = "ep_dict"

        def load(self) -> type:
            return storage_test_plugin.DictStoragePlugin

    monkeypatch.setattr(
        plugins,
        "entry_points",
        lambda group: [FakeEntryPoint()] if group == plugins.ENTRY_POINT_GROUP else [],
    )
    config = make_config(
        storage_plugins=["dict", "ep_dict", "broken", "missing"],
        extra_config={
            "storage_plugin.dict.module_path": "storage_test_plugin",
            "storage_plugin.dict.class_name": "DictStoragePlugin",
            "storage_plugin.dict.option": "on",
            "storage_plugin.broken.module_path": "storage_test_plugin",
            "storage_plugin.broken.class_name": "BrokenStoragePlugin",
        },
    )
    cpu = LocalCPUBackend(config)
    backends: dict[str, Any] = {}
    with caplog.at_level(logging.ERROR, logger="lmcache"):
        storage_plugin_launcher(config, None, None, cpu, "cpu", backends)
    assert list(backends) == ["dict", "ep_dict"]
    assert backends["dict"].option == "on" and backends["dict"].local_cpu_backend is cpu
    assert "'broken' failed to load" in caplog.text and "'missing' failed to load" in caplog.text
    cpu.close()
