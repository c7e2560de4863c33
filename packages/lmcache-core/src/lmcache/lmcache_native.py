"""Upstream's ``lmcache.lmcache_native`` names, for code written against upstream 0.5.6.

Upstream builds this module as a C++ extension holding the KV-transfer enums, the
descriptor structs and the format predicates, plus native helpers of its MP server.
lmcache-core has no core extension:

* the enums, structs and predicates are the pure-Python ones of
  :mod:`lmcache.v1.platform.ops_types`, which every backend's ``DeviceOps`` uses, so a
  value taken from here is interchangeable with one from ``device_ops``;
* ``Bitmap`` and ``PeriodicEventNotifier`` are pure-Python equivalents with upstream's
  API and semantics (:mod:`lmcache.v1.native_compat`); upstream's test suites for its
  MP server feature-detect these two with ``hasattr``.

Upstream's other native helpers (``TTLLock``, ``ParallelPatternMatcher``,
``RangePatternMatcher``, ``fold`` / ``unfold``) are not provided; ``hasattr`` sees them
absent.
"""

from lmcache.v1.native_compat import Bitmap, PeriodicEventNotifier
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
    "PeriodicEventNotifier",
    "TransferDirection",
    "is_cross_layer",
    "is_kv_list",
    "is_kv_second_tuple",
    "is_layer_list",
    "is_mla",
]
