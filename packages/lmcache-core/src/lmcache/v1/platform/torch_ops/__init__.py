"""The torch baseline for every ``DeviceOps`` op: plain torch, any device, no custom kernels.

Callers go through ``lmcache.device_ops`` (a ``DeviceOps`` instance that delegates here
unless a backend binds a native replacement); import this package directly only to fall back
to the generic semantics from inside a backend.
"""

from lmcache.v1.platform.torch_ops._kv_format import _format_spec
from lmcache.v1.platform.torch_ops._tensor_from_ptr import (
    _copy_bytes_with_tensor,
    _get_copy_lib,
    _tensor_from_ptr,
    tensor_from_ptr,
)
from lmcache.v1.platform.torch_ops.mp_mem_kernels import multi_layer_block_kv_transfer

__all__ = [
    "_copy_bytes_with_tensor",
    "_format_spec",
    "_get_copy_lib",
    "_tensor_from_ptr",
    "multi_layer_block_kv_transfer",
    "tensor_from_ptr",
]
