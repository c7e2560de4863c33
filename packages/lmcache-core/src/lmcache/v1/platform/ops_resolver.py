"""The hook through which the torch baseline reaches another backend's ``DeviceOps``.

``torch_ops`` sits below the registry (``platform.base`` delegates to it), so it cannot
import :mod:`lmcache.v1.platform`; the package installs its ``resolve_device_ops`` here on
import instead (the package is always imported before any of its modules).  Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["resolve_ops_for", "set_device_ops_resolver"]

_resolvers: list[Callable[[str], Any]] = []


def set_device_ops_resolver(resolver: Callable[[str], Any]) -> None:
    _resolvers[:] = [resolver]


def resolve_ops_for(device_type: str) -> Any:
    """The ``DeviceOps`` of the backend serving ``device_type``."""
    if not _resolvers:
        raise RuntimeError(
            f"no device registry is loaded to resolve the ops of {device_type!r} "
            "(import lmcache.v1.platform first)"
        )
    return _resolvers[0](device_type)
