"""Upstream LMCache 0.5.6's basic-info routes: ``GET /`` (static liveness), ``GET
/healthcheck``, ``GET /status`` and the version routes ``/version``, ``/lmc_version``,
``/commit_id``.

``/healthcheck`` and ``/status`` answer 503 until ``app.state.engine`` is set.  With an
engine, ``/healthcheck`` is 503 with the engine's ``health_problems()`` when there are any
(an engine without that method counts as healthy), and ``/status`` is the engine's
``report_status()`` (upstream's name) or else its ``status()`` document.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

import lmcache

__all__ = ["router"]

router = APIRouter()

# No build-time commit id is recorded in lmcache-core; upstream shows "NA" when it has none.
COMMIT_ID = "NA"


def _engine(request: Request) -> Any:
    return getattr(request.app.state, "engine", None)


@router.get("/")
async def root() -> dict[str, str]:
    """Liveness: answers without touching the engine."""
    return {"status": "ok", "service": "LMCache HTTP API"}


@router.get("/healthcheck")
async def healthcheck(request: Request) -> Any:
    """200 ``{"status": "healthy"}``, or 503 with why not (for liveness/readiness probes)."""
    engine = _engine(request)
    if engine is None:
        return JSONResponse(
            {"status": "unhealthy", "reason": "engine not initialized"}, status_code=503
        )
    health_problems = getattr(engine, "health_problems", None)
    problems: list[str] = list(health_problems()) if callable(health_problems) else []
    if problems:
        return JSONResponse({"status": "unhealthy", "problems": problems}, status_code=503)
    return {"status": "healthy"}


@router.get("/status")
async def status(request: Request) -> Any:
    """The engine's status document."""
    engine = _engine(request)
    if engine is None:
        return JSONResponse({"error": "engine not initialized"}, status_code=503)
    report = getattr(engine, "report_status", None)
    return report() if callable(report) else engine.status()


@router.get("/lmc_version")
async def lmc_version() -> str:
    return lmcache.__version__


@router.get("/commit_id")
async def commit_id() -> str:
    return COMMIT_ID


@router.get("/version")
async def version() -> str:
    """``<version>-<commit id>``, as upstream formats it."""
    return f"{lmcache.__version__}-{COMMIT_ID}"
