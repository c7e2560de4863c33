"""Upstream's ``NoOpEvictionPolicy``: the product's ``noop`` (never offers a victim)."""

from __future__ import annotations

from lmcache.compat.upstream_056.distributed.eviction import EvictionDestination
from lmcache.compat.upstream_056.distributed.eviction_policy.adapter import ProductPolicyAdapter
from lmcache.v1.storage_backend.cache_policy import NoopCachePolicy


class NoOpEvictionPolicy(ProductPolicyAdapter):
    """Never evicts: every ``get_eviction_actions`` answer is empty."""

    def __init__(
        self, default_destination: EvictionDestination = EvictionDestination.DISCARD
    ) -> None:
        super().__init__(NoopCachePolicy(), default_destination)


__all__ = ["NoOpEvictionPolicy"]
