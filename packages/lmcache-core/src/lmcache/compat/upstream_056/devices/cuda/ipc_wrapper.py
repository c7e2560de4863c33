"""Upstream's ``devices.cuda.ipc_wrapper`` path, served by the installed lmcache-cuda plugin."""

from __future__ import annotations

from typing import Any

from lmcache.compat.upstream_056.devices import plugin_spec


def __getattr__(name: str) -> Any:
    if name == "CudaIPCWrapper":
        return plugin_spec("cuda", "lmcache-cuda", f"{__name__}.{name}").ipc_wrapper_cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
