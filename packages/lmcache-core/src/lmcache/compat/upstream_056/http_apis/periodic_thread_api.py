"""``GET /periodic-threads`` (summary and status of each registered periodic thread),
``GET /periodic-threads/{name}`` and ``GET /periodic-threads-health`` (unhealthy: a
running critical or high thread that has stopped making progress), over the per-process
:class:`~upstream_056.periodic_thread.PeriodicThreadRegistry`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from starlette.responses import JSONResponse, Response

from lmcache.compat.upstream_056.periodic_thread import PeriodicThreadRegistry, ThreadLevel

__all__ = ["router"]

router = APIRouter()


@router.get("/periodic-threads")
async def get_periodic_threads(
    level: str | None = Query(None, description="critical, high, medium or low"),
    running_only: bool = Query(False, description="Only running threads"),
    active_only: bool = Query(False, description="Only active threads"),
) -> Response:
    """The registry's summary and the status of each (filtered) thread."""
    registry = PeriodicThreadRegistry.get_instance()
    if level:
        try:
            threads = registry.get_by_level(ThreadLevel(level.lower()))
        except ValueError:
            valid = ", ".join(item.value for item in ThreadLevel)
            return JSONResponse(
                {"error": f"Invalid level: {level}. Valid values: {valid}"}, status_code=400
            )
    else:
        threads = registry.get_all()
    threads = [
        t
        for t in threads
        if (t.is_running or not running_only) and (t.is_active or not active_only)
    ]
    summary = registry.get_summary()
    return JSONResponse(
        {
            "summary": {
                key: summary[key]
                for key in ("total_count", "running_count", "active_count", "by_level")
            },
            "threads": [t.get_status() for t in threads],
        }
    )


@router.get("/periodic-threads/{thread_name}")
async def get_periodic_thread(thread_name: str) -> Response:
    """One thread's status; 404 for a name no thread registered."""
    thread = PeriodicThreadRegistry.get_instance().get(thread_name)
    if thread is None:
        return JSONResponse({"error": f"Thread not found: {thread_name}"}, status_code=404)
    return JSONResponse(thread.get_status())


@router.get("/periodic-threads-health")
async def get_periodic_threads_health() -> Response:
    """Healthy unless a running critical/high thread is no longer active."""
    registry = PeriodicThreadRegistry.get_instance()
    unhealthy: list[dict[str, Any]] = [
        {
            "name": t.name,
            "level": t.level.value,
            "last_run_ago": t.get_status().get("last_run_ago"),
            "interval": t.interval,
        }
        for level in (ThreadLevel.CRITICAL, ThreadLevel.HIGH)
        for t in registry.get_by_level(level)
        if t.is_running and not t.is_active
    ]
    return JSONResponse(
        {
            "healthy": not unhealthy,
            "unhealthy_count": len(unhealthy),
            "unhealthy_threads": unhealthy,
        }
    )
