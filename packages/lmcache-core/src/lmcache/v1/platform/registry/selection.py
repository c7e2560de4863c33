"""Choosing the backend: ``LMCACHE_DEVICE_BACKEND``, then ``DEVICE_TYPE``, then auto-detection.

* ``LMCACHE_DEVICE_BACKEND=<name>`` picks exactly that backend; it is an error if it is not
  registered, not available, or does not match ``DEVICE_TYPE``.
* otherwise ``DEVICE_TYPE=<type>`` restricts to that device type; among its available
  backends the highest ``priority`` wins, and a tie is an error naming the variable to set.
  If no backend of that type is available, a warning is logged and auto-detection runs.
* otherwise (auto) the first device type, in registry order, with an available backend,
  accelerators before ``cpu``; ``cpu`` is the final fallback.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from types import ModuleType

from lmcache.v1.platform.base.device_spec import DeviceSpec
from lmcache.v1.platform.registry.model import (
    CPU_DEVICE_TYPE,
    DEVICE_BACKEND_ENV_VAR,
    DEVICE_TYPE_ENV_VAR,
    BackendSelection,
    DeviceRegistry,
    RegisteredBackend,
)

logger = logging.getLogger(__name__)


def _is_available(backend: RegisteredBackend) -> bool:
    try:
        return bool(backend.spec.is_available())
    except Exception as exc:
        logger.warning(
            "Backend %r: is_available() raised %s: %s; treating it as unavailable",
            backend.backend_name,
            type(exc).__name__,
            exc,
        )
        return False


def _torch_module_for(spec: DeviceSpec) -> ModuleType | None:
    try:
        import torch
    except Exception:
        return None
    name = spec.torch_module_name
    return getattr(torch, name, None) if name else None


def _usable_candidates(backends: Iterable[RegisteredBackend]) -> list[RegisteredBackend]:
    usable = []
    for backend in backends:
        if not _is_available(backend):
            continue
        if _torch_module_for(backend.spec) is None:
            logger.warning(
                "backend [%s] for device [%s] is available, but torch module [%s] is not found.",
                backend.backend_name,
                backend.device_type,
                backend.spec.torch_module_name,
            )
            continue
        usable.append(backend)
    return usable


def _pick_by_priority(
    device_type: str, candidates: list[RegisteredBackend], why: str
) -> BackendSelection:
    top = max(c.spec.priority for c in candidates)
    best = [c for c in candidates if c.spec.priority == top]
    if len(best) > 1:
        names = ", ".join(c.backend_name for c in best)
        raise RuntimeError(
            f"Multiple LMCache backends are available for device_type {device_type!r} with "
            f"the same priority {top}: {names}. Set {DEVICE_BACKEND_ENV_VAR}=<backend_name> "
            "to choose one explicitly."
        )
    chosen = best[0]
    if len(candidates) > 1:
        others = ", ".join(
            f"{c.backend_name} (priority {c.spec.priority})" for c in candidates if c is not chosen
        )
        why = f"{why}; highest priority {top} among available backends (others: {others})"
    else:
        why = f"{why}; the only available backend of that type"
    return BackendSelection(chosen, why)


def _select_explicit(registry: DeviceRegistry, name: str, device_type: str) -> BackendSelection:
    backend = registry.backends.get(name)
    if backend is None:
        available = ", ".join(registry.backends) or "(none)"
        skipped = [s for s in registry.skipped if s.name == name]
        hint = f" It was skipped: {skipped[0].reason}" if skipped else ""
        raise RuntimeError(
            f"{DEVICE_BACKEND_ENV_VAR}={name!r} is not registered. Available "
            f"backends: {available}.{hint}"
        )
    if device_type and backend.device_type != device_type:
        raise RuntimeError(
            f"{DEVICE_BACKEND_ENV_VAR}={name!r} has device_type "
            f"{backend.device_type!r}, but {DEVICE_TYPE_ENV_VAR}={device_type!r}."
        )
    if not _is_available(backend):
        raise RuntimeError(
            f"{DEVICE_BACKEND_ENV_VAR}={name!r} is registered but not available on this host."
        )
    if _torch_module_for(backend.spec) is None:
        raise RuntimeError(
            f"{DEVICE_BACKEND_ENV_VAR}={name!r} resolved to device_type="
            f"{backend.device_type!r}, but torch has no module "
            f"{backend.spec.torch_module_name!r}."
        )
    return BackendSelection(backend, f"{DEVICE_BACKEND_ENV_VAR}={name}")


def _auto_device_types(registry: DeviceRegistry) -> list[str]:
    types_in_order = list(registry.by_device_type())
    return [t for t in types_in_order if t != CPU_DEVICE_TYPE] + (
        [CPU_DEVICE_TYPE] if CPU_DEVICE_TYPE in types_in_order else []
    )


def choose_backend(registry: DeviceRegistry, env: Mapping[str, str]) -> BackendSelection:
    """Choose a backend of ``registry`` under ``env`` (pure: no caching, no logging of it)."""
    backend_name = env.get(DEVICE_BACKEND_ENV_VAR, "").strip().lower()
    device_type = env.get(DEVICE_TYPE_ENV_VAR, "").strip().lower()
    if backend_name:
        return _select_explicit(registry, backend_name, device_type)
    groups = registry.by_device_type()
    if device_type:
        candidates = _usable_candidates(groups.get(device_type, []))
        if candidates:
            return _pick_by_priority(
                device_type, candidates, f"{DEVICE_TYPE_ENV_VAR}={device_type}"
            )
        logger.warning(
            "DEVICE_TYPE=%r is not available or not registered, falling back to auto-detection.",
            device_type,
        )
    for candidate_type in _auto_device_types(registry):
        candidates = _usable_candidates(groups[candidate_type])
        if candidates:
            why = (
                "auto-detected accelerator"
                if candidate_type != CPU_DEVICE_TYPE
                else "no accelerator backend available; cpu fallback"
            )
            return _pick_by_priority(candidate_type, candidates, why)
    raise RuntimeError(
        "No LMCache device backend is available (not even cpu); run "
        "`lmcache devices` to see what was discovered and why it was skipped."
    )
