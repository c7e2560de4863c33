"""``POST /run_script``: run an uploaded Python script inside the process (opt-in).

It executes caller-supplied code, so it is off unless the deployment enables it
(``run_script_api_enabled``: ``lmcache server --run-script-api-enabled``); while off it
answers 404 saying so.  When the app has an admin token the request must carry it.  The
script is the multipart file field ``script`` (at most :data:`MAX_SCRIPT_BYTES`); it sees
``app`` (the FastAPI application, whose ``state`` holds the server), a few builtins, and
may import only the modules of ``script_allowed_imports``.  Its ``result`` variable is the
reply text (default ``Script executed successfully``); an exception (``sys.exit()``
included) is a 500 with its message.  A body that holds no script (not multipart, no
``script`` file, malformed) or a script that does not compile is a 400 JSON
``{"error": "bad_request", "message": ...}`` (413 past the size limit).  The restricted
builtins are not a security boundary: enable it only where every caller is trusted.  Each
run is logged at WARNING level, for the audit trail.
"""

from __future__ import annotations

import importlib
import logging
from types import CodeType, ModuleType
from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from lmcache.v1.multiprocess.server.operator_routes.access import refuse_unless_authorized, setting

__all__ = ["MAX_SCRIPT_BYTES", "router"]

logger = logging.getLogger(__name__)

router = APIRouter()

MAX_SCRIPT_BYTES = 1 << 20
_MULTIPART = "multipart/form-data"
_NO_SCRIPT = "No script file provided: send it as the multipart/form-data file field 'script'"
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


class _ScriptDoesNotCompile(Exception):
    """The uploaded bytes are not a Python program (the caller's error: a 400)."""


def _compile(source: bytes) -> CodeType:
    try:
        return compile(source, "<run_script>", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise _ScriptDoesNotCompile(f"{type(exc).__name__}: {exc}") from None


def _execute(source: bytes, app: Any, allowed: dict[str, ModuleType]) -> str:
    def restricted_import(name: str, *_args: Any, **_kwargs: Any) -> ModuleType:
        if name in allowed:
            return allowed[name]
        raise ImportError(f"Import of '{name}' is not allowed")

    code = _compile(source)
    script_globals: dict[str, Any] = {
        "__builtins__": {**_SAFE_BUILTINS, "__import__": restricted_import},
        "app": app,
    }
    script_locals: dict[str, Any] = {}
    try:
        exec(code, script_globals, script_locals)
    except Exception:
        raise
    except BaseException as exc:
        # sys.exit() or a KeyboardInterrupt raised by the script must end the script, not
        # the request machinery (or the server's HTTP thread) around it.
        raise RuntimeError(f"the script raised {type(exc).__name__}({exc})") from None
    return str(script_locals.get("result", DEFAULT_RESULT))


def _bad_request(message: str, status: int = 400) -> Response:
    code = "payload_too_large" if status == 413 else "bad_request"
    return JSONResponse({"error": code, "message": message}, status_code=status)


async def _uploaded_script(request: Request) -> bytes | Response:
    """The ``script`` file field's bytes, or the 4xx reply for a body that holds none."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != _MULTIPART:
        return _bad_request(_NO_SCRIPT)
    try:
        form = await request.form()
        upload = form.get("script")
        if upload is None or isinstance(upload, str):
            return _bad_request(_NO_SCRIPT)
        source = await upload.read(MAX_SCRIPT_BYTES + 1)
    except (HTTPException, MultiPartException, ClientDisconnect, ValueError) as exc:
        # Starlette reports a malformed multipart body as an HTTPException(400) inside an
        # app, as MultiPartException outside one.
        detail = getattr(exc, "detail", None) or getattr(exc, "message", None) or exc
        return _bad_request(f"malformed multipart body ({detail}); {_NO_SCRIPT}")
    if len(source) > MAX_SCRIPT_BYTES:
        return _bad_request(f"script larger than {MAX_SCRIPT_BYTES} bytes", status=413)
    return bytes(source)


@router.post("/run_script")
async def run_script(request: Request) -> Response:
    """Run the uploaded ``script`` (see the module docstring)."""
    if not bool(setting(request, "run_script_api_enabled", False)):
        return PlainTextResponse(_DISABLED, status_code=404)
    refusal = refuse_unless_authorized(request)
    if refusal is not None:
        return refusal
    source = await _uploaded_script(request)
    if isinstance(source, Response):
        return source
    client = request.client.host if request.client else "unknown"
    logger.warning("run_script: executing %d bytes sent by %s", len(source), client)
    allowed = _allowed_modules(list(setting(request, "script_allowed_imports", None) or []))
    try:
        text = await run_in_threadpool(_execute, source, request.app, allowed)
    except _ScriptDoesNotCompile as exc:
        return _bad_request(f"the script does not compile: {exc}")
    except Exception as exc:  # the script's own error is the reply, not a server fault
        logger.warning("run_script: the script raised %s: %s", type(exc).__name__, exc)
        return PlainTextResponse(f"Error executing script: {exc}", status_code=500)
    return PlainTextResponse(text)
