"""Adapter factories by type name: ``(config, l1_memory_desc) -> L2AdapterInterface``.

An adapter module registers its config class (:func:`.config.register_l2_adapter_type`)
and its factory (:func:`register_l2_adapter_factory`) when imported.  Built-in modules
(every ``*_l2_adapter`` module of this package) are only *listed* at import of the package
and imported the first time their type is asked for, so an adapter's dependencies load
only when it is used.  Upstream's path ``lmcache.v1.distributed.l2_adapters.factory`` is
this module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from lmcache.v1.storage_backend.l2_adapters.config import get_type_name_for_config
from lmcache.v1.storage_backend.l2_adapters.pending import (
    _PENDING_MODULES,
    add_pending_module,
    import_all_pending,
    import_pending_until,
)

if TYPE_CHECKING:
    from lmcache.v1.storage_backend.l2_adapters.base import L2AdapterInterface
    from lmcache.v1.storage_backend.l2_adapters.config import L2AdapterConfigBase
    from lmcache.v1.storage_backend.l2_adapters.types import L1MemoryDesc

logger = logging.getLogger(__name__)

L2AdapterFactory = Callable[["L2AdapterConfigBase", "L1MemoryDesc | None"], "L2AdapterInterface"]

_L2_ADAPTER_FACTORY_REGISTRY: dict[str, L2AdapterFactory] = {}


def register_l2_adapter_factory(name: str, factory: L2AdapterFactory) -> None:
    """Register the factory of adapter type ``name`` (after its config class)."""
    if name in _L2_ADAPTER_FACTORY_REGISTRY:
        raise ValueError(f"L2 adapter factory already registered: {name}")
    _L2_ADAPTER_FACTORY_REGISTRY[name] = factory


def ensure_adapter_loaded(name: str) -> None:
    """Import pending modules until ``name`` has a factory (see :mod:`.pending`)."""
    import_pending_until(lambda: name in _L2_ADAPTER_FACTORY_REGISTRY)


def load_all_adapters() -> None:
    """Import every pending module (those that cannot import are skipped)."""
    import_all_pending()


def get_all_registered_names() -> list[str]:
    """Every type name with a factory, sorted (built-ins imported first)."""
    import_all_pending()
    return sorted(_L2_ADAPTER_FACTORY_REGISTRY)


def create_l2_adapter_from_registry(
    config: L2AdapterConfigBase, l1_memory_desc: L1MemoryDesc | None = None
) -> L2AdapterInterface:
    """A new adapter of ``config``'s registered type."""
    name = get_type_name_for_config(config)
    ensure_adapter_loaded(name)
    factory = _L2_ADAPTER_FACTORY_REGISTRY.get(name)
    if factory is None:
        raise ValueError(
            f"No adapter factory registered for type {name}. "
            "Make sure the adapter module is imported."
        )
    return factory(config, l1_memory_desc)


__all__ = [
    "_PENDING_MODULES",  # upstream's name; tests of its lazy loading reach into it
    "L2AdapterFactory",
    "add_pending_module",
    "create_l2_adapter_from_registry",
    "ensure_adapter_loaded",
    "get_all_registered_names",
    "load_all_adapters",
    "register_l2_adapter_factory",
]
