"""Upstream's ``lmcache.v1.distributed.internal_api``: the value types of its storage API's
internal seams.

- The L2 adapter's result and listener types are the product's
  (:mod:`lmcache.v1.storage_backend.l2_adapters.types`).
- :class:`EvictionAction` and :class:`EvictionDestination` are what upstream's eviction
  policies answer (:mod:`.eviction`); :class:`QuotaEntry` is the product's
  (:mod:`lmcache.v1.storage_backend.quota`).

Upstream's L1-manager listeners and interfaces are not provided: lmcache-core's L1 is
:class:`~lmcache.v1.storage_backend.local_cpu_backend.LocalCPUBackend`.
"""

from __future__ import annotations

from lmcache.compat.upstream_056.distributed.eviction import EvictionAction, EvictionDestination
from lmcache.v1.storage_backend.l2_adapters.types import (
    EventListener,
    L1MemoryDesc,
    L2AdapterListener,
    L2StoreResult,
)
from lmcache.v1.storage_backend.quota import QuotaEntry

__all__ = [
    "EventListener",
    "EvictionAction",
    "EvictionDestination",
    "L1MemoryDesc",
    "L2AdapterListener",
    "L2StoreResult",
    "QuotaEntry",
]
