"""One adapter from upstream's eviction-policy interface to a product policy.

Upstream's storage manager tells a policy about keys (``on_keys_*``) and asks it for a
fraction of its keys (``get_eviction_actions``); the product policy keeps the order and
yields victims.  What upstream's interface adds is kept here:

* a batch of keys is applied in reverse, so a request's later chunks become the earlier
  victims (evicting an early chunk would orphan every later one of the prefix);
* a key reserved for a write enters the policy at once, and the write's completion does
  not count as a second reference;
* a key handed out as a victim and then reported removed is an *eviction* (ARC keeps a
  ghost of it); any other removal is forgotten outright.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from lmcache.compat.upstream_056.distributed.eviction import (
    EvictionAction,
    EvictionDestination,
    EvictionPolicy,
)
from lmcache.v1.storage_backend.cache_policy import BaseCachePolicy


class ProductPolicyAdapter(EvictionPolicy):
    """Upstream's :class:`EvictionPolicy` over a product
    :class:`~lmcache.v1.storage_backend.cache_policy.BaseCachePolicy` (thread-safe: one
    lock around every call, as upstream's policies)."""

    def __init__(
        self,
        policy: BaseCachePolicy[Any],
        default_destination: EvictionDestination = EvictionDestination.DISCARD,
    ) -> None:
        self._lock = threading.Lock()
        self._policy = policy
        self._destinations: list[EvictionDestination] = []
        self._default_destination = default_destination
        self._pending_admissions: set[Hashable] = set()
        self._pending_evictions: set[Hashable] = set()

    @property
    def product_policy(self) -> BaseCachePolicy[Any]:
        """The product policy this adapter drives."""
        return self._policy

    def register_eviction_destination(self, destination: EvictionDestination) -> None:
        with self._lock:
            if destination not in self._destinations:
                self._destinations.append(destination)

    def on_keys_created(self, keys: list[Any]) -> None:
        with self._lock:
            for key in reversed(keys):
                self._pending_evictions.discard(key)
                if key in self._pending_admissions:
                    self._pending_admissions.discard(key)  # its reservation already counted
                    continue
                self._policy.on_put(key)

    def on_keys_reserved(self, keys: list[Any]) -> None:
        with self._lock:
            for key in reversed(keys):
                self._pending_evictions.discard(key)
                self._pending_admissions.add(key)
                self._policy.on_put(key)

    def on_keys_touched(self, keys: list[Any]) -> None:
        with self._lock:
            for key in reversed(keys):
                self._policy.on_hit(key)

    def on_keys_removed(self, keys: list[Any]) -> None:
        with self._lock:
            for key in keys:
                if key in self._pending_evictions:
                    self._policy.on_evict(key)
                else:
                    self._policy.on_remove(key)
                self._pending_evictions.discard(key)
                self._pending_admissions.discard(key)

    def _pool(self, cache_salt: str | None) -> tuple[int, Iterable[Any]]:
        """(how many keys the ratio applies to, the victims in order)."""
        return len(self._policy), self._policy.candidates()

    def get_eviction_actions(
        self,
        expected_ratio: float,
        key_eligible_filter: Callable[[Any], bool] | None = None,
        cache_salt: str | None = None,
    ) -> list[EvictionAction]:
        with self._lock:
            size, pool = self._pool(cache_salt)
            ratio = max(0.0, min(1.0, expected_ratio))
            target = int(size * ratio)
            if ratio > 0 and target == 0 and size > 0:
                target = 1  # a positive ratio evicts something whenever it can
            victims: list[Any] = []
            if target:
                for key in pool:
                    if key_eligible_filter is not None and not key_eligible_filter(key):
                        continue
                    victims.append(key)
                    if len(victims) >= target:
                        break
            if not victims:
                return []
            self._pending_evictions.update(victims)
            destination = self._destinations[0] if self._destinations else self._default_destination
            return [EvictionAction(destination=destination, keys=victims)]

    def get_num_tracked_keys(self) -> int:
        with self._lock:
            return len(self._policy)

    def get_eviction_candidates(self, count: int) -> list[Any]:
        """The next ``count`` victims, without creating an action."""
        with self._lock:
            found: list[Any] = []
            for key in self._policy.candidates():
                if len(found) >= count:
                    break
                found.append(key)
            return found


__all__ = ["ProductPolicyAdapter"]
