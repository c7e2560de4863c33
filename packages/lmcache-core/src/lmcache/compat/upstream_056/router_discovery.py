"""Upstream LMCache 0.5.6's ``lmcache.v1.utils.router_discovery``: collect the FastAPI
routers of every ``*_api`` module in a package directory, so adding an HTTP API is adding
a module (see :class:`upstream_056.http_api_registry.HTTPAPIRegistry`)."""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Iterable
from pathlib import Path

from fastapi import APIRouter

logger = logging.getLogger(__name__)

__all__ = ["discover_api_routers"]


def discover_api_routers(
    search_path: Path,
    package_name: str,
    suffix: str = "_api",
    exclude: Iterable[str] | None = None,
) -> list[APIRouter]:
    """The ``router`` of each module in ``search_path`` whose name ends with ``suffix``.

    Args:
        search_path: the package's directory.
        package_name: its importable dotted name (the modules are imported as
            ``<package_name>.<module>``).
        suffix: only module names ending with it are imported.
        exclude: module names (without the package) to leave out.

    Returns:
        The routers, in module-name order.  A module without a ``router`` attribute, or
        whose ``router`` is not an :class:`~fastapi.APIRouter`, contributes nothing.

    Raises:
        Whatever importing a matching module raises: a broken API module is a bug to
        see at startup, not a route that silently goes missing.
    """
    skipped = frozenset(exclude or ())
    found = sorted(
        info.name for info in pkgutil.iter_modules([str(search_path)]) if info.name.endswith(suffix)
    )
    routers: list[APIRouter] = []
    for name in found:
        if name in skipped:
            logger.info("API module %s excluded", name)
            continue
        module = importlib.import_module(f"{package_name}.{name}")
        router = getattr(module, "router", None)
        if isinstance(router, APIRouter):
            routers.append(router)
            logger.debug("API module %s: router found", name)
        elif router is not None:
            logger.warning(
                "API module %s: 'router' is a %s, not an APIRouter; skipped",
                name,
                type(router).__name__,
            )
    return routers
