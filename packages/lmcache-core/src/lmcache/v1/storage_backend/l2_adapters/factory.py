"""Adapter factories by type name: ``(config, l1_memory_desc) -> L2AdapterInterface``.

An adapter module registers its config class (:func:`.config.register_l2_adapter_type`)
and its factory (:func:`register_l2_adapter_factory`) when imported.  Built-in modules
(every ``*_l2_adapter`` module of this package) are only *listed* at import of the package
and imported the first time their type is asked for, so an adapter's dependencies load
only when it is used.  Upstream's path ``lmcache.v1.distributed.l2_adapters.factory`` is
this module.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmcache.v1.storage_backend.l2_adapters.base import L2AdapterInterface
    from lmcache.v1.storage_backend.l2_adapters.config import L2AdapterConfigBase
    from lmcache.v1.storage_backend.l2_adapters.types import L1MemoryDesc

logger = logging.getLogger(__name__)

L2AdapterFactory = Callable[["L2AdapterConfigBase", "L1MemoryDesc | None"], "L2AdapterInterface"]

_L2_ADAPTER_FACTORY_REGISTRY: dict[str, L2AdapterFactory] = {}

_PENDING_MODULES: list[str] = []
"""Modules known to register adapter types, not imported yet (in discovery order)."""


def register_l2_adapter_factory(name: str, factory: L2AdapterFactory) -> None:
    """Register the factory of adapter type ``name`` (after its config class)."""
    if name in _L2_ADAPTER_FACTORY_REGISTRY:
        raise ValueError(f"L2 adapter factory already registered: {name}")
    _L2_ADAPTER_FACTORY_REGISTRY[name] = factory


def add_pending_module(module_path: str) -> None:
    """Import ``module_path`` when a type name is first missing from the registry."""
    if module_path not in _PENDING_MODULES:
        _PENDING_MODULES.append(module_path)


def ensure_adapter_loaded(name: str) -> None:
    """Import pending modules until ``name`` is registered.  A module that cannot import
    (a missing dependency) is skipped; if ``name`` is still missing at the end, the last
    such ``ImportError`` is raised (it probably is why)."""
    if name in _L2_ADAPTER_FACTORY_REGISTRY:
        return
    last_error: ImportError | None = None
    while _PENDING_MODULES:
        module_path = _PENDING_MODULES.pop(0)
        try:
            importlib.import_module(module_path)
        except ImportError as exc:
            logger.debug("adapter module %s not imported: %s", module_path, exc)
            last_error = exc
            continue
        if name in _L2_ADAPTER_FACTORY_REGISTRY:
            return
    if last_error is not None and name not in _L2_ADAPTER_FACTORY_REGISTRY:
        raise last_error


def load_all_adapters() -> None:
    """Import every pending module (those that cannot import are skipped)."""
    while _PENDING_MODULES:
        module_path = _PENDING_MODULES.pop(0)
        try:
            importlib.import_module(module_path)
        except ImportError:
            logger.debug("adapter module %s not imported", module_path)


def get_all_registered_names() -> list[str]:
    """Every registered adapter type name, sorted (built-ins imported first)."""
    load_all_adapters()
    return sorted(_L2_ADAPTER_FACTORY_REGISTRY)


def create_l2_adapter_from_registry(
    config: L2AdapterConfigBase, l1_memory_desc: L1MemoryDesc | None = None
) -> L2AdapterInterface:
    """A new adapter of ``config``'s registered type."""
    from lmcache.v1.storage_backend.l2_adapters.config import get_type_name_for_config

    name = get_type_name_for_config(config)
    ensure_adapter_loaded(name)
    factory = _L2_ADAPTER_FACTORY_REGISTRY.get(name)
    if factory is None:
        raise ValueError(
            f"No adapter factory registered for type {name}. "
            "Make sure the adapter module is imported."
        )
    return factory(config, l1_memory_desc)
