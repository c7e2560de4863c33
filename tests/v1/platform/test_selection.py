"""Backend selection rules on hand-built registries (no plugins, no environment)."""

from __future__ import annotations

import pytest

from lmcache.v1.platform.base.device_spec import DeviceSpec
from lmcache.v1.platform.registry import (
    BackendSource,
    DeviceRegistry,
    RegisteredBackend,
    select_backend,
)


class _Spec(DeviceSpec):
    def __init__(
        self,
        name: str,
        device_type: str,
        available: bool = True,
        priority: int = 0,
        torch_module: str = "cpu",
    ) -> None:
        super().__init__()
        self._name, self._type, self._available = name, device_type, available
        self._priority, self._module = priority, torch_module

    @property
    def device_type(self) -> str:
        return self._type

    @property
    def backend_name(self) -> str:
        return self._name

    @property
    def torch_module_name(self) -> str:
        return self._module

    @property
    def priority(self) -> int:
        return self._priority

    def is_available(self) -> bool:
        return self._available


def _registry(*specs: _Spec) -> DeviceRegistry:
    source = BackendSource(kind="in-tree", module="test")
    return DeviceRegistry({s.backend_name: RegisteredBackend(s, source) for s in specs}, ())


def test_cpu_is_the_final_fallback() -> None:
    reg = _registry(_Spec("cpu", "cpu"), _Spec("acc", "acc", available=False))
    assert select_backend(reg, env={}).backend.backend_name == "cpu"


def test_accelerator_before_cpu_regardless_of_order() -> None:
    reg = _registry(_Spec("cpu", "cpu"), _Spec("acc", "acc"))
    selection = select_backend(reg, env={})
    assert selection.backend.backend_name == "acc"
    assert "auto-detected" in selection.reason


def test_priority_picks_among_available_of_one_type() -> None:
    reg = _registry(_Spec("cpu", "cpu"), _Spec("cpu_fast", "cpu", priority=10))
    selection = select_backend(reg, env={})
    assert selection.backend.backend_name == "cpu_fast"
    assert "cpu (priority 0)" in selection.reason


def test_unavailable_high_priority_backend_is_not_chosen() -> None:
    reg = _registry(_Spec("cpu", "cpu"), _Spec("cpu_fast", "cpu", available=False, priority=10))
    assert select_backend(reg, env={}).backend.backend_name == "cpu"


def test_tie_is_an_error_naming_the_variable() -> None:
    reg = _registry(_Spec("cpu", "cpu"), _Spec("a", "acc"), _Spec("b", "acc"))
    with pytest.raises(RuntimeError, match=r"a, b.*LMCACHE_DEVICE_BACKEND"):
        select_backend(reg, env={})


def test_explicit_backend_is_strict() -> None:
    reg = _registry(_Spec("cpu", "cpu"), _Spec("a", "acc", available=False))
    with pytest.raises(RuntimeError, match="not available"):
        select_backend(reg, env={"LMCACHE_DEVICE_BACKEND": "a"})
    with pytest.raises(RuntimeError, match=r"not registered\. Available backends: cpu, a"):
        select_backend(reg, env={"LMCACHE_DEVICE_BACKEND": "zzz"})


def test_explicit_backend_is_case_and_space_insensitive() -> None:
    reg = _registry(_Spec("cpu", "cpu"), _Spec("cpu_fast", "cpu", priority=10))
    selection = select_backend(reg, env={"LMCACHE_DEVICE_BACKEND": " CPU "})
    assert selection.backend.backend_name == "cpu"


def test_explicit_backend_must_match_device_type() -> None:
    reg = _registry(_Spec("cpu", "cpu"), _Spec("a", "acc"))
    with pytest.raises(RuntimeError, match="DEVICE_TYPE='cpu'"):
        select_backend(reg, env={"LMCACHE_DEVICE_BACKEND": "a", "DEVICE_TYPE": "cpu"})


def test_explicit_backend_needs_its_torch_module() -> None:
    reg = _registry(_Spec("cpu", "cpu"), _Spec("a", "acc", torch_module="no_such_module"))
    with pytest.raises(RuntimeError, match="torch has no module 'no_such_module'"):
        select_backend(reg, env={"LMCACHE_DEVICE_BACKEND": "a"})


def test_device_type_restricts_choice() -> None:
    reg = _registry(_Spec("cpu", "cpu"), _Spec("acc", "acc"))
    assert select_backend(reg, env={"DEVICE_TYPE": "cpu"}).backend.backend_name == "cpu"


def test_unavailable_device_type_warns_and_auto_detects(caplog: pytest.LogCaptureFixture) -> None:
    reg = _registry(_Spec("cpu", "cpu"), _Spec("acc", "acc", available=False))
    with caplog.at_level("WARNING", logger="lmcache"):
        assert select_backend(reg, env={"DEVICE_TYPE": "acc"}).backend.backend_name == "cpu"
    assert "DEVICE_TYPE='acc' is not available" in caplog.text


def test_missing_torch_module_excludes_backend(caplog: pytest.LogCaptureFixture) -> None:
    reg = _registry(_Spec("cpu", "cpu"), _Spec("acc", "acc", torch_module="no_such_module"))
    with caplog.at_level("WARNING", logger="lmcache"):
        assert select_backend(reg, env={}).backend.backend_name == "cpu"
    assert "torch module [no_such_module] is not found" in caplog.text


def test_is_available_raising_counts_as_unavailable(caplog: pytest.LogCaptureFixture) -> None:
    class Boom(_Spec):
        def is_available(self) -> bool:
            raise OSError("driver exploded")

    reg = _registry(_Spec("cpu", "cpu"), Boom("acc", "acc"))
    with caplog.at_level("WARNING", logger="lmcache"):
        assert select_backend(reg, env={}).backend.backend_name == "cpu"
    assert "driver exploded" in caplog.text


def test_nothing_available_is_a_clear_error() -> None:
    reg = _registry(_Spec("cpu", "cpu", available=False))
    with pytest.raises(RuntimeError, match="lmcache devices"):
        select_backend(reg, env={})
