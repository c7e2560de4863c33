"""``GET /loglevel``: list loggers and their levels, read one, or set one.

``?logger_name=X`` reads X's level; ``?logger_name=X&level=DEBUG`` sets it (and its
handlers'), which changes the process, so it needs the admin token when the app has one.
A level must be a standard level name (``DEBUG``, ``info``, ``WARNING``, ...); anything
else is a 400 naming the accepted names.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from lmcache.v1.multiprocess.server.operator_routes.access import refuse_unless_authorized

__all__ = ["router"]

router = APIRouter()

_LEVELS = {
    name: logging.getLevelName(name)
    for name in ("CRITICAL", "FATAL", "ERROR", "WARNING", "WARN", "INFO", "DEBUG", "NOTSET")
}


def _all_levels() -> str:
    lines = ["=== Loggers and Levels ==="]
    for name, entry in sorted(logging.Logger.manager.loggerDict.items()):
        if isinstance(entry, logging.Logger):
            lines.append(f"{name}: {logging.getLevelName(entry.level)}")
    return "\n".join(lines) + "\n"


def _set_level(logger_name: str, level: str) -> Response:
    value = _LEVELS.get(level.upper())
    if value is None:
        return PlainTextResponse(
            f"Invalid log level: {level} (one of {', '.join(_LEVELS)})", status_code=400
        )
    target = logging.getLogger(logger_name)
    target.setLevel(value)
    for handler in target.handlers:
        handler.setLevel(value)
    return PlainTextResponse(f"Set {logger_name} level to {level.upper()} (including all handlers)")


@router.get("/loglevel")
async def get_or_set_log_level(
    request: Request, logger_name: str | None = None, level: str | None = None
) -> Response:
    """No parameters: every logger; ``logger_name``: its level; both: set it."""
    if level:
        if not logger_name:
            return PlainTextResponse("level needs a logger_name", status_code=400)
        refusal = refuse_unless_authorized(request)
        return refusal if refusal is not None else _set_level(logger_name, level)
    if logger_name:
        current = logging.getLevelName(logging.getLogger(logger_name).level)
        return PlainTextResponse(f"{logger_name}: {current}")
    return PlainTextResponse(_all_levels())
