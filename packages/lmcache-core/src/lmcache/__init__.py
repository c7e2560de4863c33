"""lmcache: KV-cache offloading and sharing for LLM inference servers on any accelerator.

``lmcache.torch_dev``, ``lmcache.torch_device_type`` and ``lmcache.device_ops`` (the
selected backend's ops singleton) are resolved lazily on first access, so importing
``lmcache`` never imports a plugin's native code.
"""

from __future__ import annotations

from typing import Any

from lmcache.compat import paths as _compat_paths
from lmcache.distributions import warn_if_upstream_installed

__version__ = "0.1.0"

# Upstream 0.5.6's import paths and our own moved ones (one table: lmcache.compat.paths).
_compat_paths.install()
# Upstream's `lmcache` distribution installs this same package: say so before it bites.
warn_if_upstream_installed()


def __getattr__(name: str) -> Any:
    if name in ("torch_dev", "torch_device_type"):
        from lmcache.v1.platform import get_torch_device

        torch_dev, torch_device_type = get_torch_device()
        return torch_dev if name == "torch_dev" else torch_device_type
    if name == "device_ops":
        from lmcache.v1.platform import resolve_device_ops

        return resolve_device_ops()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["__version__", "device_ops", "torch_dev", "torch_device_type"]
