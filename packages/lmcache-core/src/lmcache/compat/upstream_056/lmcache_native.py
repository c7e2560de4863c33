"""Upstream's ``lmcache.lmcache_native`` names, for code written against upstream 0.5.6.

Upstream builds this module as a C++ extension holding the KV-transfer enums, the
descriptor structs and the format predicates, plus native helpers of its MP server.
lmcache-core has no core extension:

* the enums, structs and predicates are the pure-Python ones of
  :mod:`lmcache.v1.platform.ops_types`, which every backend's ``DeviceOps`` uses, so a
  value taken from here is interchangeable with one from ``device_ops``;
* ``Bitmap``, ``PeriodicEventNotifier``, ``TTLLock``, ``ParallelPatternMatcher`` and
  ``RangePatternMatcher`` are pure-Python equivalents with upstream's API and semantics
  (:mod:`upstream_056.native_compat`); upstream's test suites for its MP server and for
  ``lmcache_native`` itself feature-detect them with ``hasattr``.

Upstream's ``fold`` / ``unfold`` and ``fold_grouped`` / ``unfold_grouped`` (folding
per-chunk presence bitmaps into servable prefix lengths, for its MP server's lookups) are
not provided; ``hasattr`` sees them absent.
"""

from lmcache.compat.upstream_056.native_compat import (
    Bitmap,
    ParallelPatternMatcher,
    PeriodicEventNotifier,
    RangePatternMatcher,
    TTLLock,
)
from lmcache.v1.platform.ops_types import (
    EngineKVFormat,
    GPUKVFormat,
    KernelGroupSpec,
    PageBufferShapeDesc,
    TransferDirection,
    is_cross_layer,
    is_kv_list,
    is_kv_second_tuple,
    is_layer_list,
    is_mla,
)

__all__ = [
    "Bitmap",
    "EngineKVFormat",
    "GPUKVFormat",
    "KernelGroupSpec",
    "PageBufferShapeDesc",
    "ParallelPatternMatcher",
    "PeriodicEventNotifier",
    "RangePatternMatcher",
    "TTLLock",
    "TransferDirection",
    "is_cross_layer",
    "is_kv_list",
    "is_kv_second_tuple",
    "is_layer_list",
    "is_mla",
]
