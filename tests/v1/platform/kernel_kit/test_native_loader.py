"""The fail-soft loader: one warning per cause, then the baseline; a disable variable."""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Callable

import pytest

from lmcache.v1.platform.base.device_ops import DeviceOps
from lmcache.v1.platform.kernel_kit.native_loader import (
    NativeDeviceOps,
    NativeModuleLoader,
    env_flag_set,
)

LOGGER = logging.getLogger("lmcache_kit_test_plugin")
MODULE = "lmcache_kit_test_native"
ENV = "LMCACHE_KIT_TEST_DISABLE_NATIVE"


def _loader(probe: Callable[[], str] | None = None) -> NativeModuleLoader:
    return NativeModuleLoader(
        MODULE, disable_env_var=ENV, ops_name="KitOps", label="kit_test", logger=LOGGER, probe=probe
    )


@pytest.fixture
def native(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType(MODULE)

    def multi_layer_block_kv_transfer(*args: object) -> None:
        return None

    module.multi_layer_block_kv_transfer = multi_layer_block_kv_transfer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, MODULE, module)
    monkeypatch.delenv(ENV, raising=False)
    return module


def _baseline_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "stays on the torch baseline" in r.message]


FLAG_VALUES = [
    ("", False),
    ("0", False),
    ("No", False),
    ("false", False),
    ("1", True),
    ("yes", True),
]


@pytest.mark.parametrize(("value", "disabled"), FLAG_VALUES)
def test_disable_variable_values(
    monkeypatch: pytest.MonkeyPatch, value: str, disabled: bool
) -> None:
    monkeypatch.setenv(ENV, value)
    assert env_flag_set(ENV) is disabled


def test_loads_once_and_binds(native: types.ModuleType) -> None:
    class Ops(NativeDeviceOps):
        native_loader = _loader()

    first, second = Ops(), Ops()
    first.ensure_native()
    second.ensure_native()
    assert first.native_module_name == MODULE
    assert first.multi_layer_block_kv_transfer is native.multi_layer_block_kv_transfer


def test_disabled_warns_once_and_keeps_the_baseline(
    native: types.ModuleType, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(ENV, "1")
    loader = _loader()
    with caplog.at_level(logging.WARNING, logger=LOGGER.name):
        assert loader() is None and loader() is None
    assert _baseline_warnings(caplog) == [
        f"{ENV} is set: KitOps stays on the torch baseline for all ops."
    ]


def test_import_error_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, MODULE, None)  # makes the import raise ImportError
    loader = _loader()

    class Ops(NativeDeviceOps):
        native_loader = loader

    with caplog.at_level(logging.WARNING, logger=LOGGER.name):
        ops = Ops()
        ops.ensure_native()
        Ops().ensure_native()
    (message,) = _baseline_warnings(caplog)
    assert message.startswith("kit_test native extension unavailable (ModuleNotFoundError")
    assert ops.native_module_name is None
    assert ops.multi_layer_block_kv_transfer.__func__ is DeviceOps.multi_layer_block_kv_transfer  # type: ignore[attr-defined]
    loader.cache_clear()
    monkeypatch.delitem(sys.modules, MODULE)
    with caplog.at_level(logging.WARNING, logger=LOGGER.name):
        assert loader() is None  # cleared: tries (and warns) again
    assert len(_baseline_warnings(caplog)) == 2


def test_probe_problem_and_probe_failure(
    native: types.ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    def no_device() -> str:
        return "no device"

    def broken() -> str:
        raise RuntimeError("driver gone")

    with caplog.at_level(logging.WARNING, logger=LOGGER.name):
        assert _loader(no_device)() is None
        assert _loader(broken)() is None
    assert _baseline_warnings(caplog) == [
        "kit_test kernels unusable here: no device; KitOps stays on the torch baseline for all "
        "ops.",
        "kit_test kernels cannot be probed (RuntimeError: driver gone); KitOps stays on the torch "
        "baseline for all ops.",
    ]
