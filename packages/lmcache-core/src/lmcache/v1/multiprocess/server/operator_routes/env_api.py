"""``GET /env``: the process environment as indented JSON, secrets redacted.

Unlike upstream's route, values are passed through :func:`lmcache.v1.utils.secrets.redact_secrets`
(``*_TOKEN``, ``*_PASSWORD``, URL passwords, ...) and, when the app has an admin token,
the request must carry it: the environment describes the deployment.
"""

from __future__ import annotations

import json
import os

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from lmcache.v1.multiprocess.server.operator_routes.access import refuse_unless_authorized
from lmcache.v1.utils.secrets import redact_secrets

__all__ = ["router"]

router = APIRouter()


@router.get("/env")
async def get_env(request: Request) -> Response:
    """Every environment variable of the process (secret values redacted)."""
    refusal = refuse_unless_authorized(request)
    if refusal is not None:
        return refusal
    document = redact_secrets(dict(os.environ))
    return PlainTextResponse(json.dumps(document, indent=2, sort_keys=True))
