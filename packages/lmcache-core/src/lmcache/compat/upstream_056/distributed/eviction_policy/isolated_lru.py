"""Upstream's ``IsolatedLRUEvictionPolicy``: the product's per-salt LRU, scoped to one
``cache_salt`` per call (upstream's controller picks the over-quota salts itself)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from lmcache.compat.upstream_056.distributed.eviction import EvictionDestination
from lmcache.compat.upstream_056.distributed.eviction_policy.adapter import ProductPolicyAdapter
from lmcache.compat.upstream_056.distributed.key_encoding import decode_key, encode_key
from lmcache.v1.storage_backend.cache_policy import IsolatedLRUCachePolicy


def _salt_field(key: Any) -> str:
    """Upstream's keys carry the salt as a field."""
    return str(key.cache_salt)


class IsolatedLRUEvictionPolicy(ProductPolicyAdapter):
    """One LRU per ``cache_salt``; eviction always names the salt."""

    def __init__(
        self,
        default_destination: EvictionDestination = EvictionDestination.DISCARD,
        section_name: str = "lru_order",
    ) -> None:
        self._section_name = section_name
        self._isolated = IsolatedLRUCachePolicy(salt_fn=_salt_field)
        super().__init__(self._isolated, default_destination)

    @property
    def support_isolation(self) -> bool:
        return True

    @property
    def name(self) -> str:
        return self._section_name

    def _pool(self, cache_salt: str | None) -> tuple[int, Iterable[Any]]:
        if cache_salt is None:
            raise ValueError(
                "IsolatedLRUEvictionPolicy.get_eviction_actions needs a cache_salt: it "
                "evicts within one tenant and has no global order to fall back to"
            )
        keys = self._isolated.keys_of(cache_salt)
        return len(keys), keys

    def get_num_tracked_keys(self, cache_salt: str | None = None) -> int:  # type: ignore[override]
        with self._lock:
            if cache_salt is None:
                return len(self._isolated)
            return len(self._isolated.keys_of(cache_salt))

    def get_tracked_salts(self) -> list[str]:
        with self._lock:
            return self._isolated.tracked_salts()

    def capture(self) -> Mapping[str, object]:
        """``{"buckets": {salt: [encoded key, ...]}}``, each least recently used first."""
        with self._lock:
            return {
                "buckets": {
                    salt: [encode_key(key) for key in self._isolated.keys_of(salt)]
                    for salt in self._isolated.tracked_salts()
                }
            }

    def restore(self, state: Mapping[str, object]) -> None:
        """Replace every bucket's order with a :meth:`capture` value."""
        buckets = cast("Mapping[str, list[object]]", state["buckets"])
        fresh = IsolatedLRUCachePolicy(salt_fn=_salt_field)
        for encoded_keys in buckets.values():
            for encoded in encoded_keys:
                fresh.on_put(decode_key(encoded))
        with self._lock:
            self._isolated = fresh
            self._policy = fresh
            self._pending_admissions.clear()
            self._pending_evictions.clear()


__all__ = ["IsolatedLRUEvictionPolicy"]
