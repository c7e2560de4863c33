"""``base`` reaches the torch baseline only through the provider the registry installs."""

from __future__ import annotations

import pytest

import lmcache.v1.platform  # noqa: F401 - importing the platform installs the provider
from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.base import baseline
from lmcache.v1.platform.base.device_ops import DeviceOps


def test_the_platform_package_installs_the_torch_baseline() -> None:
    assert baseline.torch_baseline() is torch_ops


def test_without_a_provider_the_error_says_what_to_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(baseline, "_baseline_providers", [])
    with pytest.raises(RuntimeError, match=r"import lmcache\.v1\.platform first"):
        baseline.torch_baseline()


def test_device_ops_calls_whatever_baseline_is_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[object, ...]] = []

    class Recording:
        @staticmethod
        def free_pinned_ptr(ptr: int) -> None:
            calls.append(("free_pinned_ptr", ptr))

        @staticmethod
        def load_and_reshape_flash(*args: object) -> None:
            calls.append(("load_and_reshape_flash", *args))

    # Build the delegating method from the real baseline first: its signature is taken once,
    # on first lookup, while every call looks the baseline up again.
    assert DeviceOps.load_and_reshape_flash.__wrapped__ is torch_ops.load_and_reshape_flash
    monkeypatch.setattr(baseline, "_baseline_providers", [lambda: Recording])
    ops = DeviceOps()
    ops.free_pinned_ptr(7)
    ops.load_and_reshape_flash(1, 2, 3, 4, 5)  # type: ignore[arg-type]
    assert calls == [("free_pinned_ptr", 7), ("load_and_reshape_flash", 1, 2, 3, 4, 5)]
