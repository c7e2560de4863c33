"""Eviction policies for the bounded tiers, selectable by name (``cache_policy``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmcache.v1.storage_backend.cache_policy.base_policy import BaseCachePolicy
from lmcache.v1.storage_backend.cache_policy.fifo import FIFOCachePolicy
from lmcache.v1.storage_backend.cache_policy.lfu import LFUCachePolicy
from lmcache.v1.storage_backend.cache_policy.lru import LRUCachePolicy, MRUCachePolicy

_POLICIES: dict[str, Callable[[], BaseCachePolicy[Any]]] = {
    "LRU": LRUCachePolicy,
    "FIFO": FIFOCachePolicy,
    "LFU": LFUCachePolicy,
    "MRU": MRUCachePolicy,
}


def policy_names() -> list[str]:
    return list(_POLICIES)


def get_cache_policy(name: str) -> BaseCachePolicy[Any]:
    """A fresh policy by (case-insensitive) name: LRU, FIFO, LFU or MRU."""
    try:
        return _POLICIES[name.upper()]()
    except KeyError:
        raise ValueError(f"unknown cache_policy {name!r}; choose one of {policy_names()}") from None


__all__ = [
    "BaseCachePolicy",
    "FIFOCachePolicy",
    "LFUCachePolicy",
    "LRUCachePolicy",
    "MRUCachePolicy",
    "get_cache_policy",
    "policy_names",
]
