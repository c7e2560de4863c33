"""Upstream's ``LRUEvictionPolicy``: the product's LRU behind upstream's interface."""

from __future__ import annotations

from lmcache.compat.upstream_056.distributed.eviction import EvictionDestination
from lmcache.compat.upstream_056.distributed.eviction_policy.adapter import ProductPolicyAdapter
from lmcache.v1.storage_backend.cache_policy import LRUCachePolicy


class LRUEvictionPolicy(ProductPolicyAdapter):
    """Least recently created or touched first."""

    def __init__(
        self, default_destination: EvictionDestination = EvictionDestination.DISCARD
    ) -> None:
        super().__init__(LRUCachePolicy(), default_destination)


__all__ = ["LRUEvictionPolicy"]
