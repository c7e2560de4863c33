"""First-in first-out: reads do not refresh a key."""

from __future__ import annotations

from collections.abc import Hashable

from lmcache.v1.storage_backend.cache_policy.lru import LRUCachePolicy


class FIFOCachePolicy(LRUCachePolicy):
    """Evicts the key inserted longest ago, however often it was read."""

    def on_hit(self, key: Hashable) -> None:
        return None
