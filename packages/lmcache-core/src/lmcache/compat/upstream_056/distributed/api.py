"""Upstream's ``lmcache.v1.distributed.api``: the key and layout types of its storage API.

Only the types the L2 adapter interface uses are provided; they are the product's
(:mod:`lmcache.v1.storage_backend.l2_adapters.types`).  Upstream's prefetch and tier
descriptors (``PrefetchTaskSpec``, ``GroupedObjectKeys``, ``Tier``, ...) belong to its MP
storage manager, which lmcache-core does not ship.
"""

from __future__ import annotations

from lmcache.v1.storage_backend.l2_adapters.types import (
    EncodedObjectKey,
    KeyEntry,
    KeyListPage,
    MemoryLayoutDesc,
    ObjectKey,
)

__all__ = ["EncodedObjectKey", "KeyEntry", "KeyListPage", "MemoryLayoutDesc", "ObjectKey"]
