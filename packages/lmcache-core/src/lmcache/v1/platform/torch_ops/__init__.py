"""The torch baseline for every ``DeviceOps`` op: plain torch, any device, no custom kernels.

Callers go through ``lmcache.device_ops`` (a ``DeviceOps`` instance that delegates here
unless a backend binds a native replacement); import this package directly only to fall back
to the generic semantics from inside a backend.
"""

from lmcache.v1.platform.torch_ops._kv_format import KVFormatSpec, _format_spec
from lmcache.v1.platform.torch_ops._tensor_from_ptr import (
    _copy_bytes_with_tensor,
    _get_copy_lib,
    _tensor_from_ptr,
    tensor_from_ptr,
)
from lmcache.v1.platform.torch_ops.cachegen_kernels import (
    calculate_cdf,
    decode_fast_new,
    decode_fast_prefsum,
    encode_fast_new,
)
from lmcache.v1.platform.torch_ops.completion_recorder import (
    drain_recorded_completions,
    record_completion_on_stream,
)
from lmcache.v1.platform.torch_ops.event_recorder import (
    drain_recorded_events,
    record_event_on_stream,
)
from lmcache.v1.platform.torch_ops.mem_alloc import (
    alloc_hugepage_pinned_numa_ptr,
    alloc_hugepage_pinned_ptr,
    alloc_numa_ptr,
    alloc_pinned_numa_ptr,
    alloc_pinned_ptr,
    alloc_shm_pinned_ptr,
    batched_memcpy,
    free_hugepage_pinned_numa_ptr,
    free_hugepage_pinned_ptr,
    free_numa_ptr,
    free_pinned_numa_ptr,
    free_pinned_ptr,
    free_shm_pinned_ptr,
)
from lmcache.v1.platform.torch_ops.mem_kernels import (
    lmcache_memcpy_async,
    load_and_reshape_flash,
    multi_layer_kv_transfer,
    multi_layer_kv_transfer_unilateral,
    reshape_and_cache_back_flash,
    single_layer_kv_transfer,
    single_layer_kv_transfer_sgl,
)
from lmcache.v1.platform.torch_ops.mp_mem_kernels import multi_layer_block_kv_transfer
from lmcache.v1.platform.torch_ops.pos_kernels import (
    rotary_embedding_k_fused,
    rotary_embedding_k_fused_strided,
)
from lmcache.v1.platform.torch_ops.utils import get_gpu_pci_bus_id

__all__ = [
    "KVFormatSpec",
    "_copy_bytes_with_tensor",
    "_format_spec",
    "_get_copy_lib",
    "_tensor_from_ptr",
    "alloc_hugepage_pinned_numa_ptr",
    "alloc_hugepage_pinned_ptr",
    "alloc_numa_ptr",
    "alloc_pinned_numa_ptr",
    "alloc_pinned_ptr",
    "alloc_shm_pinned_ptr",
    "batched_memcpy",
    "calculate_cdf",
    "decode_fast_new",
    "decode_fast_prefsum",
    "drain_recorded_completions",
    "drain_recorded_events",
    "encode_fast_new",
    "free_hugepage_pinned_numa_ptr",
    "free_hugepage_pinned_ptr",
    "free_numa_ptr",
    "free_pinned_numa_ptr",
    "free_pinned_ptr",
    "free_shm_pinned_ptr",
    "get_gpu_pci_bus_id",
    "lmcache_memcpy_async",
    "load_and_reshape_flash",
    "multi_layer_block_kv_transfer",
    "multi_layer_kv_transfer",
    "multi_layer_kv_transfer_unilateral",
    "record_completion_on_stream",
    "record_event_on_stream",
    "reshape_and_cache_back_flash",
    "rotary_embedding_k_fused",
    "rotary_embedding_k_fused_strided",
    "single_layer_kv_transfer",
    "single_layer_kv_transfer_sgl",
    "tensor_from_ptr",
]
