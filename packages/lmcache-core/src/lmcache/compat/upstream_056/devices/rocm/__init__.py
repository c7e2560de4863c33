"""Upstream's ``devices.rocm`` path; the class comes from the installed lmcache-cuda plugin."""

from __future__ import annotations

from typing import Any

from lmcache.compat.upstream_056.devices import plugin_spec


def __getattr__(name: str) -> Any:
    if name == "RocmDeviceSpec":
        return type(plugin_spec("rocm", "lmcache-cuda", f"{__name__}.{name}"))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
