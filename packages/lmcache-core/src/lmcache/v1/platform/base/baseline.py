"""How ``base`` reaches the torch baseline without importing it.

:mod:`lmcache.v1.platform.torch_ops` and the kernel kit are built on top of ``base``, so
``base`` must not import them.  The registry (imported by the platform package before any
``DeviceOps`` exists) installs a provider that imports the baseline on first use; ``DeviceOps``
asks this module for it.  Importing this module stays cheap: no torch, no registry.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable

__all__ = ["set_torch_baseline", "torch_baseline"]

_baseline_providers: list[Callable[[], types.ModuleType]] = []
_baseline_lock = threading.Lock()


def set_torch_baseline(provider: Callable[[], types.ModuleType]) -> None:
    """Install the function that imports and returns :mod:`lmcache.v1.platform.torch_ops`."""
    with _baseline_lock:
        _baseline_providers[:] = [provider]


def torch_baseline() -> types.ModuleType:
    """The torch baseline module every ``DeviceOps`` op delegates to."""
    with _baseline_lock:
        providers = list(_baseline_providers)
    if not providers:
        raise RuntimeError(
            "DeviceOps has no torch baseline: no device registry is loaded "
            "(import lmcache.v1.platform first)"
        )
    return providers[0]()
