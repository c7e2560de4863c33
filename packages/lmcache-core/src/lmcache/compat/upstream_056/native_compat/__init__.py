"""Pure-Python counterparts of upstream LMCache 0.5.6's native (C++) server helpers.

Upstream's ``lmcache.lmcache_native`` extension holds, besides the KV-format enums, a few
general-purpose helpers its MP server is written against (a bitmap, a periodic fd
notifier, a counting lock with a TTL, integer-sequence pattern matchers).  Code written for upstream
feature-detects them on ``lmcache.lmcache_native`` (its test suites skip without them),
so they are provided here, one per module, with upstream's Python API and semantics,
and re-exported from :mod:`upstream_056.lmcache_native`.  ``Bitmap`` is the product's
(:mod:`lmcache.v1.storage_backend.l2_adapters.bitmap`: L2 adapters answer with one).
"""

from lmcache.compat.upstream_056.native_compat.bitmap import Bitmap
from lmcache.compat.upstream_056.native_compat.pattern_matcher import (
    ParallelPatternMatcher,
    RangePatternMatcher,
)
from lmcache.compat.upstream_056.native_compat.periodic_event_notifier import PeriodicEventNotifier
from lmcache.compat.upstream_056.native_compat.ttl_lock import TTLLock

__all__ = [
    "Bitmap",
    "ParallelPatternMatcher",
    "PeriodicEventNotifier",
    "RangePatternMatcher",
    "TTLLock",
]
