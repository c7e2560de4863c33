"""The per-process registry and selection: built on first use, then cached.

That cache is the one piece of process-global state in lmcache (restart processes after
installing a plugin); :func:`clear_caches` exists for tests.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Mapping
from types import ModuleType

from lmcache.v1.platform.base.device_spec import DeviceSpec
from lmcache.v1.platform.registry.discovery import build_registry
from lmcache.v1.platform.registry.model import BackendSelection, DeviceRegistry
from lmcache.v1.platform.registry.selection import (
    _pick_by_priority,
    _torch_module_for,
    _usable_candidates,
    choose_backend,
)

logger = logging.getLogger(__name__)


def select_backend(
    registry: DeviceRegistry | None = None, env: Mapping[str, str] | None = None
) -> BackendSelection:
    """Choose the backend (default: this process's registry and environment); uncached."""
    registry = get_registry() if registry is None else registry
    return choose_backend(registry, os.environ if env is None else env)


_cache_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def get_registry() -> DeviceRegistry:
    """The process-wide registry (built on first call, then cached)."""
    with _cache_lock:
        return build_registry()


@functools.lru_cache(maxsize=1)
def get_selection() -> BackendSelection:
    """The process-wide backend selection; logs the choice once."""
    selection = select_backend(get_registry())
    torch_dev = _torch_module_for(selection.spec)
    logger.info(
        "torch_dev=%s, torch_device_type=%s",
        getattr(torch_dev, "__name__", torch_dev),
        selection.device_type,
    )
    logger.info(
        "LMCache device backend %r selected (device_type=%s, source=%s, priority=%d): %s",
        selection.backend.backend_name,
        selection.device_type,
        selection.backend.source.describe(),
        selection.spec.priority,
        selection.reason,
    )
    return selection


def clear_caches() -> None:
    """Forget the registry and selection (tests only; a real process restarts instead)."""
    get_selection.cache_clear()
    get_registry.cache_clear()


def _detect_device() -> tuple[ModuleType | None, str, str | None]:
    """(torch module, device_type, backend_name) of the selected backend."""
    selection = get_selection()
    return _torch_module_for(selection.spec), selection.device_type, selection.backend.backend_name


def get_torch_device() -> tuple[ModuleType | None, str]:
    """(torch_dev, torch_device_type): the torch module and device type in use."""
    torch_dev, device_type, _ = _detect_device()
    return torch_dev, device_type


def current_device_spec() -> DeviceSpec:
    """The selected backend's spec."""
    return get_selection().spec


def get_device_spec(device_type: str) -> DeviceSpec | None:
    """The spec serving ``device_type``: the selected one if it has that type, else the
    highest-priority available backend of it, else the one named like the type."""
    selection = get_selection()
    if selection.device_type == device_type:
        return selection.spec
    group = get_registry().by_device_type().get(device_type, [])
    if not group:
        return None
    if len(group) == 1:
        return group[0].spec
    candidates = _usable_candidates(group)
    if candidates:
        return _pick_by_priority(device_type, candidates, "lookup").spec
    for backend in group:
        if backend.backend_name == device_type:
            return backend.spec
    return None


def import_backend_ipc_wrappers() -> None:
    """Import the ``ipc_wrapper_cls`` of every registered backend (they register on import)."""
    for backend in get_registry().backends.values():
        try:
            backend.spec.ipc_wrapper_cls  # noqa: B018 - imported for its registration
        except Exception as exc:
            logger.debug("backend %r: ipc_wrapper_cls unavailable: %s", backend.backend_name, exc)


def _import_torch_baseline() -> ModuleType:
    """The torch baseline, imported on first use (it pulls in torch, which plugins'
    ``DeviceSpec`` modules must not pay for while the registry is being built)."""
    from lmcache.v1.platform import torch_ops

    return torch_ops
