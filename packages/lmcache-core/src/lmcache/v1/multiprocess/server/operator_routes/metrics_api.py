"""``GET /metrics``: Prometheus text exposition.

The app's own registry when it sets ``app.state.metrics_exposition`` (``lmcache server``
does: its metrics live in a per-server registry), else ``prometheus_client``'s default
registry.  Upstream's ``POST /metrics/reset`` (which resets its in-process observability
module) is not provided: counters here only grow, as Prometheus expects.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

__all__ = ["router"]

router = APIRouter()


@router.get("/metrics")
async def get_metrics(request: Request) -> Response:
    """The metrics, in Prometheus' text format."""
    exposition = getattr(request.app.state, "metrics_exposition", None)
    if exposition is not None:
        body, content_type = exposition()
        return Response(body, media_type=content_type)
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
