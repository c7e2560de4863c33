"""Upstream LMCache 0.5.6's cache route group, reduced to ``POST /cache/clear``, plus the
block checksum computation upstream keeps in this module (:mod:`.block_checksums`).

Answered by :func:`~lmcache.v1.multiprocess.server.http_frontend.clear_cache_reply`, the
same code as ``lmcache server``'s own route, so the same guards apply: clearing is refused
(403) unless ``app.state.allow_cache_clear`` is true (the ``--enable-http-cache-clear``
switch), and needs ``Authorization: Bearer <token>`` when the engine has an admin token.
The body is empty or ``{"force": <bool>}`` (upstream's ``tier`` field is not accepted: the
clear always covers every tier).  503 until ``app.state.engine`` is set.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from lmcache.compat.upstream_056.http_apis.block_checksums import (
    block_axes_for_formats,
    block_axis_for_format,
    compute_block_checksums,
)
from lmcache.v1.multiprocess.server.http_frontend import clear_cache_reply

__all__ = [
    "block_axes_for_formats",
    "block_axis_for_format",
    "compute_block_checksums",
    "router",
]

# Upstream 0.5.6's private name, which its unit tests import.
_compute_block_checksums = compute_block_checksums

router = APIRouter()


@router.post("/cache/clear")
async def clear_cache(request: Request, force: bool = False) -> Any:
    """Remove every cached object (``force``: the pinned ones too)."""
    state = request.app.state
    engine = getattr(state, "engine", None)
    if engine is None:
        return JSONResponse({"error": "engine not initialized"}, status_code=503)
    allowed = bool(getattr(state, "allow_cache_clear", False))
    return await clear_cache_reply(engine, request, allowed, force)
