"""Tests of lmcache.compat (upstream 0.5.6's internal API over lmcache-core): each is
marked ``compat``, so ``-m "not compat"`` runs the product's tests alone."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/compat/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.compat)
