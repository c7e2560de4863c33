"""The HTTP frontend of ``lmcache server`` (FastAPI on uvicorn, on its own thread).

Routes (upstream's names): ``GET /`` (route list), ``GET /healthcheck`` (200 healthy; 200
degraded, with why, while a remote tier is skipped behind its circuit breaker; 503 with the
problems otherwise), ``GET /status`` (JSON), ``GET /config`` (the server's
configuration, secrets redacted, indented JSON), ``GET /config/adapters`` (its L2 tiers),
``GET /metrics`` (Prometheus text),
``POST /cache/clear`` (only with ``--enable-http-cache-clear``; with an admin token
configured it needs ``Authorization: Bearer <token>``).  Every error of these is a JSON
object ``{"error": <code>, "message": <text>}`` with a 4xx/5xx status.

The operator routes of :mod:`lmcache.v1.multiprocess.server.operator_routes` are mounted too:
``GET /env`` (secrets redacted), ``GET /loglevel`` (reading and setting levels of existing
loggers), ``GET /threads``, ``GET /periodic-threads[/{name}]``, ``GET
/periodic-threads-health``, ``POST /run_script`` (only with ``--run-script-api-enabled``),
the tenant quotas ``GET /quota`` and ``GET|PUT|DELETE /quota/{cache_salt}``, and
upstream's runtime reconfiguration routes (``/reconfigure/...``), which answer 501 with
the reason (:mod:`.operator_routes.reconfigure_api`); with an admin token configured,
``/env``, ``/loglevel``, ``/run_script`` and ``/quota`` need it as well.

Connections are limited (:mod:`.http_limits`): a request head must arrive within
``--http-header-timeout-s``, its body within ``--http-body-timeout-s``, and at most
``--http-max-connections`` are open at once.

The socket is bound before the thread starts, so a busy port is reported synchronously
(:class:`OSError`) rather than by uvicorn exiting its thread.  ``--prometheus-port`` serves
the same registry with ``prometheus_client``'s own HTTP server.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

import msgspec
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from lmcache.v1.multiprocess.server.config_report import list_l2_adapters, server_configs
from lmcache.v1.multiprocess.server.extensions import extension_http_routers
from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.server.http_limits import HTTPLimits, HTTPLimitStats, limited_protocol
from lmcache.v1.multiprocess.server.metrics import CONTENT_TYPE
from lmcache.v1.multiprocess.server.operator_routes import (
    env_api,
    loglevel_api,
    quota_api,
    reconfigure_api,
    run_script_api,
    thread_api,
)
from lmcache.v1.multiprocess.wire.security import TokenCheck, http_reach, warn_if_exposed

logger = logging.getLogger(__name__)

ROUTES = (
    "/",
    "/healthcheck",
    "/status",
    "/config",
    "/config/adapters",
    "/metrics",
    "/cache/clear",
    "/env",
    "/loglevel",
    "/threads",
    "/periodic-threads",
    "/periodic-threads-health",
    "/run_script",
    "/reconfigure/{backend}/l2/status",
    "/reconfigure/{backend}/l2/{operation}",
    "/reconfigure/dax/l1/{status,add,remove}",
    "/quota",
    "/quota/{cache_salt}",
)
_OPERATOR_ROUTERS = (
    env_api.router,
    loglevel_api.router,
    thread_api.router,
    run_script_api.router,
    reconfigure_api.router,
    quota_api.router,
)
_STOP_TIMEOUT_S = 5.0
# {"force": true} is 15 bytes; the cap keeps a large body from being read at all.
MAX_CLEAR_BODY_BYTES = 4096


def _error(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status, headers=headers)


def _bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive)."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def _route_label(request: Request) -> str:
    """``HTTP <route>``: the matched route's path template (a short fixed set, so each
    route gets its own refusal-log window), else the request path."""
    route = request.scope.get("route")
    path = getattr(route, "path", None)
    return f"HTTP {path if isinstance(path, str) else request.url.path}"


# Open with --http-read-token-file too: probes and the route list carry no token.
OPEN_ROUTES = frozenset({"/", "/healthcheck"})


def _read_refused(engine: MPCacheServer, request: Request) -> JSONResponse | None:
    """401 unless the request carries the read token or the admin token (when a read
    token is configured and the route is not open)."""
    security = engine.settings.http
    if security.read_token is None or request.url.path in OPEN_ROUTES:
        return None
    presented = _bearer_token(request.headers.get("authorization"))
    if security.check_read_token(presented) is TokenCheck.OK:
        return None
    admin = engine.settings.admin
    if admin.token is not None and admin.check_token(presented) is TokenCheck.OK:
        return None
    engine.note_refusal(f"HTTP {request.url.path}", "missing or wrong read token")
    return _error(
        401,
        "unauthorized",
        "this server has an HTTP read token: send it as 'Authorization: Bearer <token>'",
        {"WWW-Authenticate": 'Bearer realm="lmcache"'},
    )


def _unauthorized(engine: MPCacheServer, request: Request) -> JSONResponse | None:
    """A 401 reply unless the request carries the admin token (when one is configured)."""
    check = engine.check_admin_token(
        _bearer_token(request.headers.get("authorization")), _route_label(request)
    )
    if check is TokenCheck.OK:
        return None
    if check is TokenCheck.MISSING:
        challenge, message = (
            'Bearer realm="lmcache"',
            "this server has an admin token: send it as 'Authorization: Bearer <token>'",
        )
    else:
        challenge, message = (
            'Bearer realm="lmcache", error="invalid_token"',
            "the admin token in the Authorization header is wrong",
        )
    return _error(401, "unauthorized", message, {"WWW-Authenticate": challenge})


class ClearRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The body of ``POST /cache/clear`` (empty is ``{}``)."""

    force: bool = False


