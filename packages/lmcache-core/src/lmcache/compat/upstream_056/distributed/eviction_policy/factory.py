"""Upstream's ``CreateEvictionPolicy``: a policy from an eviction config's name."""

from __future__ import annotations

from typing import Any

from lmcache.compat.upstream_056.distributed.eviction import EvictionPolicy
from lmcache.compat.upstream_056.distributed.eviction_policy.adapter import ProductPolicyAdapter
from lmcache.compat.upstream_056.distributed.eviction_policy.arc import ARCEvictionPolicy
from lmcache.compat.upstream_056.distributed.eviction_policy.isolated_lru import (
    IsolatedLRUEvictionPolicy,
)
from lmcache.compat.upstream_056.distributed.eviction_policy.lru import LRUEvictionPolicy
from lmcache.compat.upstream_056.distributed.eviction_policy.noop import NoOpEvictionPolicy
from lmcache.v1.storage_backend.cache_policy import get_cache_policy

_UPSTREAM = {
    "LRU": LRUEvictionPolicy,
    "ARC": ARCEvictionPolicy,
    "IsolatedLRU": IsolatedLRUEvictionPolicy,
    "noop": NoOpEvictionPolicy,
}
_OURS = ("FIFO", "LFU", "MRU")


def CreateEvictionPolicy(eviction_config: Any) -> EvictionPolicy:
    """The policy ``eviction_config.eviction_policy`` names: upstream's four (spelled as
    upstream spells them) or ours (FIFO, LFU, MRU).

    Raises:
        ValueError: any other name.
    """
    name = eviction_config.eviction_policy
    if name in _UPSTREAM:
        return _UPSTREAM[name]()
    if name in _OURS:
        return ProductPolicyAdapter(get_cache_policy(name))
    raise ValueError(f"Unsupported eviction policy: {name}")


__all__ = ["CreateEvictionPolicy"]
