"""Upstream's ``ARCEvictionPolicy``: the product's ARC behind upstream's interface."""

from __future__ import annotations

from lmcache.compat.upstream_056.distributed.eviction import EvictionDestination
from lmcache.compat.upstream_056.distributed.eviction_policy.adapter import ProductPolicyAdapter
from lmcache.v1.storage_backend.cache_policy import ARCCachePolicy


class ARCEvictionPolicy(ProductPolicyAdapter):
    """Adaptive Replacement Cache; a victim reported removed leaves a ghost."""

    def __init__(
        self, default_destination: EvictionDestination = EvictionDestination.DISCARD
    ) -> None:
        self._arc = ARCCachePolicy()
        super().__init__(self._arc, default_destination)

    def get_debug_state(self) -> dict[str, object]:
        """Copies of ARC's lists, its capacity and its target ``T1`` size."""
        with self._lock:
            return {
                **self._arc.lists(),
                "capacity": self._arc.capacity,
                "target_t1_size": self._arc.target_t1_size,
            }


__all__ = ["ARCEvictionPolicy"]
