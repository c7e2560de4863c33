"""Native ops load fail-soft: a missing or broken module keeps the torch baseline."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from lmcache.v1.platform.kernel_kit.native_loader import NativeDeviceOps, NativeModuleLoader


def test_get_ops_is_a_singleton_of_ops_cls(available_spec: Any) -> None:
    ops = available_spec.get_ops()
    assert isinstance(ops, available_spec.ops_cls)
    assert available_spec.get_ops() is ops


def test_bound_native_symbols_are_callable(ops: Any) -> None:
    for name in ops.native_symbols:
        assert callable(getattr(ops, name)), name


def _native_loader(spec: Any) -> NativeModuleLoader:
    loader = getattr(spec.ops_cls, "native_loader", None)
    if not (issubclass(spec.ops_cls, NativeDeviceOps) and loader is not None):
        pytest.skip(f"{spec.ops_cls.__qualname__} has no NativeModuleLoader")
    return loader


def test_missing_native_module_keeps_the_baseline(
    available_spec: Any, caplog: pytest.LogCaptureFixture
) -> None:
    real = _native_loader(available_spec)
    broken = NativeModuleLoader(
        "lmcache_testing_no_such_native_module",
        disable_env_var=real.disable_env_var,
        ops_name=real.ops_name,
        label=real.label,
        logger=logging.getLogger("lmcache.testing.native"),
    )
    ops_cls = type("BrokenNative", (available_spec.ops_cls,), {"native_loader": broken})
    with caplog.at_level(logging.WARNING, logger="lmcache.testing.native"):
        ops = ops_cls()
        ops.ensure_native()
    assert list(ops.native_symbols) == []
    assert "stays on the torch baseline" in caplog.text


def test_disable_variable_keeps_the_baseline(
    available_spec: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    loader = _native_loader(available_spec)
    monkeypatch.setenv(loader.disable_env_var, "1")
    loader.cache_clear()
    try:
        ops = available_spec.ops_cls()
        ops.ensure_native()
        assert list(ops.native_symbols) == []
    finally:
        monkeypatch.delenv(loader.disable_env_var)
        loader.cache_clear()
