"""Upstream's ``devices.cuda`` path; the classes come from the installed lmcache-cuda plugin."""

from __future__ import annotations

from typing import Any

from lmcache.compat.upstream_056.devices import plugin_spec


def __getattr__(name: str) -> Any:
    if name == "CudaDeviceSpec":
        return type(plugin_spec("cuda", "lmcache-cuda", f"{__name__}.{name}"))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
