"""Upstream's ``lmcache.v1.distributed.internal_api``: the L2 adapter's result and listener
types (the product's :mod:`lmcache.v1.storage_backend.l2_adapters.types`).

Upstream's L1-manager listeners and interfaces are not provided: lmcache-core's L1 is
:class:`~lmcache.v1.storage_backend.local_cpu_backend.LocalCPUBackend`.
"""

from __future__ import annotations

from lmcache.v1.storage_backend.l2_adapters.types import (
    EventListener,
    L1MemoryDesc,
    L2AdapterListener,
    L2StoreResult,
)

__all__ = ["EventListener", "L1MemoryDesc", "L2AdapterListener", "L2StoreResult"]
