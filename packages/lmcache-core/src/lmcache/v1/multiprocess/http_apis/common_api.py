"""Upstream LMCache 0.5.6's ``common_api``: every router of
:mod:`lmcache.v1.internal_api_server.common` merged into one ``router``, so
:class:`~lmcache.v1.multiprocess.http_api_registry.HTTPAPIRegistry` mounts them with the
other ``http_apis`` groups (``/env``, ``/loglevel``, ``/threads``, ``/periodic-threads``,
``/metrics``, ``/run_script``).  A new module there is picked up without an edit here."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter

from lmcache.v1.internal_api_server import common
from lmcache.v1.utils.router_discovery import discover_api_routers

__all__ = ["router"]

router = APIRouter()
for _common_router in discover_api_routers(Path(common.__file__).parent, common.__name__):
    router.include_router(_common_router)
