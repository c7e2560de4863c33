"""DeviceOps: delegation to the baseline, bind_native overlays, feature detection."""

from __future__ import annotations

import logging
import types
from typing import Any

import pytest
import torch

from lmcache.v1.platform import ops_types, torch_ops
from lmcache.v1.platform.base.device_ops import DEVICE_OP_NAMES, DeviceOps
from lmcache.v1.platform.base.device_spec import DeviceSpec


def _native_module() -> types.ModuleType:
    module = types.ModuleType("fake_native")

    def lmcache_memcpy_async(*args: Any) -> str:
        return "native"

    class StagingCopy:
        def __init__(self, dest: int, src: int, nbytes: int, host_offset: int) -> None:
            self.dest, self.src, self.nbytes, self.host_offset = dest, src, nbytes, host_offset

    module.lmcache_memcpy_async = lmcache_memcpy_async  # type: ignore[attr-defined]
    module.StagingCopy = StagingCopy  # type: ignore[attr-defined]
    module._private = lambda: None  # type: ignore[attr-defined]
    module.CONSTANT = 3  # type: ignore[attr-defined]
    module.sub = types  # type: ignore[attr-defined]
    return module


def test_every_op_delegates_to_a_baseline_function() -> None:
    for name in DEVICE_OP_NAMES:
        assert callable(getattr(torch_ops, name, None)), f"torch_ops lacks {name}"


def test_bind_native_overrides_one_function_and_one_type() -> None:
    ops = DeviceOps()
    ops.bind_native(_native_module())
    assert ops.lmcache_memcpy_async(0, 0, 0, 0, 0, 0) == "native"
    assert ops.StagingCopy(1, 2, 3, 4).nbytes == 3
    assert ops.native_symbols == ("StagingCopy", "lmcache_memcpy_async")
    # Everything else stays baseline.
    src = torch.arange(8, dtype=torch.float32)
    dst = torch.zeros(8, dtype=torch.float32)
    ops.batched_memcpy([src.data_ptr()], [dst.data_ptr()], [src.numel() * 4])
    assert torch.equal(src, dst)
    assert not hasattr(ops, "_private") or ops._private is not _native_module()._private
    assert not hasattr(ops, "CONSTANT")


def test_stub_plan_types_refuse_construction_without_native() -> None:
    ops = DeviceOps()
    with pytest.raises(NotImplementedError, match="StagingCopy requires a backend-specific"):
        ops.StagingCopy(1, 2, 3, 4)


def test_bind_native_aliases_gpukvformat() -> None:
    module = types.ModuleType("fake_native")
    module.EngineKVFormat = ops_types.EngineKVFormat  # type: ignore[attr-defined]
    ops = DeviceOps()
    ops.bind_native(module)
    assert ops.GPUKVFormat is ops_types.EngineKVFormat


def test_unknown_op_raises_attribute_error_for_feature_detection() -> None:
    ops = DeviceOps()
    assert not hasattr(ops, "execute_object_group_transfer")
    with pytest.raises(AttributeError, match="has no device operation"):
        ops.execute_object_group_transfer()


def test_get_ops_is_a_singleton_and_calls_ensure_native_once() -> None:
    calls = []

    class CountingOps(DeviceOps):
        def ensure_native(self) -> None:
            calls.append(1)

    class Spec(DeviceSpec):
        @property
        def ops_cls(self) -> type[DeviceOps]:
            return CountingOps

    spec = Spec()
    assert spec.get_ops() is spec.get_ops()
    assert calls == [1]


def test_failing_ensure_native_falls_back_to_baseline(caplog: pytest.LogCaptureFixture) -> None:
    class BrokenOps(DeviceOps):
        def ensure_native(self) -> None:
            raise ImportError("no native module here")

    class Spec(DeviceSpec):
        @property
        def backend_name(self) -> str:
            return "broken"

        @property
        def ops_cls(self) -> type[DeviceOps]:
            return BrokenOps

    with caplog.at_level(logging.WARNING, logger="lmcache"):
        ops = Spec().get_ops()
    assert isinstance(ops, BrokenOps)
    assert ops.native_module_name is None
    assert "no native module here" in caplog.text


def test_device_spec_defaults_match_the_guide() -> None:
    spec = DeviceSpec()
    assert spec.ops_cls is DeviceOps
    assert spec.ipc_wrapper_cls is None
    assert spec.is_handle_transfer_available() is True
    assert spec.pin_memory_backend is None
    assert spec.event_ipc_backend is None
    assert spec.priority == 0
    assert spec.is_available() is False
    assert spec.pin_memory(0, 0) is False and spec.is_pin_supported is False
    with pytest.raises(NotImplementedError):
        spec.create_cache_context()
