"""Modules that moved keep their old import paths (issue 16, item 4).

The seeds, plugins and upstream code import these names; each old path must hand back the
very same objects, so ``isinstance`` checks and ``monkeypatch`` keep working across names.
"""

from __future__ import annotations

import importlib

import pytest


def test_device_detect_is_the_registry_module() -> None:
    old = importlib.import_module("lmcache.v1.platform._device_detect")
    new = importlib.import_module("lmcache.v1.platform.registry")
    assert old is new


def test_patching_the_old_registry_name_reaches_the_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import lmcache.v1.platform._device_detect as old
    from lmcache.v1.platform import registry

    sentinel = object()
    monkeypatch.setattr(old, "CPU_DEVICE_TYPE", sentinel)
    assert registry.CPU_DEVICE_TYPE is sentinel


def test_seed_style_from_import_of_the_old_registry_name() -> None:
    from lmcache.v1.platform import registry
    from lmcache.v1.platform._device_detect import build_registry, get_registry, select_backend

    assert build_registry is registry.build_registry
    assert get_registry is registry.get_registry
    assert select_backend is registry.select_backend
