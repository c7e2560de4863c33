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


def test_upstream_transfer_mode_path_is_the_platform_enum() -> None:
    from lmcache.v1.platform import transfer_mode
    from lmcache.v1.platform.transfer_mode import (
        ENV_MP_TRANSFER_MODE,
        MPTransferMode,
        resolve_transfer_mode,
    )

    assert MPTransferMode is transfer_mode.MPTransferMode
    assert resolve_transfer_mode is transfer_mode.resolve_transfer_mode
    assert ENV_MP_TRANSFER_MODE == transfer_mode.ENV_MP_TRANSFER_MODE == "LMCACHE_MP_TRANSFER_MODE"
    assert MPTransferMode.parse("LMCACHE_DRIVEN") is MPTransferMode.LMCACHE_DRIVEN


def test_server_kv_layout_path_is_the_platform_class() -> None:
    import torch

    from lmcache.v1.memory_management import MemoryFormat
    from lmcache.v1.multiprocess.server.kv_layout import KVLayout, chunk_memory_format
    from lmcache.v1.platform import kv_layout

    assert KVLayout is kv_layout.KVLayout
    paged = KVLayout.from_tensors([torch.zeros(2, 4, 16, 2, 8)] * 3)
    mla = KVLayout.from_tensors([torch.zeros(4, 16, 8)] * 3)
    assert chunk_memory_format(paged) is MemoryFormat.KV_2LTD
    assert chunk_memory_format(mla) is MemoryFormat.KV_MLA_FMT


def test_engine_kv_format_is_one_enum_under_both_names() -> None:
    from lmcache.v1.platform import kv_formats, ops_types

    assert ops_types.EngineKVFormat is kv_formats.EngineKVFormat
    assert ops_types.GPUKVFormat is kv_formats.EngineKVFormat
    fmt = kv_formats.EngineKVFormat.NL_X_TWO_NB_BS_NH_HS
    assert ops_types.is_layer_list(fmt) and not ops_types.is_mla(fmt)
    with pytest.raises(ValueError, match="unsupported engine_kv_format"):
        ops_types.is_mla(999)
