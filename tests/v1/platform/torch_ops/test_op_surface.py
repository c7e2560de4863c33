"""Every op name of the upstream DeviceOps surface (facts §3.2) is a public baseline callable."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from lmcache.v1.platform import torch_ops

# From ../shared/reference/lmcache-0.5.6-facts.md §3.2 "Instance op methods".
DEVICE_OPS_NAMES = [
    "alloc_hugepage_pinned_numa_ptr", "alloc_hugepage_pinned_ptr", "alloc_numa_ptr",
    "alloc_pinned_numa_ptr", "alloc_pinned_ptr", "alloc_shm_pinned_ptr",
    "free_hugepage_pinned_numa_ptr", "free_hugepage_pinned_ptr", "free_numa_ptr",
    "free_pinned_numa_ptr", "free_pinned_ptr", "free_shm_pinned_ptr",
    "tensor_from_ptr", "multi_layer_block_kv_transfer", "multi_layer_kv_transfer",
    "multi_layer_kv_transfer_unilateral", "single_layer_kv_transfer",
    "single_layer_kv_transfer_sgl", "load_and_reshape_flash", "reshape_and_cache_back_flash",
    "calculate_cdf", "decode_fast_new", "decode_fast_prefsum", "encode_fast_new",
    "drain_recorded_completions", "drain_recorded_events", "record_completion_on_stream",
    "record_event_on_stream", "batched_memcpy", "get_gpu_pci_bus_id", "lmcache_memcpy_async",
    "rotary_embedding_k_fused", "rotary_embedding_k_fused_strided",
]  # fmt: skip


@pytest.mark.parametrize("name", DEVICE_OPS_NAMES)
def test_op_is_a_public_baseline_callable(name: str) -> None:
    assert name in torch_ops.__all__
    assert callable(getattr(torch_ops, name))


@pytest.mark.parametrize("name", DEVICE_OPS_NAMES)
def test_op_is_reachable_through_the_fixture(ops: Any, name: str) -> None:
    assert callable(getattr(ops, name))


def test_block_transfer_signature_mirrors_the_binding() -> None:
    params = list(inspect.signature(torch_ops.multi_layer_block_kv_transfer).parameters)
    assert params == [
        "paged_buffer_ptrs_tensor", "lmcache_objects_ptrs", "block_ids", "device", "direction",
        "shape_desc", "lmcache_chunk_size", "engine_kv_format", "skip_prefix_n_blocks",
    ]  # fmt: skip


def test_memcpy_parameters_are_positional_only() -> None:
    params = inspect.signature(torch_ops.lmcache_memcpy_async).parameters.values()
    assert [p.kind for p in params] == [inspect.Parameter.POSITIONAL_ONLY] * 6


def test_tensor_from_ptr_is_zero_copy_on_host_and_refuses_devices() -> None:
    import torch

    base = torch.arange(12, dtype=torch.float32)
    view = torch_ops.tensor_from_ptr(base.data_ptr(), (3, 4), torch.float32, "cpu")
    view[1, 1] = -1
    assert base[5] == -1
    with pytest.raises(ValueError, match="raw pointers"):
        torch_ops.tensor_from_ptr(base.data_ptr(), (3, 4), torch.float32, "cuda")


def test_pci_bus_id_is_none_without_a_gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        assert torch_ops.get_gpu_pci_bus_id(0) is None
