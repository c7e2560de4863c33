"""Upstream's ``lmcache.v1.distributed.eviction_policy``: the product's policies
(:mod:`lmcache.v1.storage_backend.cache_policy`) behind upstream's interface."""

from __future__ import annotations

from lmcache.compat.upstream_056.distributed.eviction_policy.arc import ARCEvictionPolicy
from lmcache.compat.upstream_056.distributed.eviction_policy.factory import CreateEvictionPolicy
from lmcache.compat.upstream_056.distributed.eviction_policy.isolated_lru import (
    IsolatedLRUEvictionPolicy,
)
from lmcache.compat.upstream_056.distributed.eviction_policy.lru import LRUEvictionPolicy
from lmcache.compat.upstream_056.distributed.eviction_policy.noop import NoOpEvictionPolicy

__all__ = [
    "ARCEvictionPolicy",
    "CreateEvictionPolicy",
    "IsolatedLRUEvictionPolicy",
    "LRUEvictionPolicy",
    "NoOpEvictionPolicy",
]
