"""``noop``: never evicts (upstream's name).

Upstream uses it where L1 is only a write buffer that something else empties.  Here a
tier with it keeps every key until it is removed explicitly (``/cache/clear``, a
``remove``); once the tier is full, new data is refused at once (an allocation returns
``None``, a put is dropped and logged) and nothing already stored is touched.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator

from lmcache.v1.storage_backend.cache_policy.base_policy import BaseCachePolicy


class NoopCachePolicy(BaseCachePolicy[Hashable]):
    """Offers no eviction candidates; only counts the keys it was told about."""

    evicts = False

    def __init__(self) -> None:
        self._keys: set[Hashable] = set()

    def on_put(self, key: Hashable) -> None:
        self._keys.add(key)

    def on_hit(self, key: Hashable) -> None:
        return None

    def on_remove(self, key: Hashable) -> None:
        self._keys.discard(key)

    def candidates(self) -> Iterator[Hashable]:
        return iter(())

    def __len__(self) -> int:
        return len(self._keys)
