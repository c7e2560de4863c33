"""Adapter modules known but not imported yet: importing one registers its type.

Built-in adapter modules are listed here when the package is imported and imported only
when their type is first asked for, so an adapter's dependencies load only if it is used.
Both registries (:mod:`.config`, :mod:`.factory`) resolve missing names through this.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

_PENDING_MODULES: list[str] = []


def add_pending_module(module_path: str) -> None:
    """Import ``module_path`` when a type name is first missing from a registry."""
    if module_path not in _PENDING_MODULES:
        _PENDING_MODULES.append(module_path)


def import_pending_until(found: Callable[[], bool]) -> None:
    """Import pending modules until ``found()``.  A module that cannot import (a missing
    dependency) is skipped; if ``found()`` is still false at the end, the last such
    ``ImportError`` is raised (it probably is why)."""
    if found():
        return
    last_error: ImportError | None = None
    while _PENDING_MODULES:
        module_path = _PENDING_MODULES.pop(0)
        try:
            importlib.import_module(module_path)
        except ImportError as exc:
            logger.debug("adapter module %s not imported: %s", module_path, exc)
            last_error = exc
            continue
        if found():
            return
    if last_error is not None and not found():
        raise last_error


def import_all_pending() -> None:
    """Import every pending module (those that cannot import are skipped)."""
    while _PENDING_MODULES:
        module_path = _PENDING_MODULES.pop(0)
        try:
            importlib.import_module(module_path)
        except ImportError:
            logger.debug("adapter module %s not imported", module_path)
