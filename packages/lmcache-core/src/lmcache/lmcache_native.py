"""Upstream's ``lmcache.lmcache_native`` names, for code written against upstream 0.5.6.

Upstream builds this module as a C++ extension holding the KV-transfer enums, the
descriptor structs and the format predicates (plus native-only server helpers).
lmcache-core has no core extension: the same names are the pure-Python ones of
:mod:`lmcache.v1.platform.ops_types`, which every backend's ``DeviceOps`` uses, so a value
taken from here is interchangeable with one from ``device_ops``.  Upstream's native-only
server internals (``Bitmap``, ``PeriodicEventNotifier``, ...) are not provided; code that
feature-detects them with ``hasattr`` sees them absent.
"""

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
    "EngineKVFormat",
    "GPUKVFormat",
    "KernelGroupSpec",
    "PageBufferShapeDesc",
    "TransferDirection",
    "is_cross_layer",
    "is_kv_list",
    "is_kv_second_tuple",
    "is_layer_list",
    "is_mla",
]
