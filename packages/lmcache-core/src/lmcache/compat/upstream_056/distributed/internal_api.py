"""Upstream's ``lmcache.v1.distributed.internal_api``: the eviction and quota value types.

:class:`EvictionAction` and :class:`EvictionDestination` are what upstream's eviction
policies answer (:mod:`.eviction`); :class:`QuotaEntry` is the product's
(:mod:`lmcache.v1.storage_backend.quota`).
"""

from __future__ import annotations

from lmcache.compat.upstream_056.distributed.eviction import EvictionAction, EvictionDestination
from lmcache.v1.storage_backend.quota import QuotaEntry

__all__ = ["EvictionAction", "EvictionDestination", "QuotaEntry"]
