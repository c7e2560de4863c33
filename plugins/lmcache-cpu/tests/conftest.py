"""Fixtures of the lmcache-cpu plugin tests (run with the plugin wheel installed)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from types import ModuleType

import pytest

_SELECTION_ENV_VARS = (
    "DEVICE_TYPE",
    "LMCACHE_DEVICE_BACKEND",
    "LMCACHE_DEVICE_PLUGINS_AUTOLOAD",
    "LMCACHE_CPU_DISABLE_NATIVE",
    "LMCACHE_CPU_THREADS",
)


@pytest.fixture(scope="session")
def native_ops() -> ModuleType:
    """The module bound by CpuNativeDeviceOps (fails loudly if the extension is missing)."""
    from lmcache_cpu import native_ops as module

    return module


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a snippet in a fresh interpreter: the device registry is cached per process."""

    def run(code: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        clean = {k: v for k, v in os.environ.items() if k not in _SELECTION_ENV_VARS}
        clean.update(env or {})
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=clean,
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run
