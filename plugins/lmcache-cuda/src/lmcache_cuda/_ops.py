"""Python faces of the CUDA kernels, with the exact ``torch_ops`` call signatures.

Each wrapper runs the torch baseline's own argument checks (same helpers, so the same
exceptions and messages), builds copy plans (:mod:`lmcache_cuda._plan`) and launches the
native ``kv_copy`` on the caller's current CUDA stream. Inputs the native path does not
model -- host-only engine buffers, pageable host LMCache buffers the GPU cannot address,
a non-contiguous head dimension -- go to the matching ``lmcache.v1.platform.torch_ops``
function with the original arguments, before anything has been written.

Native launches are asynchronous on the current stream (the baseline finishes before it
returns); callers order later work with stream events, as on upstream's CUDA backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import lmcache_cuda._native as _native
from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.ops_types import (
    EngineKVFormat,
    PageBufferShapeDesc,
    TransferDirection,
)
from lmcache.v1.platform.torch_ops import _kv_format as kvf
from lmcache.v1.platform.torch_ops import mem_kernels as tok
from lmcache.v1.platform.torch_ops import mp_mem_kernels as blk
from lmcache_cuda._device_mem import device_tensor
from lmcache_cuda._plan import (
    CopyPlan,
    Unsupported,
    plan_block_transfer,
    plan_token_transfer,
)

# -- device plumbing ------------------------------------------------------------------


def _device_address(ptr: int) -> int:
    return int(_native.device_address(int(ptr)))


def _require_cuda_view(view: torch.Tensor) -> None:
    if view.device.type != "cuda":
        raise Unsupported(f"engine buffer is on {view.device}")


def _stream_handle(device: torch.device) -> int:
    return int(torch.cuda.current_stream(device).cuda_stream)


def _cuda_device(device: Any) -> torch.device:
    dev = torch.device(device)
    if dev.type != "cuda":
        raise Unsupported(f"device {dev} is not a CUDA device")
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def _device_pointer_layout(
    pointers: Sequence[int], spec: Any, desc: Any, device: Any
) -> kvf.PagedLayout:
    """The baseline's pointer reconstruction (host-only there), over device memory."""
    _cuda_device(device)
    dtype = kvf._infer_kv_dtype(desc)
    planes = kvf._pointer_count(spec, len(pointers), int(desc.nl))
    shape, strides = kvf._pointer_tensor_geometry(
        spec, desc, planes if spec.tuple_axis == "HS" else 1
    )
    if any(_native.pointer_device(int(p)) < 0 for p in pointers):
        raise Unsupported("engine buffer pointers are not device memory")
    views = [device_tensor(int(p), shape, strides, dtype) for p in pointers]
    paged = kvf._pointer_container(spec, views, int(desc.nl))
    return kvf.paged_layout_from_tensors(paged, spec, int(desc.bs))


def _is_pointer_tensor(paged: Any) -> bool:
    return (
        isinstance(paged, torch.Tensor)
        and paged.dim() == 1
        and paged.dtype in (torch.int64, torch.uint64)
    )


def _engine_layout(paged: Any, spec: Any, desc: Any, device: Any) -> kvf.PagedLayout:
    if _is_pointer_tensor(paged) and torch.device(device).type == "cuda":
        return _device_pointer_layout([int(p) for p in paged.tolist()], spec, desc, device)
    return kvf.paged_layout(paged, spec, desc, device)


def execute(plans: Sequence[CopyPlan], device: torch.device) -> None:
    """Launch every plan on the current stream of ``device``."""
    stream = _stream_handle(device)
    for plan in plans:
        if not plan.planes or plan.work.numel() == 0:
            continue
        planes = torch.tensor(plan.planes, dtype=torch.int64).to(device)
        work = plan.work.to(device)
        _native.kv_copy(
            planes,
            work,
            plan.rows,
            plan.num_heads,
            plan.width_bytes,
            plan.eng_row_stride,
            plan.eng_head_stride,
            plan.obj_row_stride,
            plan.obj_head_stride,
            plan.to_engine,
            plan.vector_bytes(),
            plan.items_per_cta(),
            stream,
        )


# -- block-granular transfer ----------------------------------------------------------


def multi_layer_block_kv_transfer(
    paged_buffer_ptrs_tensor: torch.Tensor | list,
    lmcache_objects_ptrs: list[int] | list[torch.Tensor],
    block_ids: torch.Tensor | list[int],
    device: torch.device | str,
    direction: TransferDirection,
    shape_desc: PageBufferShapeDesc,
    lmcache_chunk_size: int,
    engine_kv_format: EngineKVFormat,
    skip_prefix_n_blocks: int,
) -> None:
    """Native ``multi_layer_block_kv_transfer``: semantics of the torch baseline."""
    args = (
        paged_buffer_ptrs_tensor,
        lmcache_objects_ptrs,
        block_ids,
        device,
        direction,
        shape_desc,
        lmcache_chunk_size,
        engine_kv_format,
        skip_prefix_n_blocks,
    )
    try:
        dev = _cuda_device(device)
        plans = plan_block_transfer(
            *args,
            address_of=_device_address,
            check_view=_require_cuda_view,
            layout_of=_engine_layout,
        )
    except Unsupported:
        torch_ops.multi_layer_block_kv_transfer(*args)
        return
    execute(plans, dev)


