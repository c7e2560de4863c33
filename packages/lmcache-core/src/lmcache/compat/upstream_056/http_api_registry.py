"""Upstream LMCache 0.5.6's ``lmcache.v1.multiprocess.http_api_registry``: mount every
route group of :mod:`upstream_056.http_apis` (each ``*_api`` module's
``router``) on a FastAPI application.

Usage::

    app = FastAPI()
    app.state.engine = server            # an MPCacheServer; routes answer 503 until set
    HTTPAPIRegistry(app).register_all_apis()
"""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import APIRouter, FastAPI

from lmcache.compat.upstream_056.router_discovery import discover_api_routers

logger = logging.getLogger(__name__)

__all__ = ["HTTPAPIRegistry"]

_APIS_PACKAGE = "http_apis"


class HTTPAPIRegistry:
    """Collects the ``http_apis`` routers into :attr:`router` and includes it in
    :attr:`app`."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.router = APIRouter()

    def register_all_apis(self) -> None:
        """Mount every ``*_api`` module's router; a missing ``http_apis`` directory (a
        trimmed install) is logged and mounts nothing."""
        apis_path = Path(__file__).with_name(_APIS_PACKAGE)
        if not apis_path.is_dir():
            logger.warning("%s not found: no HTTP APIs registered", apis_path)
            return
        for router in discover_api_routers(apis_path, f"{__package__}.{_APIS_PACKAGE}"):
            self.router.include_router(router)
        self.app.include_router(self.router)
