"""The module ``CpuNativeDeviceOps`` hands to ``DeviceOps.bind_native``.

``bind_native`` overlays every public callable and class found here, so this module holds
exactly the native ops (with the ``torch_ops`` call signatures) and the native plan types,
and nothing else: keep helper imports out of it (or underscore them).

Importing it loads the C++ extension; an ``ImportError`` here means the native path is
unavailable and the backend stays on the torch baseline.
"""

from lmcache_cpu._native import BatchStep, KernelGroupSpec, LaunchVar, StagingCopy
from lmcache_cpu._ops import (
    batched_memcpy,
    calculate_cdf,
    lmcache_memcpy_async,
    load_and_reshape_flash,
    multi_layer_block_kv_transfer,
    multi_layer_kv_transfer,
    multi_layer_kv_transfer_unilateral,
    reshape_and_cache_back_flash,
    single_layer_kv_transfer,
    single_layer_kv_transfer_sgl,
)

__all__ = [
    "BatchStep",
    "KernelGroupSpec",
    "LaunchVar",
    "StagingCopy",
    "batched_memcpy",
    "calculate_cdf",
    "lmcache_memcpy_async",
    "load_and_reshape_flash",
    "multi_layer_block_kv_transfer",
    "multi_layer_kv_transfer",
    "multi_layer_kv_transfer_unilateral",
    "reshape_and_cache_back_flash",
    "single_layer_kv_transfer",
    "single_layer_kv_transfer_sgl",
]
