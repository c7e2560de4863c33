"""Upstream 0.5.6's runtime reconfiguration routes, answered with a clear refusal.

Upstream lets an operator change an L2 adapter while the server runs:
``GET /reconfigure/{backend}/l2/status`` and ``POST /reconfigure/{backend}/l2/{operation}``
(``GET /config/adapters`` lists which adapters are ``reconfigurable``), and
``/reconfigure/dax/l1/{status,add,remove}`` for a Device-DAX L1.  In upstream 0.5.6 only
the DAX adapter implements it (adding, removing and resizing DAX devices).

This server has no DAX tier, and its tiers (L1 in host memory, the disk tier, Redis) are
fixed at start-up: the storage manager's lookup order, write-through and the prefetcher
are built over one tier list, and swapping a tier under in-flight puts and prefetches is
not something we can do without losing writes.  So every such route answers
``501 Not Implemented`` with the frontend's error shape (``{"error": "not_implemented",
"message": <why>}``) instead of a bare 404; ``GET /config/adapters`` reports
``"reconfigurable": false`` for every tier.  Restart the server with new ``--l2-adapter``
flags to change the tiers.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import JSONResponse

__all__ = ["RECONFIGURE_REFUSAL", "router"]

router = APIRouter()

RECONFIGURE_REFUSAL = (
    "runtime reconfiguration is not supported by this server: its storage tiers are fixed "
    "at start-up (no tier is reconfigurable; upstream supports it only for Device-DAX, "
    "which this server does not drive). Restart with new --l2-adapter flags instead."
)


def _refusal(what: str) -> JSONResponse:
    return JSONResponse(
        status_code=501,
        content={
            "error": "not_implemented",
            "message": f"{what}: {RECONFIGURE_REFUSAL}",
            "reconfigurable": False,
        },
    )


@router.get("/reconfigure/{backend}/l2/status")
async def l2_status(backend: str) -> JSONResponse:
    return _refusal(f"{backend} L2 reconfiguration status")


@router.post("/reconfigure/{backend}/l2/{operation}")
async def l2_operation(backend: str, operation: str) -> JSONResponse:
    return _refusal(f"{backend} L2 {operation}")


@router.get("/reconfigure/dax/l1/status")
async def dax_l1_status() -> JSONResponse:
    return _refusal("Device-DAX L1 reconfiguration status")


@router.post("/reconfigure/dax/l1/{operation}")
async def dax_l1_operation(operation: str) -> JSONResponse:
    return _refusal(f"Device-DAX L1 {operation}")
