"""Upstream LMCache 0.5.6's configuration routes: ``GET /config`` and ``GET /config/adapters``.

``GET /config`` is one JSON object, indented for people to read, with one entry per
configuration.  An app that sets ``app.state.configs`` (a mapping of name to dataclass or
plain value, as upstream's server does) gets those; an app with only ``app.state.engine``
(our cache server) gets the server's own configuration
(:func:`~lmcache.v1.multiprocess.server.config_report.server_configs`: ``mp``, ``server``,
``storage_manager``).  Either way every secret is redacted (the admin token, storage
passwords, credentials in URLs; see :mod:`~lmcache.v1.multiprocess.server.config_report`).
503 ``{"error": "configs not initialized"}`` while the app has neither.

``GET /config/adapters`` lists the engine's L2 adapters (:mod:`.dependencies`): ``{"adapters":
[{"index", "type_name", "tier", "primary", "reconfigurable"}, ...]}``; 503 until there is
an engine.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from lmcache.compat.upstream_056.http_apis.dependencies import get_context
from lmcache.v1.multiprocess.server.config_report import redact_secrets, server_configs
from lmcache.v1.utils.json_utils import make_json_safe, safe_asdict

__all__ = ["IndentedJSONResponse", "router"]

router = APIRouter()


class IndentedJSONResponse(JSONResponse):
    """A JSON response rendered with a two-space indent (the document is read by people)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=2).encode()


def _config_document(configs: Mapping[str, Any]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for name, config in configs.items():
        if dataclasses.is_dataclass(config) and not isinstance(config, type):
            document[str(name)] = safe_asdict(config)
        else:
            document[str(name)] = make_json_safe(config)
    return document


@router.get("/config")
async def config(request: Request) -> Any:
    """Every configuration of the server, secrets redacted (see the module docstring)."""
    state = request.app.state
    configs = getattr(state, "configs", None)
    if configs is not None:
        document = _config_document(configs)
    else:
        engine = getattr(state, "engine", None)
        if engine is None:
            return JSONResponse({"error": "configs not initialized"}, status_code=503)
        document = server_configs(engine)
    return IndentedJSONResponse(redact_secrets(document))


@router.get("/config/adapters")
async def list_adapters(request: Request) -> dict[str, list[dict[str, Any]]]:
    """The engine's L2 adapters; ``primary`` is the first, ``reconfigurable`` whether it
    can be reconfigured at run time."""
    return get_context(request).adapters.list_adapters()
