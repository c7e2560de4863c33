"""Least-frequently-used, ties broken by insertion order within a frequency."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator

from lmcache.v1.storage_backend.cache_policy.base_policy import BaseCachePolicy


class LFUCachePolicy(BaseCachePolicy[Hashable]):
    """Evicts the key read the fewest times; O(1) updates via frequency buckets."""

    def __init__(self) -> None:
        self._freq: dict[Hashable, int] = {}
        self._buckets: dict[int, OrderedDict[Hashable, None]] = {}

    def _bucket_add(self, key: Hashable, freq: int) -> None:
        self._buckets.setdefault(freq, OrderedDict())[key] = None

    def _bucket_drop(self, key: Hashable, freq: int) -> None:
        bucket = self._buckets[freq]
        del bucket[key]
        if not bucket:
            del self._buckets[freq]

    def on_put(self, key: Hashable) -> None:
        old = self._freq.get(key)
        if old is not None:
            self._bucket_drop(key, old)
        self._freq[key] = 1
        self._bucket_add(key, 1)

    def on_hit(self, key: Hashable) -> None:
        old = self._freq.get(key)
        if old is None:
            return
        self._bucket_drop(key, old)
        self._freq[key] = old + 1
        self._bucket_add(key, old + 1)

    def on_remove(self, key: Hashable) -> None:
        old = self._freq.pop(key, None)
        if old is not None:
            self._bucket_drop(key, old)

    def candidates(self) -> Iterator[Hashable]:
        for freq in sorted(self._buckets):
            yield from self._buckets[freq]

    def __len__(self) -> int:
        return len(self._freq)
