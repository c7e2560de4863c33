"""Upstream 0.5.6's ``devices.rocm.pin_memory`` path, served by the installed lmcache-cuda plugin.

``RocmPinMemoryBackend`` is the pin-memory backend class of the registered ``rocm`` backend.
"""

from __future__ import annotations

from typing import Any

from lmcache.compat.upstream_056.devices import plugin_spec


def __getattr__(name: str) -> Any:
    if name == "RocmPinMemoryBackend":
        return plugin_spec("rocm", "lmcache-cuda", f"{__name__}.{name}").pin_memory_backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
