r"""Finding backends: in-tree sub-packages, then ``lmcache.device_plugins`` entry points.

The order decides which of two equal ``backend_name``\ s wins: in-tree packages of
:mod:`lmcache.v1.platform` (and of ``lmcache.v1.platform.devices`` if present)
alphabetically, each concrete ``DeviceSpec`` subclass *defined* in the package's
``__init__``; then entry points sorted by ``(name, value, distribution name)``, unless
``LMCACHE_DEVICE_PLUGINS_AUTOLOAD=0``.  Every candidate goes through :mod:`.loading`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
import os
import pkgutil
from collections.abc import Iterable, Mapping
from types import ModuleType

from lmcache.v1.platform.base.device_spec import DeviceSpec
from lmcache.v1.platform.registry.loading import _instantiate, _RegistryBuilder
from lmcache.v1.platform.registry.model import (
    DEVICE_PLUGIN_ENTRY_POINT_GROUP,
    PLUGINS_AUTOLOAD_ENV_VAR,
    BackendSource,
    DeviceRegistry,
)

logger = logging.getLogger(__name__)

_PLATFORM_PACKAGE = "lmcache.v1.platform"
# Sub-packages of the platform package that hold infrastructure, not device backends.
_NON_DEVICE_PACKAGES = frozenset({"base", "torch_ops", "kernel_kit", "registry", "devices"})


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
