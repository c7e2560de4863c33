"""Eviction policies for the bounded tiers (L1 and the disk tier), by name.

Names as documented (``cache_policy`` key, ``--eviction-policy``), any case accepted:
``LRU``, ``FIFO``, ``LFU``, ``MRU``, and upstream's ``ARC``, ``IsolatedLRU`` (per-tenant
LRU ruled by quotas) and ``noop`` (never evicts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmcache.v1.config.keys import canonical_cache_policy
from lmcache.v1.storage_backend.cache_policy.arc import ARCCachePolicy
from lmcache.v1.storage_backend.cache_policy.base_policy import BaseCachePolicy
from lmcache.v1.storage_backend.cache_policy.fifo import FIFOCachePolicy
from lmcache.v1.storage_backend.cache_policy.isolated_lru import IsolatedLRUCachePolicy
from lmcache.v1.storage_backend.cache_policy.lfu import LFUCachePolicy
from lmcache.v1.storage_backend.cache_policy.lru import LRUCachePolicy, MRUCachePolicy
from lmcache.v1.storage_backend.cache_policy.noop import NoopCachePolicy
from lmcache.v1.storage_backend.quota import QuotaManager, SaltUsage

_Factory = Callable[[QuotaManager | None, SaltUsage | None], BaseCachePolicy[Any]]

_POLICIES: dict[str, _Factory] = {
    "LRU": lambda _q, _u: LRUCachePolicy(),
    "FIFO": lambda _q, _u: FIFOCachePolicy(),
    "LFU": lambda _q, _u: LFUCachePolicy(),
    "MRU": lambda _q, _u: MRUCachePolicy(),
    "ARC": lambda _q, _u: ARCCachePolicy(),
    "IsolatedLRU": lambda quotas, usage: IsolatedLRUCachePolicy(quotas, usage),
    "noop": lambda _q, _u: NoopCachePolicy(),
}


def policy_names() -> list[str]:
    return list(_POLICIES)


def get_cache_policy(
    name: str, *, quotas: QuotaManager | None = None, usage: SaltUsage | None = None
) -> BaseCachePolicy[Any]:
    """A fresh policy by (case-insensitive) name.

    ``quotas`` and ``usage`` (the tier's bytes per salt) are what ``IsolatedLRU`` decides
    by; the other policies ignore them.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    try:
        canonical = canonical_cache_policy(name)
    except ValueError:
        raise ValueError(f"unknown cache_policy {name!r}; choose one of {policy_names()}") from None
    return _POLICIES[canonical](quotas, usage)


__all__ = [
    "ARCCachePolicy",
    "BaseCachePolicy",
    "FIFOCachePolicy",
    "IsolatedLRUCachePolicy",
    "LFUCachePolicy",
    "LRUCachePolicy",
    "MRUCachePolicy",
    "NoopCachePolicy",
    "get_cache_policy",
    "policy_names",
]
