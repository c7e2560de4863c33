"""L2 adapters: upstream LMCache 0.5.6's interface for third-party storage, as tiers here.

* :mod:`.base` -- :class:`L2AdapterInterface` (what a third party implements);
* :mod:`.types`, :mod:`.bitmap` -- the values it speaks in (``ObjectKey``,
  ``L2StoreResult``, ``Bitmap``, listeners);
* :mod:`.config`, :mod:`.factory` -- config classes and factories by type name
  (``register_l2_adapter_type`` / ``register_l2_adapter_factory``);
* built-in types: ``plugin`` (a class by module path), ``mock`` (in memory, with
  simulated bandwidth) and ``fault_inject`` (drops loads of another adapter);
* :mod:`.bridge` -- :class:`L2AdapterBackend`, the one storage tier that drives any
  adapter, so the storage manager uses it like the disk or Redis tier.

Upstream's path ``lmcache.v1.distributed.l2_adapters`` is this package.
"""

from __future__ import annotations

import pkgutil

from lmcache.v1.storage_backend.l2_adapters.base import L2AdapterInterface
from lmcache.v1.storage_backend.l2_adapters.config import L2AdapterConfigBase
from lmcache.v1.storage_backend.l2_adapters.factory import create_l2_adapter_from_registry
from lmcache.v1.storage_backend.l2_adapters.pending import add_pending_module
from lmcache.v1.storage_backend.l2_adapters.types import L1MemoryDesc

# Built-in adapter modules are listed, not imported: each loads on first use of its type.
for _module in pkgutil.iter_modules(__path__):
    if _module.name.endswith("_l2_adapter"):
        add_pending_module(f"{__name__}.{_module.name}")


def create_l2_adapter(
    config: L2AdapterConfigBase, l1_memory_desc: L1MemoryDesc | None = None
) -> L2AdapterInterface:
    """A new adapter for ``config`` (through the factory of its registered type)."""
    return create_l2_adapter_from_registry(config, l1_memory_desc=l1_memory_desc)


__all__ = ["L2AdapterConfigBase", "L2AdapterInterface", "create_l2_adapter"]
