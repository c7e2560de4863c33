"""Least- and most-recently-used orders over one ordered dict."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator

from lmcache.v1.storage_backend.cache_policy.base_policy import BaseCachePolicy


class LRUCachePolicy(BaseCachePolicy[Hashable]):
    """Evicts the key read or written longest ago."""

    def __init__(self) -> None:
        self._order: OrderedDict[Hashable, None] = OrderedDict()

    def on_put(self, key: Hashable) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def on_hit(self, key: Hashable) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def on_remove(self, key: Hashable) -> None:
        self._order.pop(key, None)

    def candidates(self) -> Iterator[Hashable]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)


class MRUCachePolicy(LRUCachePolicy):
    """Evicts the most recently used key (good for one-pass scans larger than the tier)."""

    def candidates(self) -> Iterator[Hashable]:
        return reversed(self._order)