# -- slot-mapped (token-granular) transfers -------------------------------------------


def _native_token_transfer(
    layout: kvf.PagedLayout,
    lmcache_buffer: torch.Tensor,
    slot_mapping: Any,
    direction: Any,
    skip: int = 0,
    page_buffer_size: int = 0,
) -> None:
    if layout.device.type != "cuda":
        raise Unsupported("engine buffers are not on a CUDA device")
    plans = plan_token_transfer(
        layout,
        lmcache_buffer,
        slot_mapping,
        direction,
        skip,
        page_buffer_size,
        address_of=_device_address,
        check_view=_require_cuda_view,
    )
    execute(plans, layout.device)


def _device_token_layout(
    paged: Any,
    spec: Any,
    key_value: torch.Tensor,
    device: Any,
    page_buffer_size: int,
    block_size: int,
    head_size: int,
    block_stride_elems: int,
) -> kvf.PagedLayout:
    """The baseline's ``_token_layout``, with device pointers allowed."""
    if not (_is_pointer_tensor(paged) and torch.device(device).type == "cuda"):
        return tok._token_layout(
            paged,
            spec,
            key_value,
            device,
            page_buffer_size,
            block_size,
            head_size,
            block_stride_elems,
        )
    if block_stride_elems:
        raise ValueError("non-tight page pools (block_stride_elems) need tensor inputs")
    if spec.hnd and (block_size <= 0 or head_size <= 0):
        raise ValueError(
            f"{spec.engine_kv_format.name}: pointer mode needs block_size and head_size"
        )
    hidden = key_value.shape[-1]
    bs = block_size if block_size > 0 else page_buffer_size
    hs = head_size if head_size > 0 and not spec.mla else hidden
    desc = PageBufferShapeDesc(
        kv_size=spec.kv_size,
        nl=tok._layer_planes(key_value).shape[1],
        nb=page_buffer_size // bs,
        bs=bs,
        nh=hidden // hs,
        hs=hs,
        dtype=key_value.dtype,
    )
    return _device_pointer_layout([int(p) for p in paged.tolist()], spec, desc, device)


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
    """Native ``multi_layer_kv_transfer`` (slot-mapped gather/scatter over every layer)."""
    try:
        spec = kvf._format_spec(engine_kv_format)
        layout = _device_token_layout(
            key_value_ptrs,
            spec,
            key_value,
            paged_memory_device,
            page_buffer_size,
            block_size,
            head_size,
            block_stride_elems,
        )
        _native_token_transfer(
            layout, key_value, slot_mapping, direction, skip_prefix_n_tokens, page_buffer_size
        )
    except Unsupported:
        torch_ops.multi_layer_kv_transfer(
            key_value,
            key_value_ptrs,
            slot_mapping,
            paged_memory_device,
            page_buffer_size,
            direction,
            engine_kv_format,
            block_size,
            head_size,
            skip_prefix_n_tokens,
            block_stride_elems,
        )


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
    args = (
        key_value,
        key_value_ptrs,
        slot_mapping,
        paged_memory_device,
        page_buffer_size,
        direction,
        engine_kv_format,
    )
    spec = kvf._format_spec(engine_kv_format)
    if spec.mla:
        multi_layer_kv_transfer(*args)
        return
    try:
        flat = kvf._format_spec(EngineKVFormat.TWO_X_NL_X_NBBS_NH_HS)
        paged = key_value_ptrs
        if not _is_pointer_tensor(paged):
            paged = [tok._as_rows(t) for t in paged]
        layout = _device_token_layout(
            paged, flat, key_value, paged_memory_device, page_buffer_size, 1, 0, 0
        )
        _native_token_transfer(layout, key_value, slot_mapping, direction, 0, page_buffer_size)
    except Unsupported:
        torch_ops.multi_layer_kv_transfer_unilateral(*args)


