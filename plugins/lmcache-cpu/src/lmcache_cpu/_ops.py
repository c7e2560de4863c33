"""Python faces of the native kernels, with the exact ``torch_ops`` call signatures.

Each wrapper validates its arguments the way the torch baseline does (same exception types
and messages, checked in the same order), turns tensors and pointers into base addresses and
byte strides (:mod:`lmcache_cpu._geometry`), and hands them to ``lmcache_cpu._native`` with
the GIL released there. Inputs the native path does not model (tensors on another device,
exotic dtype reinterpretations, malformed shapes) go to the matching
``lmcache.v1.platform.torch_ops`` function, so the semantics, errors included, stay the
baseline's. Nothing is written before every check has passed.

Two deliberate differences from the baseline: an out-of-range block id or slot raises
:class:`lmcache_cpu.errors.KVIndexError` (an ``IndexError`` that is also a ``ValueError``,
so callers catching the baseline's ``ValueError`` keep working), and a non-contiguous
LMCache buffer or engine head dimension raises ``ValueError`` naming the argument instead
of being copied slowly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.ops_types import EngineKVFormat, TransferDirection
from lmcache.v1.platform.torch_ops import plan
from lmcache_cpu import _native
from lmcache_cpu._geometry import (
    EngineGeometry,
    Unsupported,
    geometry_from_bufs,
    geometry_from_pointers,
    geometry_from_tensors,
    tensor_buf,
)
from lmcache_cpu.errors import KVIndexError

# Symbol dtypes the native CDF reads directly; anything else is converted like the baseline.
_CDF_NATIVE_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_CDF_TOTAL = 32767


# -- block-granular transfer ----------------------------------------------------------


def _object_tokens(obj: Any, index: int, geom: EngineGeometry, chunk: int) -> tuple[int, int]:
    """(address, token capacity) of one LMCache object (a tensor or a raw host pointer)."""
    if not isinstance(obj, torch.Tensor):
        return int(obj), chunk
    arg = f"lmcache_objects_ptrs[{index}]"
    if obj.device.type != "cpu":
        raise Unsupported(f"{arg} is on {obj.device}")
    if not obj.is_contiguous():
        raise ValueError(f"{arg} must be a contiguous tensor (got strides {tuple(obj.stride())})")
    if obj.dim() == 4 and obj.shape[0] != geom.kv_size:
        raise Unsupported(f"{arg} has {obj.shape[0]} KV planes")
    nbytes = obj.numel() * obj.element_size()
    slab = geom.lmcache_slab_bytes()
    if slab <= 0 or nbytes % slab:
        raise Unsupported(f"{arg} does not split into whole tokens")
    return obj.data_ptr(), nbytes // slab


def _engine_geometry(paged: Any, spec: Any, shape_desc: Any, device: Any) -> EngineGeometry:
    root = "paged_buffer_ptrs_tensor"
    if plan.is_pointer_tensor(paged):
        return geometry_from_pointers(plan.pointer_list(paged), spec, shape_desc, device, root)
    return geometry_from_tensors(paged, spec, int(shape_desc.bs), root)


@plan.falls_back_to(torch_ops.multi_layer_block_kv_transfer)
def multi_layer_block_kv_transfer(
    paged_buffer_ptrs_tensor: torch.Tensor | list,
    lmcache_objects_ptrs: list[int] | list[torch.Tensor],
    block_ids: torch.Tensor | list[int],
    device: torch.device | str,
    direction: TransferDirection,
    shape_desc: Any,
    lmcache_chunk_size: int,
    engine_kv_format: EngineKVFormat,
    skip_prefix_n_blocks: int,
) -> None:
    """Native ``multi_layer_block_kv_transfer``; semantics of the torch baseline."""
    spec, direction, skip, chunk, bpo, ids, objects = plan.block_transfer_args(
        lmcache_objects_ptrs,
        block_ids,
        direction,
        shape_desc,
        lmcache_chunk_size,
        engine_kv_format,
        skip_prefix_n_blocks,
    )
    to_engine = direction == TransferDirection.H2D
    plan.check_block_capacity(ids.numel(), bpo, len(objects))
    valid_count, highest, last_slot = _native.block_summary(ids, skip, bpo)
    if valid_count == 0:
        return
    geom = _engine_geometry(paged_buffer_ptrs_tensor, spec, shape_desc, device)
    plan.check_engine_block_size(geom.block_size, shape_desc)
    plan.check_block_id_range(highest, geom.num_blocks)

    num_objects = len(last_slot)
    obj_ptrs: list[int] = []
    obj_tokens: list[int] = []
    for index in range(num_objects):
        if last_slot[index] < 0:  # receives no block (skipped or all padding)
            obj_ptrs.append(0)
            obj_tokens.append(0)
            continue
        ptr, tokens = _object_tokens(objects[index], index, geom, chunk)
        plan.check_block_slot(index, last_slot[index], tokens // geom.block_size, ValueError)
        obj_ptrs.append(ptr)
        obj_tokens.append(tokens)

    es = geom.itemsize
    for group in geom.groups:
        _native.block_kv_copy(
            group.bases,
            group.block_stride * es,
            group.tok_stride * es,
            group.head_stride * es,
            geom.num_blocks,
            geom.block_size,
            geom.num_heads,
            group.width * es,
            obj_ptrs,
            obj_tokens,
            [kv * geom.num_layers + layer for kv, layer in zip(group.kv, group.layers)],
            [col * es for col in group.cols],
            geom.row_elems * es,
            geom.head_width * es,
            ids,
            skip,
            bpo,
            to_engine,
        )


# -- slot-mapped (token-granular) transfers -------------------------------------------


def _token_transfer(
    geom: EngineGeometry,
    lmcache_buffer: Any,
    arg: str,
    slot_mapping: Any,
    direction: Any,
    skip: int = 0,
    page_buffer_size: int = 0,
) -> None:
    to_engine = plan.validate_direction(direction) == TransferDirection.H2D
    if not isinstance(lmcache_buffer, torch.Tensor) or lmcache_buffer.device.type != "cpu":
        raise Unsupported(f"{arg} is not a host tensor")
    lmc = lmcache_buffer
    if lmc.element_size() != geom.itemsize:
        raise Unsupported(f"{arg} reinterprets its dtype")
    if lmc.dtype != geom.dtype:
        lmc = lmc.view(geom.dtype)
    if lmc.dim() == 4 and lmc.shape[0] != geom.kv_size:
        raise Unsupported(f"{arg} has {lmc.shape[0]} KV planes")
    try:
        planes = lmc.view(geom.kv_size, geom.num_layers, -1, geom.row_elems)
    except RuntimeError as exc:
        raise Unsupported(str(exc)) from None
    if geom.row_elems > 1 and planes.stride(3) != 1:
        raise ValueError(f"{arg} must be contiguous in its last (hidden) dimension")
    plan.check_skip_tokens(skip)
    slots = plan.as_int64_cpu(slot_mapping)
    highest, valid_count, last = _native.slot_summary(slots, skip)
    if highest is None:
        return
    plan.check_slot_range(highest, page_buffer_size)
    if valid_count == 0:
        return
    plan.check_token_coverage(last, planes.shape[2])
    num_slots = geom.num_blocks * geom.block_size
    if highest >= num_slots:
        raise KVIndexError(f"slot {highest} is out of range for {num_slots} engine slots")

    es = geom.itemsize
    s_kv, s_layer, s_tok, _ = planes.stride()
    base = planes.data_ptr()
    for group in geom.groups:
        lmc_bases = [
            base + (kv * s_kv + layer * s_layer + col) * es
            for kv, layer, col in zip(group.kv, group.layers, group.cols)
        ]
        _native.slot_kv_copy(
            group.bases,
            group.block_stride * es,
            group.tok_stride * es,
            group.head_stride * es,
            geom.num_blocks,
            geom.block_size,
            geom.num_heads,
            group.width * es,
            lmc_bases,
            s_tok * es,
            geom.head_width * es,
            slots,
            skip,
            to_engine,
        )


def _token_geometry(
    paged: Any,
    spec: Any,
    key_value: Any,
    device: Any,
    page_buffer_size: int,
    block_size: int,
    head_size: int,
    block_stride_elems: int,
) -> EngineGeometry:
    """:func:`plan.token_layout` as native geometry."""
    if not (isinstance(paged, torch.Tensor) and paged.dim() == 1):
        return geometry_from_tensors(
            paged, spec, block_size if block_size > 0 else 1, "key_value_ptrs"
        )
    if not plan.is_pointer_tensor(paged) or not isinstance(key_value, torch.Tensor):
        raise Unsupported("pointer mode the baseline reinterprets")
    desc = plan.token_pointer_shape_desc(
        spec, key_value, page_buffer_size, block_size, head_size, block_stride_elems
    )
    if desc.bs <= 0 or desc.hs <= 0:
        raise Unsupported("degenerate pointer-mode geometry")
    return geometry_from_pointers(plan.pointer_list(paged), spec, desc, device, "key_value_ptrs")


@plan.falls_back_to(torch_ops.multi_layer_kv_transfer)
def multi_layer_kv_transfer(
    key_value: torch.Tensor,
    key_value_ptrs: torch.Tensor | list[torch.Tensor],
    slot_mapping: torch.Tensor,
    paged_memory_device: torch.device,
    page_buffer_size: int,
    direction: TransferDirection,
    engine_kv_format: EngineKVFormat,
    block_size: int = 0,
    head_size: int = 0,
    skip_prefix_n_tokens: int = 0,
    block_stride_elems: int = 0,
) -> None:
    """Native ``multi_layer_kv_transfer``; semantics of the torch baseline."""
    spec = plan.format_spec(engine_kv_format)
    geom = _token_geometry(
        key_value_ptrs,
        spec,
        key_value,
        paged_memory_device,
        page_buffer_size,
        block_size,
        head_size,
        block_stride_elems,
    )
    _token_transfer(
        geom,
        key_value,
        "key_value",
        slot_mapping,
        direction,
        int(skip_prefix_n_tokens),
        int(page_buffer_size),
    )


@plan.falls_back_to(torch_ops.multi_layer_kv_transfer_unilateral)
def multi_layer_kv_transfer_unilateral(
    key_value: torch.Tensor,
    key_value_ptrs: torch.Tensor | list[torch.Tensor],
    slot_mapping: torch.Tensor,
    paged_memory_device: torch.device,
    page_buffer_size: int,
    direction: TransferDirection,
    engine_kv_format: EngineKVFormat,
) -> None:
    """Native ``multi_layer_kv_transfer_unilateral`` (SGLang K list then V list)."""
    spec = plan.format_spec(engine_kv_format)
    if spec.mla:
        multi_layer_kv_transfer(
            key_value,
            key_value_ptrs,
            slot_mapping,
            paged_memory_device,
            page_buffer_size,
            direction,
            engine_kv_format,
        )
        return
    flat = plan.format_spec(EngineKVFormat.TWO_X_NL_X_NBBS_NH_HS)
    paged = key_value_ptrs
    if not (isinstance(paged, torch.Tensor) and paged.dim() == 1):
        paged = [plan.as_token_rows(t) for t in paged]
    geom = _token_geometry(paged, flat, key_value, paged_memory_device, page_buffer_size, 1, 0, 0)
    _token_transfer(geom, key_value, "key_value", slot_mapping, direction, 0, int(page_buffer_size))


@plan.falls_back_to(torch_ops.single_layer_kv_transfer)
def single_layer_kv_transfer(
    lmc_key_value_cache: torch.Tensor,
    vllm_key_value_cache: Any,
    slot_mapping: torch.Tensor,
    direction: TransferDirection,
    engine_kv_format: EngineKVFormat,
    token_major: bool = False,
) -> None:
    """Native ``single_layer_kv_transfer``; semantics of the torch baseline."""
    spec = plan.format_spec(engine_kv_format)
    if spec.container not in ("layers", "layer_tuples"):
        raise Unsupported("not a per-layer format")
    if not isinstance(lmc_key_value_cache, torch.Tensor):
        raise Unsupported("lmc_key_value_cache is not a tensor")
    geom = geometry_from_tensors([vllm_key_value_cache], spec, 1, "vllm_key_value_cache")
    lmc = plan.single_layer_lmcache_view(lmc_key_value_cache, spec.kv_size, token_major)
    _token_transfer(geom, lmc, "lmc_key_value_cache", slot_mapping, direction)


def _separate_kv_geometry(
    key_cache: Any, value_cache: Any, key_arg: str, value_arg: str
) -> EngineGeometry:
    if not isinstance(key_cache, torch.Tensor):
        raise Unsupported(f"{key_arg} is not a tensor")
    items = [
        (tensor_buf(key_cache, key_arg), 0, 0, 0),
        (tensor_buf(value_cache, value_arg), 1, 0, 0),
    ]
    spec = plan.separate_kv_spec(key_cache)
    return geometry_from_bufs(items, spec, 1, f"{key_arg}/{value_arg}")


@plan.falls_back_to(torch_ops.single_layer_kv_transfer_sgl)
def single_layer_kv_transfer_sgl(
    lmc_key_value_cache: torch.Tensor,
    sgl_key_cache: torch.Tensor,
    sgl_value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    direction: TransferDirection,
    token_major: bool = False,
) -> None:
    """Native ``single_layer_kv_transfer_sgl``; semantics of the torch baseline."""
    geom = _separate_kv_geometry(sgl_key_cache, sgl_value_cache, "sgl_key_cache", "sgl_value_cache")
    if not isinstance(lmc_key_value_cache, torch.Tensor):
        raise Unsupported("lmc_key_value_cache is not a tensor")
    lmc = plan.single_layer_lmcache_view(lmc_key_value_cache, 2, token_major)
    _token_transfer(geom, lmc, "lmc_key_value_cache", slot_mapping, direction)


def _flash_layer(
    key_value: Any,
    key_cache: Any,
    value_cache: Any,
    slot_mapping: Any,
    layer_idx: int,
    direction: TransferDirection,
) -> None:
    geom = _separate_kv_geometry(key_cache, value_cache, "key_cache", "value_cache")
    if not isinstance(key_value, torch.Tensor):
        raise Unsupported("key_value is not a tensor")
    lmc = key_value[:, layer_idx : layer_idx + 1]
    _token_transfer(geom, lmc, "key_value", slot_mapping, direction)


@plan.falls_back_to(torch_ops.load_and_reshape_flash)
def load_and_reshape_flash(
    key_value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    layer_idx: int,
) -> None:
    """Native ``load_and_reshape_flash`` (engine flash caches -> one layer of key_value)."""
    _flash_layer(key_value, key_cache, value_cache, slot_mapping, layer_idx, TransferDirection.D2H)


@plan.falls_back_to(torch_ops.reshape_and_cache_back_flash)
def reshape_and_cache_back_flash(
    key_value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    layer_idx: int,
) -> None:
    """Native ``reshape_and_cache_back_flash`` (one layer of key_value -> flash caches)."""
    _flash_layer(key_value, key_cache, value_cache, slot_mapping, layer_idx, TransferDirection.H2D)


# -- raw copies -----------------------------------------------------------------------


def _host_address(buffer: Any, nbytes: int, arg: str) -> int:
    if not isinstance(buffer, torch.Tensor):
        return int(buffer)
    if buffer.device.type != "cpu":
        raise Unsupported(f"{arg} is on {buffer.device}")
    plan.check_copy_tensor(buffer, nbytes, arg)
    return buffer.data_ptr()


@plan.falls_back_to(torch_ops.lmcache_memcpy_async)
def lmcache_memcpy_async(
    dest: int | torch.Tensor,
    src: int | torch.Tensor,
    nbytes: int,
    direction: TransferDirection,
    host_buffer_offset: int,
    host_buffer_alignments: int,
    /,
) -> None:
    """Copy ``nbytes`` host bytes from ``src`` to ``dest`` (addresses or tensors).

    Like the baseline on CPU, the copy has completed when the call returns; the host buffer
    offset and alignment only matter to device runtimes and are ignored.
    """
    plan.check_memcpy_args(direction, nbytes)
    if nbytes == 0:
        return
    dst_ptr = _host_address(dest, nbytes, "dest")
    src_ptr = _host_address(src, nbytes, "src")
    _native.memcpy(dst_ptr, src_ptr, int(nbytes))


def batched_memcpy(src_ptrs: Sequence[int], dst_ptrs: Sequence[int], sizes: Sequence[int]) -> None:
    """Copy ``sizes[i]`` bytes from ``src_ptrs[i]`` to ``dst_ptrs[i]`` (all checked first)."""
    if not len(src_ptrs) == len(dst_ptrs) == len(sizes):
        raise ValueError(
            f"batched_memcpy needs equal lengths, got {len(src_ptrs)} sources, "
            f"{len(dst_ptrs)} destinations and {len(sizes)} sizes"
        )
    for size in sizes:
        if size < 0:
            raise ValueError(f"negative copy size {size}")
    _native.batched_memcpy(
        [int(p) for p in dst_ptrs], [int(p) for p in src_ptrs], [int(s) for s in sizes]
    )


# -- CacheGen -------------------------------------------------------------------------


def calculate_cdf(input_tensor: torch.Tensor, num_bins: int) -> torch.Tensor:
    """Native ``calculate_cdf``: int16 ``[L, C, num_bins + 1]``, bit-exact with the baseline."""
    if input_tensor.dim() != 3:
        raise ValueError(
            f"input_tensor must be [nlayers, ntokens, nchannels], got {input_tensor.shape}"
        )
    if not 0 < num_bins <= _CDF_TOTAL // 2:
        raise ValueError(f"num_bins must be in [1, {_CDF_TOTAL // 2}], got {num_bins}")
    symbols = input_tensor
    if symbols.device.type != "cpu" or symbols.dtype not in _CDF_NATIVE_DTYPES:
        symbols = symbols.to("cpu", torch.int64)
    layers, _tokens, channels = symbols.shape
    out = torch.empty(layers, channels, num_bins + 1, dtype=torch.int16)
    _native.calculate_cdf_into(symbols.detach(), int(num_bins), out)
    return out
