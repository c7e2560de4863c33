"""``GET /loglevel``: list loggers and their levels, read one, or set one.

``?logger_name=X`` reads X's level; ``?logger_name=X&level=DEBUG`` sets it (and its
handlers').  Reading and setting both need the admin token when the app has one (the
listing names every module of the process; setting changes it).  Only loggers the process
already has can be read or set: an unknown name is a 404 JSON answer and creates nothing
(``logging.getLogger`` would keep a logger per name asked about, forever).  A level must be
a standard level name (``DEBUG``, ``info``, ``WARNING``, ...); anything else is a 400
naming the accepted names.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from lmcache.v1.multiprocess.server.operator_routes.access import refuse_unless_authorized

__all__ = ["router"]

router = APIRouter()

_LEVELS = {
    name: logging.getLevelName(name)
    for name in ("CRITICAL", "FATAL", "ERROR", "WARNING", "WARN", "INFO", "DEBUG", "NOTSET")
}
_ROOT_NAMES = ("root", "")
_NAME_SHOWN_CHARS = 200


def _all_levels() -> str:
    lines = ["=== Loggers and Levels ==="]
    for name, entry in sorted(logging.Logger.manager.loggerDict.items()):
        if isinstance(entry, logging.Logger):
            lines.append(f"{name}: {logging.getLevelName(entry.level)}")
    return "\n".join(lines) + "\n"


def _known(logger_name: str) -> logging.Logger | logging.PlaceHolder | None:
    """The process's logger of that name (a placeholder: only its descendants exist), or
    None; never creates one."""
    if logger_name in _ROOT_NAMES:
        return logging.getLogger()
    return logging.Logger.manager.loggerDict.get(logger_name)


def _unknown(logger_name: str) -> Response:
    shown = logger_name[:_NAME_SHOWN_CHARS]
    return JSONResponse(
        {
            "error": "not_found",
            "message": f"no logger named {shown!r} in this process (GET /loglevel lists them)",
        },
        status_code=404,
    )


def _read_level(logger_name: str) -> Response:
    known = _known(logger_name)
    if known is None:
        return _unknown(logger_name)
    # A placeholder's logger would start at NOTSET (it inherits its parent's level).
    level = known.level if isinstance(known, logging.Logger) else logging.NOTSET
    return PlainTextResponse(f"{logger_name}: {logging.getLevelName(level)}")


def _set_level(logger_name: str, level: str) -> Response:
    value = _LEVELS.get(level.upper())
    if value is None:
        return PlainTextResponse(
            f"Invalid log level: {level} (one of {', '.join(_LEVELS)})", status_code=400
        )
    if _known(logger_name) is None:
        return _unknown(logger_name)
    # Known (or a placeholder of known descendants), so this adds at most the loggers the
    # process's own names imply.
    target = logging.getLogger(logger_name or None)
    target.setLevel(value)
    for handler in target.handlers:
        handler.setLevel(value)
    return PlainTextResponse(f"Set {logger_name} level to {level.upper()} (including all handlers)")


@router.get("/loglevel")
async def get_or_set_log_level(
    request: Request, logger_name: str | None = None, level: str | None = None
) -> Response:
    """No parameters: every logger; ``logger_name``: its level; both: set it."""
    refusal = refuse_unless_authorized(request)
    if refusal is not None:
        return refusal
    if level:
        if not logger_name:
            return PlainTextResponse("level needs a logger_name", status_code=400)
        return _set_level(logger_name, level)
    if logger_name:
        return _read_level(logger_name)
    return PlainTextResponse(_all_levels())
