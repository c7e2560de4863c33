"""``IsolatedLRU`` (upstream's name): LRU within each tenant (``cache_salt``), with quotas
deciding which tenant gives up space.

When the tier needs room, victims come first from the tenants over their quota (the
allowlist lens, :meth:`QuotaManager.get_limit_bytes`: a tenant with no quota has a limit
of 0), the most-over tenant first, and each of them gives up only its own least recently
used keys and only down to its limit.  Only when no tenant is over quota any more (the
quotas add up to more than the tier holds) does the tier fall back to plain LRU across
all tenants, so a full tier never refuses data a plain LRU tier would accept.

A key's tenant is :func:`~lmcache.v1.storage_backend.cache_salt.salt_of`; its size and
each tenant's bytes come from the tier's :class:`~lmcache.v1.storage_backend.quota.SaltUsage`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator

from lmcache.v1.storage_backend.cache_policy.base_policy import BaseCachePolicy
from lmcache.v1.storage_backend.cache_salt import salt_of
from lmcache.v1.storage_backend.quota import QuotaManager, SaltUsage


class IsolatedLRUCachePolicy(BaseCachePolicy[Hashable]):
    """One LRU order per salt plus the global one (for the fallback).

    Without a quota registry every tenant is unlimited and the order is plain LRU;
    without a usage tracker every key counts as one byte.
    """

    def __init__(
        self,
        quotas: QuotaManager | None = None,
        usage: SaltUsage | None = None,
        salt_fn: Callable[[Hashable], str] = salt_of,
    ) -> None:
        self._quotas = quotas
        self._usage = usage
        self._salt_fn = salt_fn
        self._order: OrderedDict[Hashable, str] = OrderedDict()
        self._per_salt: dict[str, OrderedDict[Hashable, None]] = {}

    def on_put(self, key: Hashable) -> None:
        salt = self._order.get(key)
        if salt is None:
            salt = self._salt_fn(key)
            self._order[key] = salt
            self._per_salt.setdefault(salt, OrderedDict())[key] = None
        else:
            self._touch(key, salt)

    def on_hit(self, key: Hashable) -> None:
        salt = self._order.get(key)
        if salt is not None:
            self._touch(key, salt)

    def _touch(self, key: Hashable, salt: str) -> None:
        self._order.move_to_end(key)
        self._per_salt[salt].move_to_end(key)

    def on_remove(self, key: Hashable) -> None:
        salt = self._order.pop(key, None)
        if salt is None:
            return
        bucket = self._per_salt[salt]
        del bucket[key]
        if not bucket:
            del self._per_salt[salt]

    def _size(self, key: Hashable) -> int:
        return self._usage.size_of(key) if self._usage is not None else 1

    def _salt_bytes(self, salt: str) -> int:
        if self._usage is not None:
            return self._usage.bytes_of(salt)
        return len(self._per_salt.get(salt, ()))

    def over_quota(self) -> list[tuple[str, int]]:
        """(salt, bytes over its limit) of every tenant over quota, most over first."""
        if self._quotas is None:
            return []
        over = []
        for salt in self._per_salt:
            excess = self._salt_bytes(salt) - self._quotas.get_limit_bytes(salt)
            if excess > 0:
                over.append((salt, excess))
        over.sort(key=lambda item: item[1], reverse=True)
        return over

    def candidates(self) -> Iterator[Hashable]:
        yielded: set[Hashable] = set()
        for key in self._over_quota_keys():
            yielded.add(key)
            yield key
        for key in self._order:
            if key not in yielded:
                yield key

    def ahead_of_need_candidates(self) -> Iterator[Hashable]:
        # Headroom is no reason to take a tenant below its quota: only the excess goes.
        return self._over_quota_keys()

    def _over_quota_keys(self) -> Iterator[Hashable]:
        for salt, excess in self.over_quota():
            for key in self._per_salt[salt]:
                if excess <= 0:
                    break
                excess -= self._size(key)
                yield key

    def __len__(self) -> int:
        return len(self._order)

    def tracked_salts(self) -> list[str]:
        """Salts with at least one key here."""
        return list(self._per_salt)

    def keys_of(self, cache_salt: str) -> list[Hashable]:
        """``cache_salt``'s keys, least recently used first (a copy)."""
        return list(self._per_salt.get(cache_salt, ()))
