"""The module ``CudaDeviceOps`` hands to ``DeviceOps.bind_native``.

``bind_native`` overlays every public callable and class found here, so this module holds
exactly the native ops (``torch_ops`` names and signatures) and nothing else. Importing it
loads the CUDA extension; an ``ImportError`` means the backend stays on the torch baseline.
"""

from lmcache_cuda._ops import (
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
    "lmcache_memcpy_async",
    "load_and_reshape_flash",
    "multi_layer_block_kv_transfer",
    "multi_layer_kv_transfer",
    "multi_layer_kv_transfer_unilateral",
    "reshape_and_cache_back_flash",
    "single_layer_kv_transfer",
    "single_layer_kv_transfer_sgl",
]
