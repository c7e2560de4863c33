"""Fixtures of the lmcache-cuda tests (run with the plugin wheel installed).

GPU-only tests carry the ``gpu`` marker and skip with a reason when torch sees no usable
CUDA device; everything else runs on any machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/layouts.py, tests/emulator.py

_SELECTION_ENV_VARS = (
    "DEVICE_TYPE",
    "LMCACHE_DEVICE_BACKEND",
    "LMCACHE_DEVICE_PLUGINS_AUTOLOAD",
    "LMCACHE_CUDA_DISABLE_NATIVE",
    "LMCACHE_MP_TRANSFER_MODE",
)


def cuda_skip_reason() -> str | None:
    """Why GPU tests cannot run here, or None when a CUDA (not ROCm) torch sees a GPU."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is not a CUDA build"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False (no GPU or no driver)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = cuda_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a snippet in a fresh interpreter: the device registry is cached per process."""

    def run(
        code: str, env: Mapping[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        clean = {k: v for k, v in os.environ.items() if k not in _SELECTION_ENV_VARS}
        clean.update(env or {})
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=clean,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run