def single_layer_kv_transfer(
    lmc_key_value_cache: torch.Tensor,
    vllm_key_value_cache: Any,
    slot_mapping: torch.Tensor,
    direction: TransferDirection,
    engine_kv_format: EngineKVFormat,
    token_major: bool = False,
) -> None:
    """Native ``single_layer_kv_transfer``; semantics of the torch baseline."""
    try:
        spec = kvf._format_spec(engine_kv_format)
        if spec.container not in ("layers", "layer_tuples"):
            raise Unsupported("not a per-layer format")  # the baseline raises its error
        layout = kvf.paged_layout_from_tensors([vllm_key_value_cache], spec, 1)
        lmc = tok._single_layer_lmc(lmc_key_value_cache, spec.kv_size, token_major)
        _native_token_transfer(layout, lmc, slot_mapping, direction)
    except Unsupported:
        torch_ops.single_layer_kv_transfer(
            lmc_key_value_cache,
            vllm_key_value_cache,
            slot_mapping,
            direction,
            engine_kv_format,
            token_major,
        )


def single_layer_kv_transfer_sgl(
    lmc_key_value_cache: torch.Tensor,
    sgl_key_cache: torch.Tensor,
    sgl_value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    direction: TransferDirection,
    token_major: bool = False,
) -> None:
    """Native ``single_layer_kv_transfer_sgl`` (separate K and V caches)."""
    try:
        layout = tok._separate_kv_layout(sgl_key_cache, sgl_value_cache)
        lmc = tok._single_layer_lmc(lmc_key_value_cache, 2, token_major)
        _native_token_transfer(layout, lmc, slot_mapping, direction)
    except Unsupported:
        torch_ops.single_layer_kv_transfer_sgl(
            lmc_key_value_cache,
            sgl_key_cache,
            sgl_value_cache,
            slot_mapping,
            direction,
            token_major,
        )


def load_and_reshape_flash(
    key_value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    layer_idx: int,
) -> None:
    """Native ``load_and_reshape_flash`` (extract one layer into ``key_value``)."""
    try:
        layout = tok._separate_kv_layout(key_cache, value_cache)
        lmc = key_value[:, layer_idx : layer_idx + 1]
        _native_token_transfer(layout, lmc, slot_mapping, TransferDirection.D2H)
    except Unsupported:
        torch_ops.load_and_reshape_flash(key_value, key_cache, value_cache, slot_mapping, layer_idx)


def reshape_and_cache_back_flash(
    key_value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    layer_idx: int,
) -> None:
    """Native ``reshape_and_cache_back_flash`` (scatter one layer back)."""
    try:
        layout = tok._separate_kv_layout(key_cache, value_cache)
        lmc = key_value[:, layer_idx : layer_idx + 1]
        _native_token_transfer(layout, lmc, slot_mapping, TransferDirection.H2D)
    except Unsupported:
        torch_ops.reshape_and_cache_back_flash(
            key_value, key_cache, value_cache, slot_mapping, layer_idx
        )


# -- raw memcpy -----------------------------------------------------------------------


def _address_and_device(buffer: int | torch.Tensor, nbytes: int) -> tuple[int, int | None]:
    if not isinstance(buffer, torch.Tensor):
        return int(buffer), None
    if not buffer.is_contiguous():
        raise ValueError("lmcache_memcpy_async needs contiguous tensors")
    held = buffer.numel() * buffer.element_size()
    if held < nbytes:
        raise ValueError(f"tensor holds {held} bytes, {nbytes} requested")
    index = buffer.device.index if buffer.device.type == "cuda" else None
    return buffer.data_ptr(), index


def lmcache_memcpy_async(
    dest: int | torch.Tensor,
    src: int | torch.Tensor,
    nbytes: int,
    direction: TransferDirection,
    host_buffer_offset: int,
    host_buffer_alignments: int,
    /,
) -> None:
    """``cudaMemcpyAsync`` on the current stream, split at host registration boundaries.

    The host side (``src`` for H2D, ``dest`` for D2H) is registered in
    ``host_buffer_alignments``-byte segments starting at allocator offset
    ``host_buffer_offset``; no single copy crosses a segment boundary. Positional only.
    """
    direction = blk._validate_direction(direction)
    if nbytes < 0:
        raise ValueError(f"nbytes must be non-negative, got {nbytes}")
    if nbytes == 0:
        return
    host_tensors = [
        b for b in (dest, src) if isinstance(b, torch.Tensor) and b.device.type != "cuda"
    ]
    if len(host_tensors) == 2:  # no device involved: the baseline's host copy
        torch_ops.lmcache_memcpy_async(
            dest, src, nbytes, direction, host_buffer_offset, host_buffer_alignments
        )
        return
    dest_ptr, dest_dev = _address_and_device(dest, nbytes)
    src_ptr, src_dev = _address_and_device(src, nbytes)
    index = dest_dev if dest_dev is not None else src_dev
    device = torch.device("cuda", index if index is not None else torch.cuda.current_device())
    _native.memcpy_async(
        dest_ptr,
        src_ptr,
        int(nbytes),
        int(direction),
        int(host_buffer_offset),
        int(host_buffer_alignments),
        _stream_handle(device),
    )
