"""Upstream LMCache 0.5.6's ``common_api``: every router of ``lmcache server``'s operator
routes (:mod:`lmcache.v1.multiprocess.server.operator_routes`, upstream's
``internal_api_server.common``) plus upstream's ``/periodic-threads`` routes, merged into one
``router``, so :class:`~upstream_056.http_api_registry.HTTPAPIRegistry`
mounts them with the other ``http_apis`` groups.  A new module there is picked up without
an edit here."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter

from lmcache.compat.upstream_056.http_apis import periodic_thread_api
from lmcache.compat.upstream_056.router_discovery import discover_api_routers
from lmcache.v1.multiprocess.server import operator_routes

__all__ = ["router"]

router = APIRouter()
for _common_router in discover_api_routers(
    Path(operator_routes.__file__).parent, operator_routes.__name__
):
    router.include_router(_common_router)
router.include_router(periodic_thread_api.router)
