"""``POST /run_script``: run an uploaded Python script inside the process (opt-in).

It executes caller-supplied code, so it is off unless the deployment enables it
(``run_script_api_enabled``: ``lmcache server --run-script-api-enabled``); while off it
answers 404 saying so.  When the app has an admin token the request must carry it.  The
script is the multipart file field ``script`` (at most :data:`MAX_SCRIPT_BYTES`); it sees
``app`` (the FastAPI application, whose ``state`` holds the server), a few builtins, and
may import only the modules of ``script_allowed_imports``.  Its ``result`` variable is the
reply text (default ``Script executed successfully``); an exception (``sys.exit()``
included) is a 500 with its message.  The restricted builtins are not a security
boundary: enable it only where every caller is trusted.  Each run is logged at WARNING
level, for the audit trail.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType
from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from lmcache.v1.multiprocess.server.operator_routes.access import refuse_unless_authorized, setting

__all__ = ["MAX_SCRIPT_BYTES", "router"]

logger = logging.getLogger(__name__)

router = APIRouter()

MAX_SCRIPT_BYTES = 1 << 20
DEFAULT_RESULT = "Script executed successfully"
_DISABLED = (
    "The /run_script API is disabled. It executes caller-supplied code in-process, so it "
    "is off by default; enable it explicitly with run_script_api_enabled "
    "(--run-script-api-enabled on lmcache server) and only on a trusted network."
)
_SAFE_BUILTINS: dict[str, Any] = {
    "print": print,
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "len": len,
    "list": list,
    "dict": dict,
    "tuple": tuple,
    "set": set,
}


def _allowed_modules(names: list[str]) -> dict[str, ModuleType]:
    modules: dict[str, ModuleType] = {}
    for name in names:
        try:
            modules[name] = importlib.import_module(name)
        except ImportError as exc:
            logger.warning("run_script: allowed module %s cannot be imported (%s)", name, exc)
    return modules


def _execute(source: bytes, app: Any, allowed: dict[str, ModuleType]) -> str:
    def restricted_import(name: str, *_args: Any, **_kwargs: Any) -> ModuleType:
        if name in allowed:
            return allowed[name]
        raise ImportError(f"Import of '{name}' is not allowed")

    script_globals: dict[str, Any] = {
        "__builtins__": {**_SAFE_BUILTINS, "__import__": restricted_import},
        "app": app,
    }
    script_locals: dict[str, Any] = {}
    try:
        exec(compile(source, "<run_script>", "exec"), script_globals, script_locals)
    except Exception:
        raise
    except BaseException as exc:
        # sys.exit() or a KeyboardInterrupt raised by the script must end the script, not
        # the request machinery (or the server's HTTP thread) around it.
        raise RuntimeError(f"the script raised {type(exc).__name__}({exc})") from None
    return str(script_locals.get("result", DEFAULT_RESULT))


@router.post("/run_script")
async def run_script(request: Request) -> Response:
    """Run the uploaded ``script`` (see the module docstring)."""
    if not bool(setting(request, "run_script_api_enabled", False)):
        return PlainTextResponse(_DISABLED, status_code=404)
    refusal = refuse_unless_authorized(request)
    if refusal is not None:
        return refusal
    form = await request.form()
    upload = form.get("script")
    if upload is None or isinstance(upload, str):
        return PlainTextResponse("No script file provided", status_code=400)
    source = await upload.read(MAX_SCRIPT_BYTES + 1)
    if len(source) > MAX_SCRIPT_BYTES:
        return PlainTextResponse(f"script larger than {MAX_SCRIPT_BYTES} bytes", status_code=413)
    client = request.client.host if request.client else "unknown"
    logger.warning("run_script: executing %d bytes sent by %s", len(source), client)
    allowed = _allowed_modules(list(setting(request, "script_allowed_imports", None) or []))
    try:
        text = await run_in_threadpool(_execute, source, request.app, allowed)
    except Exception as exc:  # the script's own error is the reply, not a server fault
        logger.warning("run_script: the script raised %s: %s", type(exc).__name__, exc)
        return PlainTextResponse(f"Error executing script: {exc}", status_code=500)
    return PlainTextResponse(text)
