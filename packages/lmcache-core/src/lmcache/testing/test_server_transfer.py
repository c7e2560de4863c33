"""A store / lookup / retrieve through a real ``lmcache server`` in each transfer mode the
backend declares (``lmcache demo --start-server`` with the backend selected), bit-exact."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from lmcache.v1.platform.registry import DEVICE_BACKEND_ENV_VAR, DEVICE_TYPE_ENV_VAR


def _declared_modes(spec: Any) -> list[str]:
    modes = ["engine_driven"]
    if spec.is_lmcache_driven_available():
        modes.append("lmcache_driven")
    return modes


def test_server_round_trip_in_every_declared_mode(available_spec: Any, device: str) -> None:
    if device != "cpu":
        pytest.skip("the demo's workers hold host-memory KV; device KV is not covered yet")
    env = {k: v for k, v in os.environ.items() if k != DEVICE_TYPE_ENV_VAR}
    env[DEVICE_BACKEND_ENV_VAR] = available_spec.backend_name
    proc = subprocess.run(
        [sys.executable, "-m", "lmcache.cli.main", "demo", "--start-server",
         "--layers", "2", "--tokens", "64"],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "[FAIL]" not in output
    for mode in _declared_modes(available_spec):
        assert f"{mode}: SKIPPED" not in output, output
        assert "retrieved KV is bit-exact" in output
        assert any(line.startswith(mode) for line in proc.stdout.splitlines()), output
