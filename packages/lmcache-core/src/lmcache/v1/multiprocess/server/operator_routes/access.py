"""What the operator routes read from ``app.state`` (see the package docstring)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["refuse_unless_authorized", "setting"]

Authorize = Callable[[Request], "Response | None"]


def refuse_unless_authorized(request: Request) -> Response | None:
    """The app's refusal of ``request`` (a 401 without the admin token), or None to go on.

    An app that sets no ``authorize`` has no admin token to check.
    """
    authorize: Authorize | None = getattr(request.app.state, "authorize", None)
    return None if authorize is None else authorize(request)


def setting(request: Request, name: str, default: Any) -> Any:
    """``name`` of the in-process adapter's config, else of the MP server's config.

    Upstream's two deployments: a vLLM-embedded server puts its adapter on
    ``app.state.lmcache_adapter``; the MP server puts ``{"mp": MPServerConfig}`` on
    ``app.state.configs``.  Neither present: ``default``.
    """
    adapter = getattr(request.app.state, "lmcache_adapter", None)
    if adapter is not None:
        return getattr(adapter.config, name, default)
    configs = getattr(request.app.state, "configs", None)
    if isinstance(configs, dict) and "mp" in configs:
        return getattr(configs["mp"], name, default)
    return default
