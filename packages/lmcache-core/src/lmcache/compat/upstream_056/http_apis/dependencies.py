"""Upstream LMCache 0.5.6's ``lmcache.v1.multiprocess.http_apis.dependencies``: the per-app
context the HTTP routes work on, and :func:`get_context`, which finds it on a request.

Upstream's server builds the context once its engine is up and puts it on
``app.state.context``; a request that comes before that is answered 503.  Here an app that
only has ``app.state.engine`` (how :class:`~lmcache.v1.multiprocess.http_api_registry.
HTTPAPIRegistry` apps are wired) gets a context built from that engine.

Upstream's context carries its object and prefetch services; this server has neither, so
ours carries the engine and the L2 adapter listing (:class:`L2AdapterListing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import HTTPException, Request

from lmcache.v1.multiprocess.server.config_report import list_l2_adapters

__all__ = ["L2AdapterListing", "MPHTTPContext", "build_context", "get_context"]


class L2AdapterListing:
    """The engine's L2 adapters, as upstream's ``GET /config/adapters`` lists them.

    Two kinds of engine are understood: ours (an
    :class:`~lmcache.v1.multiprocess.server.handler.MPCacheServer`, whose ``storage`` holds
    the tiers) and one with upstream's storage manager API (``storage_manager`` with
    ``l2_adapters()`` and ``reconfigurable_l2_backends()``, which upstream's tests stub).
    """

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def list_adapters(self) -> dict[str, list[dict[str, Any]]]:
        """``{"adapters": [{"index", "type_name", "tier", "primary", "reconfigurable"},
        ...]}`` (ours add ``name``); empty when there is no L2 tier."""
        manager = getattr(self._engine, "storage_manager", None)
        if manager is not None and callable(getattr(manager, "l2_adapters", None)):
            return {"adapters": _upstream_listing(manager)}
        storage = self._engine.storage
        server_config = getattr(self._engine, "server_config", None)
        return {"adapters": list_l2_adapters(storage, server_config)}


def _upstream_listing(manager: Any) -> list[dict[str, Any]]:
    reconfigurable = set(manager.reconfigurable_l2_backends())
    entries = []
    for index, (descriptor, _adapter) in enumerate(manager.l2_adapters()):
        type_name = descriptor.type_name
        entries.append(
            {
                "index": index,
                "type_name": type_name,
                "tier": "l2",
                "primary": index == 0,
                "reconfigurable": type_name in reconfigurable,
            }
        )
    return entries


@dataclass
class MPHTTPContext:
    """What the HTTP routes work on.

    Attributes:
        engine: the cache server (an ``MPCacheServer``).
        adapters: its L2 adapter listing.
    """

    engine: Any
    adapters: L2AdapterListing


def build_context(engine: Any) -> MPHTTPContext:
    """The context of ``engine`` (to be put on ``app.state.context`` once it is up)."""
    return MPHTTPContext(engine=engine, adapters=L2AdapterListing(engine))


def get_context(request: Request) -> MPHTTPContext:
    """``app.state.context``, else a context over ``app.state.engine``.

    Raises:
        HTTPException: 503 when the app has neither yet (a request during start-up).
    """
    state = request.app.state
    context = getattr(state, "context", None)
    if context is not None:
        return context  # type: ignore[no-any-return]
    engine = getattr(state, "engine", None)
    if engine is None:
        raise HTTPException(
            status_code=HTTPStatus.SERVICE_UNAVAILABLE, detail="server not initialized"
        )
    return build_context(engine)
