"""Views for the torch baseline, plus the kit's checks and geometry under their old names.

The argument checks live in :mod:`lmcache.v1.platform.kv_checks` and the view-free
geometry in :mod:`lmcache.v1.platform.kv_geometry`; this module re-exports both (it
was the plugins' entry point before the kit existed) and adds what only the baseline needs:
engine and LMCache buffers as canonical torch views (:class:`PagedLayout`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmcache.v1.platform.kv_checks import (
    BlockArgs,
    BlockRun,
    Unsupported,
    as_block_ids,
    as_int64_cpu,
    block_runs,
    block_transfer_args,
    blocks_per_object,
    check_block_capacity,
    check_block_id_range,
    check_block_runs,
    check_block_slot,
    check_copy_tensor,
    check_engine_block_size,
    check_memcpy_args,
    check_skip_tokens,
    check_slot_range,
    check_token_coverage,
    falls_back_to,
    is_pointer_tensor,
    pointer_list,
    selected_tokens,
    token_format_spec,
    token_pointer_shape_desc,
    validate_direction,
)
from lmcache.v1.platform.kv_formats import KVFormatSpec, format_spec
from lmcache.v1.platform.kv_geometry import flatten_engine_buffers
from lmcache.v1.platform.kv_pointers import (
    infer_kv_dtype,
    pointer_container,
    pointer_count,
    pointer_tensor_geometry,
)
from lmcache.v1.platform.ops_types import EngineKVFormat, PageBufferShapeDesc
from lmcache.v1.platform.torch_ops._kv_format import (
    PagedLayout,
    Part,
    canonical_object,
    paged_layout_from_tensors,
)
from lmcache.v1.platform.torch_ops._tensor_from_ptr import _host_bytes

__all__ = [
    "BlockArgs",
    "BlockRun",
    "KVFormatSpec",
    "PagedLayout",
    "Part",
    "Unsupported",
    "as_block_ids",
    "as_int64_cpu",
    "as_token_rows",
    "block_runs",
    "block_transfer_args",
    "blocks_per_object",
    "canonical_object",
    "check_block_capacity",
    "check_block_id_range",
    "check_block_runs",
    "check_block_slot",
    "check_copy_tensor",
    "check_engine_block_size",
    "check_memcpy_args",
    "check_skip_tokens",
    "check_slot_range",
    "check_token_coverage",
    "falls_back_to",
    "flatten_engine_buffers",
    "format_spec",
    "infer_kv_dtype",
    "is_pointer_tensor",
    "paged_layout",
    "paged_layout_from_pointers",
    "paged_layout_from_tensors",
    "pointer_container",
    "pointer_count",
    "pointer_list",
    "pointer_tensor_geometry",
    "selected_tokens",
    "separate_kv_layout",
    "separate_kv_spec",
    "single_layer_lmcache_view",
    "token_format_spec",
    "token_layout",
    "token_pointer_shape_desc",
    "validate_direction",
]


def as_token_rows(buffer: torch.Tensor) -> torch.Tensor:
    """A per-token buffer as ``[tokens, NH, HS]`` (a 2-d buffer is one head wide)."""
    return buffer.unsqueeze(1) if buffer.dim() == 2 else buffer.flatten(0, -3)


def single_layer_lmcache_view(lmc: torch.Tensor, kv_size: int, token_major: bool) -> torch.Tensor:
    """The single-layer LMCache buffer as ``[KV, 1, T, D]``."""
    if kv_size == 1:
        return lmc.reshape(1, 1, lmc.shape[-2], lmc.shape[-1]) if lmc.dim() == 2 else lmc
    planes = lmc.transpose(0, 1) if token_major else lmc
    return planes.unsqueeze(1)


def separate_kv_spec(key_cache: torch.Tensor) -> KVFormatSpec:
    """The format of one layer held as separate K and V caches (blocked or flat tokens)."""
    fmt = (
        EngineKVFormat.TWO_X_NL_X_NB_BS_NH_HS
        if key_cache.dim() == 4
        else EngineKVFormat.TWO_X_NL_X_NBBS_NH_HS
    )
    return format_spec(fmt)


def separate_kv_layout(key_cache: torch.Tensor, value_cache: torch.Tensor) -> PagedLayout:
    """Layout for one layer held as separate K and V caches."""
    return paged_layout_from_tensors([[key_cache], [value_cache]], separate_kv_spec(key_cache), 1)


def token_layout(
    paged: Any,
    spec: KVFormatSpec,
    key_value: torch.Tensor,
    device: torch.device | str,
    page_buffer_size: int,
    block_size: int,
    head_size: int,
    block_stride_elems: int,
) -> PagedLayout:
    """The engine layout for a slot-mapped op, from tensors or a 1-d pointer tensor."""
    if not (isinstance(paged, torch.Tensor) and paged.dim() == 1):
        return paged_layout_from_tensors(paged, spec, block_size if block_size > 0 else 1)
    desc = token_pointer_shape_desc(
        spec, key_value, page_buffer_size, block_size, head_size, block_stride_elems
    )
    return paged_layout(paged, spec, desc, device)


def paged_layout_from_pointers(
    pointers: Sequence[int],
    spec: KVFormatSpec,
    desc: PageBufferShapeDesc,
    device: torch.device | str,
) -> PagedLayout:
    """Parts for engine buffers given as raw host pointers, shaped by ``shape_desc``.

    Pointer order: ``layers``/``cross`` one per layer; ``kv_layers`` every K then every V;
    ``layer_tuples`` layer-major (``K_0, V_0, K_1, ...`` or the planes of layer 0 first).
    MLA planes rebuilt from pointers share ``shape_desc.hs`` equally.
    """
    if torch.device(device).type != "cpu":
        raise ValueError(
            "raw-pointer engine buffers are host-only in the torch baseline; pass tensors"
        )
    dtype = infer_kv_dtype(desc)
    planes = pointer_count(spec, len(pointers), int(desc.nl))
    shape, strides = pointer_tensor_geometry(spec, desc, planes if spec.tuple_axis == "HS" else 1)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    span = 1 + sum((s - 1) * st for s, st in zip(shape, strides))
    # One host view over the whole address range lets evenly spaced layers merge into a
    # single strided view (see _kv_format._merge_layer_parts).
    lo = min(pointers)
    whole = _host_bytes(lo, max(pointers) - lo + span * itemsize)
    views = []
    for ptr in pointers:
        offset = ptr - lo
        if offset % itemsize:
            views.append(_host_bytes(ptr, span * itemsize).view(dtype).as_strided(shape, strides))
        else:
            views.append(whole.view(dtype).as_strided(shape, strides, offset // itemsize))
    paged = pointer_container(spec, views, int(desc.nl))
    return paged_layout_from_tensors(paged, spec, int(desc.bs))


def paged_layout(
    paged: Any, spec: KVFormatSpec, desc: PageBufferShapeDesc, device: torch.device | str
) -> PagedLayout:
    """Parts for engine buffers given either as tensors or as a 1-d pointer tensor."""
    if is_pointer_tensor(paged):
        return paged_layout_from_pointers(pointer_list(paged), spec, desc, device)
    return paged_layout_from_tensors(paged, spec, int(desc.bs))
