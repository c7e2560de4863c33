"""pytest plugin of the conformance suite: the ``--lmcache-backend`` option.

Registered as a ``pytest11`` entry point named like this module, so the option exists
wherever lmcache-core is installed (a conftest inside a ``--pyargs`` package is loaded too
late to add options); ``-p lmcache.testing.plugin`` loads it explicitly from a source tree.
Importing it is cheap: no torch, no registry.
"""

from __future__ import annotations

import pytest

from lmcache.testing import BACKEND_ENV_VAR, BACKEND_OPTION


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lmcache", "lmcache device-plugin conformance suite")
    group.addoption(
        BACKEND_OPTION,
        default=None,
        help=f"backend_name to certify (default: ${BACKEND_ENV_VAR}, else the selected one)",
    )
