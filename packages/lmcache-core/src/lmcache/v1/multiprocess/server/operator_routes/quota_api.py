"""Per-tenant byte quotas (``cache_salt``): upstream's ``/quota`` routes.

* ``PUT /quota/{cache_salt}`` with ``{"limit_gb": <number>}`` (upstream's body; GiB) or
  ``{"limit_bytes": <int>}`` (exact): create or update; answers ``{"cache_salt",
  "limit_gb", "status": "ok"}``.
* ``GET /quota/{cache_salt}``: ``{"cache_salt", "limit_gb", "current_usage_gb", "exists"}``
  (plus ``limit_bytes``, ``current_usage_bytes`` and ``usage_bytes_by_tier``).  The limit
  is the allowlist lens: ``0`` for a salt without a quota.
* ``DELETE /quota/{cache_salt}``: ``{"cache_salt", "status": "removed" | "not_found"}``.
* ``GET /quota``: ``{"users": {salt: {"limit_gb", "current_usage_gb"}}}`` for every
  registered salt.

The empty salt (unsalted traffic) is spelled ``_default`` in paths and answers, as
upstream does (a tenant literally named ``_default`` cannot be told apart from it).
Usage is the tenant's bytes in the tier where it holds the most: quotas apply to each
tier (L1, the disk tier) on its own.  Quotas are soft: they decide which tenant gives up
room when a tier under ``IsolatedLRU`` is full; no put is refused for them.

Every route needs the admin token when the server has one (the list names tenants; the
writes change who keeps data).  Errors are ``{"error": <code>, "message": <text>}`` with
upstream's status codes (400 for a bad body or limit, 503 with no storage).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
from fastapi import APIRouter
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from lmcache.v1.multiprocess.server.operator_routes.access import refuse_unless_authorized

__all__ = ["DEFAULT_SALT_SENTINEL", "MAX_QUOTA_BODY_BYTES", "MAX_SALT_CHARS", "router"]

router = APIRouter()

DEFAULT_SALT_SENTINEL = "_default"
MAX_QUOTA_BODY_BYTES = 4096
MAX_SALT_CHARS = 128
"""Upstream's longest ``cache_salt``: a longer one cannot belong to any stored key."""
_GIB = 1024**3
_BODY_SHAPE = "the body must be {'limit_gb': <number>} or {'limit_bytes': <int>}"


class QuotaBody(msgspec.Struct, forbid_unknown_fields=True):
    """The ``PUT /quota/{cache_salt}`` body: exactly one of the two limits.  Typed
    decoding rejects wrong types, deep nesting and out-of-range numbers as one error."""

    limit_gb: float | None = None
    limit_bytes: int | None = None


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status)


def _unescape(path_salt: str) -> str:
    return "" if path_salt == DEFAULT_SALT_SENTINEL else path_salt


def _escape(salt: str) -> str:
    return DEFAULT_SALT_SENTINEL if salt == "" else salt


def _storage(request: Request) -> Any:
    """The server's storage manager (``app.state.storage_manager``), or a 503 reply."""
    storage = getattr(request.app.state, "storage_manager", None)
    if storage is None or getattr(storage, "quota_manager", None) is None:
        return _error(503, "unavailable", "this server has no storage with quotas")
    return storage


def _guard(request: Request, cache_salt: str | None = None) -> Any:
    """The storage manager, or the reply refusing the request (401, 400, 503)."""
    refusal = refuse_unless_authorized(request)
    if refusal is not None:
        return refusal
    if cache_salt is not None and len(cache_salt) > MAX_SALT_CHARS:
        return _error(
            400, "bad_request", f"cache_salt may hold at most {MAX_SALT_CHARS} characters"
        )
    return _storage(request)


async def _read_limit(request: Request) -> tuple[int, float] | JSONResponse:
    """(limit in bytes, limit in GiB as answered) from ``{"limit_gb": x}`` (x echoed, as
    upstream) or ``{"limit_bytes": n}``, or the 4xx reply."""
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_QUOTA_BODY_BYTES:
                return _error(
                    413, "payload_too_large", f"the body may hold {MAX_QUOTA_BODY_BYTES} bytes"
                )
    except ClientDisconnect:
        return _error(400, "bad_request", "the client went away before sending the body")
    try:
        parsed = msgspec.json.decode(bytes(body), type=QuotaBody)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return _error(400, "bad_request", f"{_BODY_SHAPE}: {exc}")
    if (parsed.limit_gb is None) == (parsed.limit_bytes is None):
        return _error(400, "bad_request", _BODY_SHAPE)
    if parsed.limit_bytes is not None:
        if parsed.limit_bytes < 0:
            return _error(400, "bad_request", "limit_bytes must be non-negative")
        return parsed.limit_bytes, parsed.limit_bytes / _GIB
    limit_gb = float(parsed.limit_gb)  # type: ignore[arg-type]
    if not math.isfinite(limit_gb):
        return _error(400, "bad_request", "limit_gb must be finite")
    if limit_gb < 0:
        return _error(400, "bad_request", "limit_gb must be non-negative")
    return int(limit_gb * _GIB), limit_gb


@router.put("/quota/{cache_salt}")
async def set_quota(cache_salt: str, request: Request) -> Any:
    """Create or update ``cache_salt``'s quota."""
    storage = _guard(request, cache_salt)
    if isinstance(storage, Response):
        return storage
    limit = await _read_limit(request)
    if isinstance(limit, Response):
        return limit
    limit_bytes, limit_gb = limit
    salt = _unescape(cache_salt)
    storage.quota_manager.set_quota(salt, limit_bytes)
    return {"cache_salt": _escape(salt), "limit_gb": limit_gb, "status": "ok"}


@router.get("/quota/{cache_salt}")
async def get_quota(cache_salt: str, request: Request) -> Any:
    """``cache_salt``'s quota and current usage."""
    storage = _guard(request, cache_salt)
    if isinstance(storage, Response):
        return storage
    salt = _unescape(cache_salt)
    quotas = storage.quota_manager
    limit_bytes = quotas.get_limit_bytes(salt)
    used = storage.get_usage_bytes_by_cache_salt().get(salt, 0)
    by_tier = {
        tier: per_salt.get(salt, 0) for tier, per_salt in storage.usage_bytes_by_tier().items()
    }
    return {
        "cache_salt": _escape(salt),
        "limit_gb": limit_bytes / _GIB,
        "current_usage_gb": used / _GIB,
        "exists": quotas.has_quota(salt),
        "limit_bytes": limit_bytes,
        "current_usage_bytes": used,
        "usage_bytes_by_tier": by_tier,
    }


@router.delete("/quota/{cache_salt}")
async def delete_quota(cache_salt: str, request: Request) -> Any:
    """Remove ``cache_salt``'s quota (its limit drops to 0: it gives up room first)."""
    storage = _guard(request, cache_salt)
    if isinstance(storage, Response):
        return storage
    salt = _unescape(cache_salt)
    removed = storage.quota_manager.delete_quota(salt)
    return {"cache_salt": _escape(salt), "status": "removed" if removed else "not_found"}


@router.get("/quota")
async def list_quotas(request: Request) -> Any:
    """Every registered quota with its tenant's current usage."""
    storage = _guard(request)
    if isinstance(storage, Response):
        return storage
    usage = storage.get_usage_bytes_by_cache_salt()
    users = {
        _escape(entry.cache_salt): {
            "limit_gb": entry.limit_bytes / _GIB,
            "current_usage_gb": usage.get(entry.cache_salt, 0) / _GIB,
        }
        for entry in storage.quota_manager.list_quotas()
    }
    return {"users": users}
