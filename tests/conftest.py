"""Fixtures shared by the whole conformance suite.

The suite runs against the *installed* lmcache-core (and, in a plugin's nox session, that
plugin's wheel), so nothing here imports from the source tree directly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from nocore import make_python_without_core
from small_tmpfs import small_tmpfs  # noqa: F401 (fixture)

# Env vars that steer backend selection; subprocess tests start from a clean slate.
SELECTION_ENV_VARS = (
    "DEVICE_TYPE",
    "LMCACHE_DEVICE_BACKEND",
    "LMCACHE_DEVICE_PLUGINS_AUTOLOAD",
    "LMCACHE_TEST_PLUGINS_AVAILABLE",
    "LMCACHE_TEST_HOSTSIM_AVAILABLE",
    "LMCACHE_MP_TRANSFER_MODE",
)


def clean_env(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SELECTION_ENV_VARS}
    env.update(overrides or {})
    return env


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a Python snippet in a fresh interpreter (the registry is cached per process)."""

    def run(
        code: str, env: Mapping[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=clean_env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


@pytest.fixture
def run_python_json(
    run_python: Callable[..., subprocess.CompletedProcess[str]],
) -> Callable[..., Any]:
    """Run a snippet that prints one JSON document as its last stdout line; return it."""

    def run(code: str, env: Mapping[str, str] | None = None) -> Any:
        proc = run_python(code, env)
        assert proc.returncode == 0, f"snippet failed:\n{proc.stdout}\n{proc.stderr}"
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return run


def pytest_configure(config: pytest.Config) -> None:
    # Under nox the suite must exercise the built wheels, never the source tree.
    if os.environ.get("LMCACHE_TEST_REQUIRE_INSTALLED") == "1":
        import lmcache

        location = os.path.realpath(lmcache.__file__)
        if "site-packages" not in location:
            raise pytest.UsageError(
                f"lmcache imported from {location}, not from an installed wheel"
            )


@pytest.fixture
def python_without_core(tmp_path: Path) -> Path:
    """See :func:`nocore.make_python_without_core`; run it with ``nocore.env_without_core``."""
    return make_python_without_core(tmp_path / "nocore")


@pytest.fixture(scope="session")
def core_wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the lmcache-core wheel of the core under test, written by
    ``lmcache plugin wheelhouse`` (built from a source tree, or packed from the installed
    wheel under nox), outside the checkout."""
    folder = tmp_path_factory.mktemp("wheelhouse")
    proc = subprocess.run(
        [sys.executable, "-m", "lmcache.cli.main", "plugin", "wheelhouse", str(folder)],
        capture_output=True, text=True, timeout=600, env=clean_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return folder
