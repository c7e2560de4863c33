"""The device-backend registry and backend selection.

The registry is built once per process, on first use, and cached: that cache is the one
piece of process-global state in lmcache (restart processes after installing a plugin).

Discovery, in this order (the order decides which of two equal ``backend_name``s wins):

1. in-tree: every direct sub-package of :mod:`lmcache.v1.platform` (and of
   ``lmcache.v1.platform.devices`` if present), alphabetically; each concrete ``DeviceSpec``
   subclass *defined* in the package's ``__init__`` is instantiated once;
2. entry points of the group ``lmcache.device_plugins``, sorted by
   ``(name, value, distribution name)``.  Set ``LMCACHE_DEVICE_PLUGINS_AUTOLOAD=0`` to skip
   them entirely.

A plugin that fails to import, resolves to anything but a ``DeviceSpec`` subclass, raises
in its constructor, has an invalid or mismatched name, or duplicates an already registered
``backend_name`` is logged with its distribution and the reason, recorded in
``DeviceRegistry.skipped``, and skipped; every other backend stays usable.

Selection (:func:`select_backend`):

* ``LMCACHE_DEVICE_BACKEND=<name>`` picks exactly that backend; it is an error if it is not
  registered, not available, or does not match ``DEVICE_TYPE``.
* otherwise ``DEVICE_TYPE=<type>`` restricts to that device type; among its available
  backends the highest ``priority`` wins, and a tie is an error naming the variable to set.
  If no backend of that type is available, a warning is logged and auto-detection runs.
* otherwise (auto) the first device type, in registry order, with an available backend,
  accelerators before ``cpu``; ``cpu`` is the final fallback.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import inspect
import logging
import os
import pkgutil
import threading
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from lmcache.v1.platform.base.device_spec import DeviceSpec
from lmcache.v1.platform.base.event_ipc import set_active_device_resolver
from lmcache.v1.platform.base.ipc_wrapper import set_backend_wrapper_importer

logger = logging.getLogger(__name__)

DEVICE_PLUGIN_ENTRY_POINT_GROUP = "lmcache.device_plugins"
DEVICE_BACKEND_ENV_VAR = "LMCACHE_DEVICE_BACKEND"
DEVICE_TYPE_ENV_VAR = "DEVICE_TYPE"
PLUGINS_AUTOLOAD_ENV_VAR = "LMCACHE_DEVICE_PLUGINS_AUTOLOAD"
CPU_DEVICE_TYPE = "cpu"

_PLATFORM_PACKAGE = "lmcache.v1.platform"
# Sub-packages of the platform package that hold infrastructure, not device backends.
_NON_DEVICE_PACKAGES = frozenset({"base", "torch_ops", "devices"})


@dataclasses.dataclass(frozen=True)
class BackendSource:
    """Where a backend came from, for logs and ``lmcache devices``."""

    kind: str  # "in-tree" or "entry-point"
    module: str
    distribution: str | None = None
    version: str | None = None
    entry_point: str | None = None

    def describe(self) -> str:
        if self.kind == "in-tree":
            return f"in-tree ({self.module})"
        dist = f"{self.distribution} {self.version}" if self.distribution else "unknown dist"
        return f"{dist} (entry point {self.entry_point})"


@dataclasses.dataclass(frozen=True)
class RegisteredBackend:
    spec: DeviceSpec
    source: BackendSource

    @property
    def backend_name(self) -> str:
        return self.spec.backend_name

    @property
    def device_type(self) -> str:
        return self.spec.device_type


@dataclasses.dataclass(frozen=True)
class SkippedPlugin:
    """A discovered backend that was not registered, and why."""

    name: str
    target: str
    source: str
    reason: str


@dataclasses.dataclass(frozen=True)
class DeviceRegistry:
    backends: Mapping[str, RegisteredBackend]
    skipped: tuple[SkippedPlugin, ...]

    def by_device_type(self) -> dict[str, list[RegisteredBackend]]:
        groups: dict[str, list[RegisteredBackend]] = {}
        for backend in self.backends.values():
            groups.setdefault(backend.device_type, []).append(backend)
        return groups


@dataclasses.dataclass(frozen=True)
class BackendSelection:
    backend: RegisteredBackend
    reason: str

    @property
    def spec(self) -> DeviceSpec:
        return self.backend.spec

    @property
    def device_type(self) -> str:
        return self.backend.device_type


class _RegistryBuilder:
    """Collects specs in discovery order, enforcing the loading rules."""

    def __init__(self) -> None:
        self.backends: dict[str, RegisteredBackend] = {}
        self.skipped: list[SkippedPlugin] = []

    def skip(self, name: str, target: str, source: str, reason: str) -> None:
        logger.warning(
            "Failed to load LMCache device plugin %r (%s) from %s: %s", name, target, source, reason
        )
        self.skipped.append(SkippedPlugin(name, target, source, reason))

    def add(self, spec: DeviceSpec, source: BackendSource, label: str) -> None:
        target = f"{type(spec).__module__}:{type(spec).__qualname__}"
        try:
            _validate_spec_name(spec.device_type, "device_type")
            backend_name = _validate_spec_name(spec.backend_name, "backend_name")
        except Exception as exc:
            self.skip(label, target, source.describe(), f"{type(exc).__name__}: {exc}")
            return
        if source.kind == "entry-point" and label != backend_name:
            self.skip(
                label,
                target,
                source.describe(),
                f"entry-point name must match DeviceSpec.backend_name "
                f"({label!r} != {backend_name!r})",
            )
            return
        existing = self.backends.get(backend_name)
        if existing is not None:
            reason = (
                f"backend_name {backend_name!r} is already registered by "
                f"{existing.source.describe()}"
            )
            logger.warning(
                "Ignoring DeviceSpec %s because backend_name %r is already registered by %s",
                target,
                backend_name,
                existing.source.describe(),
            )
            self.skipped.append(SkippedPlugin(label, target, source.describe(), reason))
            return
        self.backends[backend_name] = RegisteredBackend(spec, source)

    def build(self) -> DeviceRegistry:
        return DeviceRegistry(dict(self.backends), tuple(self.skipped))


def _validate_spec_name(value: object, field: str) -> str:
    if not isinstance(value, str) or not value or value != value.lower() or value != value.strip():
        raise ValueError(f"{field} must be a non-empty lowercase string (got {value!r})")
    return value


def _spec_classes_defined_in(module: ModuleType) -> list[type[DeviceSpec]]:
    found = []
    for _, value in sorted(vars(module).items()):
        if (
            isinstance(value, type)
            and issubclass(value, DeviceSpec)
            and value is not DeviceSpec
            and value.__module__ == module.__name__
            and not inspect.isabstract(value)
        ):
            found.append(value)
    return found


def _iter_in_tree_packages() -> Iterable[str]:
    platform_pkg = importlib.import_module(_PLATFORM_PACKAGE)
    for info in sorted(pkgutil.iter_modules(platform_pkg.__path__), key=lambda m: m.name):
        if info.ispkg and info.name not in _NON_DEVICE_PACKAGES and not info.name.startswith("_"):
            yield f"{_PLATFORM_PACKAGE}.{info.name}"
    try:
        devices_pkg = importlib.import_module(f"{_PLATFORM_PACKAGE}.devices")
    except ModuleNotFoundError:
        return
    for info in sorted(pkgutil.iter_modules(devices_pkg.__path__), key=lambda m: m.name):
        if info.ispkg:
            yield f"{_PLATFORM_PACKAGE}.devices.{info.name}"


def _load_in_tree_specs(builder: _RegistryBuilder) -> None:
    for package in _iter_in_tree_packages():
        source = BackendSource(kind="in-tree", module=package)
        try:
            module = importlib.import_module(package)
        except Exception as exc:
            builder.skip(
                package, package, source.describe(), f"import failed: {type(exc).__name__}: {exc}"
            )
            continue
        for spec_cls in _spec_classes_defined_in(module):
            spec = _instantiate(builder, spec_cls, package, source)
            if spec is not None:
                builder.add(spec, source, spec.backend_name)


def _instantiate(
    builder: _RegistryBuilder, spec_cls: type[DeviceSpec], label: str, source: BackendSource
) -> DeviceSpec | None:
    target = f"{spec_cls.__module__}:{spec_cls.__qualname__}"
    try:
        spec = spec_cls()
    except Exception as exc:
        builder.skip(
            label, target, source.describe(), f"constructor raised {type(exc).__name__}: {exc}"
        )
        return None
    return spec


def _entry_point_source(ep: importlib.metadata.EntryPoint) -> BackendSource:
    dist = getattr(ep, "dist", None)
    return BackendSource(
        kind="entry-point",
        module=ep.value.split(":", 1)[0],
        distribution=dist.metadata["Name"] if dist is not None else None,
        version=dist.version if dist is not None else None,
        entry_point=f"{ep.name} = {ep.value}",
    )


def _sorted_entry_points() -> list[importlib.metadata.EntryPoint]:
    eps = importlib.metadata.entry_points(group=DEVICE_PLUGIN_ENTRY_POINT_GROUP)

    def sort_key(ep: importlib.metadata.EntryPoint) -> tuple[str, str, str]:
        dist = getattr(ep, "dist", None)
        return (ep.name, ep.value, dist.metadata["Name"] if dist is not None else "")

    return sorted(eps, key=sort_key)


def _describe_non_class(value: object) -> str:
    if isinstance(value, DeviceSpec):
        return (
            f"got an instance of {type(value).__qualname__}; the entry point must name "
            "the DeviceSpec class itself"
        )
    if isinstance(value, type):
        return f"got class {value.__qualname__}, which is not a DeviceSpec subclass"
    return (
        f"got {type(value).__name__} {value!r}; the entry point must name a DeviceSpec "
        "subclass (not a factory or instance)"
    )


def _load_entry_point_specs(builder: _RegistryBuilder) -> None:
    for ep in _sorted_entry_points():
        source = _entry_point_source(ep)
        try:
            target = ep.load()
        except Exception as exc:
            builder.skip(
                ep.name, ep.value, source.describe(), f"import failed: {type(exc).__name__}: {exc}"
            )
            continue
        if not (
            isinstance(target, type) and issubclass(target, DeviceSpec) and target is not DeviceSpec
        ):
            builder.skip(
                ep.name,
                ep.value,
                source.describe(),
                "TypeError: entry point must resolve to a DeviceSpec subclass: "
                + _describe_non_class(target),
            )
            continue
        spec = _instantiate(builder, target, ep.name, source)
        if spec is not None:
            builder.add(spec, source, ep.name)


def _plugins_autoload_enabled(env: Mapping[str, str]) -> bool:
    return env.get(PLUGINS_AUTOLOAD_ENV_VAR, "1").strip().lower() not in {"0", "false", "no"}


def build_registry(env: Mapping[str, str] | None = None) -> DeviceRegistry:
    """Discover every backend now (uncached); see the module docstring for the rules."""
    env = os.environ if env is None else env
    builder = _RegistryBuilder()
    _load_in_tree_specs(builder)
    if _plugins_autoload_enabled(env):
        _load_entry_point_specs(builder)
    else:
        logger.info(
            "%s=0: not loading %s entry points",
            PLUGINS_AUTOLOAD_ENV_VAR,
            DEVICE_PLUGIN_ENTRY_POINT_GROUP,
        )
    return builder.build()


# -- selection ------------------------------------------------------------------------
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


def _torch_module_for(spec: DeviceSpec) -> Any:
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


def select_backend(
    registry: DeviceRegistry | None = None, env: Mapping[str, str] | None = None
) -> BackendSelection:
    """Choose the backend for this process (pure: no caching, no logging of the result)."""
    registry = get_registry() if registry is None else registry
    env = os.environ if env is None else env
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


# -- the per-process cache ------------------------------------------------------------
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


def _detect_device() -> tuple[Any, str, str | None]:
    """(torch module, device_type, backend_name) of the selected backend."""
    selection = get_selection()
    return _torch_module_for(selection.spec), selection.device_type, selection.backend.backend_name


def get_torch_device() -> tuple[Any, str]:
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


set_backend_wrapper_importer(import_backend_ipc_wrappers)
set_active_device_resolver(get_torch_device)
