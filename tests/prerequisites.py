"""One rule for tests whose prerequisite is missing (redis-server, the registry test plugin
wheels, matplotlib, the upstream lmcache venvs, ...): a skip on a developer's machine, a
**failure** under nox and in CI, so a suite cannot pass by silently skipping what it was
meant to test.

"Under nox and in CI" means ``LMCACHE_TEST_REQUIRE_INSTALLED=1`` (every nox test session
sets it) or ``CI`` set to anything but ``""``, ``0`` or ``false``.  A prerequisite that is
absent *by design* in those sessions (vLLM outside the ``vllm-e2e`` session) names its own
variable instead (``required_env``) and stays a skip elsewhere.  Skips that are about the
machine rather than the set-up (no GPU) do not go through here.

Imported as ``prerequisites`` (``tests/`` is on ``sys.path`` under pytest's default import
mode; ``tests_interop/conftest.py`` appends it).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from types import ModuleType
from typing import NoReturn

import pytest

REQUIRE_ENV = "LMCACHE_TEST_REQUIRE_INSTALLED"


def prerequisites_required(environ: Mapping[str, str] | None = None) -> bool:
    """True under nox (``LMCACHE_TEST_REQUIRE_INSTALLED=1``) or in CI (``CI`` set)."""
    env = os.environ if environ is None else environ
    ci = env.get("CI", "").strip().lower()
    return env.get(REQUIRE_ENV) == "1" or ci not in ("", "0", "false")


def missing_prerequisite(name: str, reason: str, required_env: str | None = None) -> NoReturn:
    """Skip (locally) or fail (nox/CI, or ``required_env=1``) for the missing ``name``."""
    message = f"missing prerequisite {name}: {reason}"
    if required_env is not None:
        required = os.environ.get(required_env) == "1"
        gate = f"{required_env}=1"
    else:
        required = prerequisites_required()
        gate = f"CI or {REQUIRE_ENV}=1"
    if required:
        pytest.fail(f"{message} (a failure, not a skip: {gate} is set)", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def require_prerequisite(
    name: str, available: bool, reason: str, required_env: str | None = None
) -> None:
    """Return if ``available``; else :func:`missing_prerequisite`."""
    if not available:
        missing_prerequisite(name, reason, required_env)


def require_module(module: str, reason: str, required_env: str | None = None) -> ModuleType:
    """``import module``, or :func:`missing_prerequisite` when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing_prerequisite(module, f"{reason} ({exc})", required_env)