async def _read_capped(request: Request, limit: int) -> bytes | None:
    """The request body, or None once it exceeds ``limit`` bytes (the rest is not read)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


async def _clear_request(request: Request) -> ClearRequest | JSONResponse:
    """The parsed body, or the 4xx reply for it.  msgspec validates while it parses, so
    deep nesting, wrong types, invalid UTF-8 and out-of-range numbers are all one typed
    decode error (``json.loads`` would raise RecursionError on deep nesting)."""
    try:
        body = await _read_capped(request, MAX_CLEAR_BODY_BYTES)
    except ClientDisconnect:
        return _error(400, "bad_request", "the client went away before sending the body")
    if body is None:
        return _error(
            413,
            "payload_too_large",
            f'the body may hold at most {MAX_CLEAR_BODY_BYTES} bytes, e.g. {{"force": true}}',
        )
    if not body.strip():
        return ClearRequest()
    try:
        return msgspec.json.decode(body, type=ClearRequest)
    except msgspec.ValidationError as exc:
        return _error(400, "bad_request", f'the body may only hold {{"force": <bool>}}: {exc}')
    except msgspec.DecodeError as exc:
        return _error(
            400, "bad_request", f'the body must be UTF-8 JSON, e.g. {{"force": true}}: {exc}'
        )


async def clear_cache_reply(
    engine: MPCacheServer, request: Request, allow_cache_clear: bool, force: bool
) -> Any:
    """The ``POST /cache/clear`` answer: 403 unless enabled, 401 without the admin token
    (when one is configured), 400 for a body other than ``{"force": <bool>}`` (413 past
    :data:`MAX_CLEAR_BODY_BYTES`); otherwise removes every L1 object (``force`` also the
    pinned ones).  Shared with the upstream-shaped routes in
    :mod:`lmcache.compat.upstream_056.http_apis`."""
    if not allow_cache_clear:
        return _error(
            403, "forbidden", "cache clearing over HTTP is off (--enable-http-cache-clear)"
        )
    refused = _unauthorized(engine, request)
    if refused is not None:
        return refused
    parsed = await _clear_request(request)
    if isinstance(parsed, JSONResponse):
        return parsed
    force = force or parsed.force
    removed = engine.remove_all(force=force)
    logger.info("HTTP /cache/clear removed %d objects (force=%s)", removed, force)
    return {"status": "ok", "removed": removed, "force": force}


def build_app(
    engine: MPCacheServer,
    is_serving: Callable[[], bool] = lambda: True,
    allow_cache_clear: bool = False,
) -> FastAPI:
    """The FastAPI application (no server); tests may drive it in-process."""
    app = FastAPI(title="LMCache MP server", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> Any:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> Any:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
            for e in exc.errors()
        )
        return _error(422, "bad_request", problems or "invalid request")

    @app.middleware("http")
    async def read_token(request: Request, call_next: Any) -> Any:
        refused = _read_refused(engine, request)
        return refused if refused is not None else await call_next(request)

    @app.get("/")
    def index() -> dict[str, Any]:
        return {"service": "lmcache-mp-server", "routes": list(ROUTES)}

    @app.get("/healthcheck")
    def healthcheck() -> Any:
        problems = [] if is_serving() else ["the MP server is shutting down"]
        problems += engine.health_problems()
        if problems:
            return JSONResponse({"status": "unhealthy", "problems": problems}, status_code=503)
        degraded = engine.health_degraded()
        if degraded:
            # Still serving (a restart would not bring Redis back): 200, for the probes.
            return {"status": "degraded", "problems": degraded}
        return {"status": "healthy"}

    @app.get("/status")
    def status() -> dict[str, Any]:
        return engine.status()

    @app.get("/config")
    def config() -> Any:
        return Response(
            json.dumps(server_configs(engine), ensure_ascii=False, indent=2),
            media_type="application/json",
        )

    @app.get("/config/adapters")
    def config_adapters() -> dict[str, Any]:
        return {"adapters": list_l2_adapters(engine.storage, engine.server_config)}

    @app.get("/metrics")
    def metrics() -> Any:
        if engine.metrics is None:
            return _error(404, "metrics_disabled", "metrics are off (--disable-metrics)")
        return Response(engine.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.post("/cache/clear")
    async def cache_clear(request: Request, force: bool = False) -> Any:
        return await clear_cache_reply(engine, request, allow_cache_clear, force)

    # What the operator routes read (operator_routes.access).
    app.state.configs = {} if engine.server_config is None else {"mp": engine.server_config}
    app.state.authorize = lambda request: _unauthorized(engine, request)
    app.state.storage_manager = engine.storage
    for router in (*_OPERATOR_ROUTERS, *extension_http_routers()):
        app.include_router(router)
    return app


def _run_script_enabled(engine: MPCacheServer) -> bool:
    return bool(engine.server_config and engine.server_config.run_script_api_enabled)


class HTTPFrontend:
    """Runs :func:`build_app` with uvicorn on a daemon thread."""

    def __init__(
        self,
        engine: MPCacheServer,
        host: str,
        port: int,
        is_serving: Callable[[], bool] = lambda: True,
        allow_cache_clear: bool = False,
        limits: HTTPLimits | None = None,
    ) -> None:
        limits = limits or HTTPLimits()
        limits.warn_if_near_the_descriptor_limit()
        self._protocol = limited_protocol(limits)
        self._sock = socket.socket(
            socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM
        )
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError:
            self._sock.close()
            raise
        self.host, self.port = host, int(self._sock.getsockname()[1])
        warn_if_exposed(
            "the HTTP frontend",
            host,
            self.port,
            http_reach(engine.settings.admin, allow_cache_clear, _run_script_enabled(engine)),
        )
        if _run_script_enabled(engine):
            logger.warning(
                "POST /run_script is enabled on %s:%d: it runs uploaded Python inside this "
                "server%s",
                host,
                self.port,
                ""
                if engine.settings.admin.token
                # A non-loopback host without a token was refused at start-up.
                else " for any local process (no admin token is configured)",
            )
        self._tls = engine.settings.http.tls
        config = uvicorn.Config(
            build_app(engine, is_serving, allow_cache_clear),
            ssl_certfile=engine.settings.http.tls_certfile,
            ssl_keyfile=engine.settings.http.tls_keyfile,
            http=self._protocol,  # h11 with header/body timeouts and a connection cap
            log_level="warning",
            access_log=False,
            log_config=None,  # uvicorn's dictConfig would close the process's handlers
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="lmc-http", daemon=True
        )

    @property
    def url(self) -> str:
        return f"{'https' if self._tls else 'http'}://{self.host}:{self.port}"

    @property
    def limit_stats(self) -> HTTPLimitStats:
        """How many connections the header/body timeouts and the cap have closed."""
        return self._protocol.stats

    @property
    def open_connections(self) -> int:
        return len(self._server.server_state.connections)

    def start(self) -> None:
        self._thread.start()
        logger.info("HTTP frontend on %s", self.url)

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(_STOP_TIMEOUT_S)
        self._sock.close()


class PrometheusEndpoint:
    """``prometheus_client``'s HTTP server over one registry (``--prometheus-port``)."""

    def __init__(
        self,
        registry: Any,
        host: str,
        port: int,
        certfile: str | None = None,
        keyfile: str | None = None,
    ) -> None:
        """``certfile``/``keyfile``: serve HTTPS (--http-tls-certfile/--http-tls-keyfile)."""
        from prometheus_client import start_http_server

        self._server, self._thread = start_http_server(
            port, addr=host, registry=registry, certfile=certfile, keyfile=keyfile
        )
        self.port = int(self._server.server_address[1])
        warn_if_exposed("the Prometheus endpoint", host, self.port, "read the metrics")

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(_STOP_TIMEOUT_S)
