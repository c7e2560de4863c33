"""pytest wiring of the conformance suite: the backend under test and its device."""

from __future__ import annotations

import os
from typing import Any

import pytest

from lmcache.testing import BACKEND_ENV_VAR, BACKEND_OPTION


def _requested_backend(config: pytest.Config) -> str:
    try:
        option = config.getoption(BACKEND_OPTION)
    except ValueError:  # lmcache.testing.plugin not loaded: the variable still works
        option = None
    return (option or os.environ.get(BACKEND_ENV_VAR, "")).strip().lower()


@pytest.fixture(scope="session")
def backend_name(pytestconfig: pytest.Config) -> str:
    """The backend under test; selected here exactly as a server process would."""
    from lmcache.v1.platform.registry import get_registry, select_backend

    name = _requested_backend(pytestconfig)
    if not name:
        return select_backend(get_registry()).backend.backend_name
    if name not in get_registry().backends:
        skipped = [s.reason for s in get_registry().skipped if s.name == name]
        why = f"; it was skipped: {skipped[0]}" if skipped else ""
        pytest.fail(f"backend {name!r} is not registered{why}", pytrace=False)
    return name


@pytest.fixture(scope="session")
def registered(backend_name: str) -> Any:
    from lmcache.v1.platform.registry import get_registry

    return get_registry().backends[backend_name]


@pytest.fixture(scope="session")
def spec(registered: Any) -> Any:
    return registered.spec


@pytest.fixture(scope="session")
def available_spec(spec: Any) -> Any:
    """The spec, for tests that need the device itself (skipped when it is absent)."""
    if not spec.is_available():
        pytest.skip(f"backend {spec.backend_name!r} is not available on this host")
    return spec


@pytest.fixture(scope="session")
def device(available_spec: Any) -> str:
    """Torch device of the backend's memory (host-memory backends use ``cpu``)."""
    from lmcache.testing.devices import torch_device_of

    return torch_device_of(available_spec)


@pytest.fixture(scope="session")
def ops(available_spec: Any) -> Any:
    return available_spec.get_ops()
