"""Fixtures for the baseline-op conformance tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def ops() -> Any:
    """The selected backend's ops: with a vendor plugin installed, this suite tests it."""
    from lmcache import device_ops

    return device_ops
