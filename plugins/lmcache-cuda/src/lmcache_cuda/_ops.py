"""Python faces of the CUDA kernels, with the exact ``torch_ops`` call signatures.

Each wrapper runs the torch baseline's own argument checks (the shared helpers of
:mod:`lmcache.v1.platform.torch_ops.plan`, so the same exceptions and messages), builds
copy plans (:mod:`lmcache_cuda._plan`) and launches the native ``kv_copy`` on the caller's
current CUDA stream. Inputs the native path does not model -- host-only engine buffers,
pageable host LMCache buffers the GPU cannot address, a non-contiguous head dimension --
raise ``Unsupported`` and go to the matching ``lmcache.v1.platform.torch_ops`` function
with the original arguments (``plan.falls_back_to``), before anything has been written.

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
from lmcache.v1.platform.torch_ops import plan as shared
from lmcache.v1.platform.torch_ops.plan import PagedLayout
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
) -> PagedLayout:
    """The baseline's pointer reconstruction (host-only there), over device memory."""
    _cuda_device(device)
    dtype = shared.infer_kv_dtype(desc)
    planes = shared.pointer_count(spec, len(pointers), int(desc.nl))
    shape, strides = shared.pointer_tensor_geometry(
        spec, desc, planes if spec.tuple_axis == "HS" else 1
    )
    if any(_native.pointer_device(int(p)) < 0 for p in pointers):
        raise Unsupported("engine buffer pointers are not device memory")
    views = [device_tensor(int(p), shape, strides, dtype) for p in pointers]
    paged = shared.pointer_container(spec, views, int(desc.nl))
    return shared.paged_layout_from_tensors(paged, spec, int(desc.bs))


def _device_pointers(paged: Any, device: Any) -> bool:
    """True for a pointer tensor whose buffers live on a CUDA device."""
    return shared.is_pointer_tensor(paged) and torch.device(device).type == "cuda"


def _engine_layout(paged: Any, spec: Any, desc: Any, device: Any) -> PagedLayout:
    if _device_pointers(paged, device):
        return _device_pointer_layout(shared.pointer_list(paged), spec, desc, device)
    return shared.paged_layout(paged, spec, desc, device)


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


@shared.falls_back_to(torch_ops.multi_layer_block_kv_transfer)
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
    dev = _cuda_device(device)
    plans = plan_block_transfer(
        paged_buffer_ptrs_tensor,
        lmcache_objects_ptrs,
        block_ids,
        device,
        direction,
        shape_desc,
        lmcache_chunk_size,
        engine_kv_format,
        skip_prefix_n_blocks,
        address_of=_device_address,
        check_view=_require_cuda_view,
        layout_of=_engine_layout,
    )
    execute(plans, dev)


# -- slot-mapped (token-granular) transfers -------------------------------------------


def _native_token_transfer(
    layout: PagedLayout,
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
) -> PagedLayout:
    """The baseline's ``plan.token_layout``, with device pointers allowed."""
    if not _device_pointers(paged, device):
        return shared.token_layout(
            paged,
            spec,
            key_value,
            device,
            page_buffer_size,
            block_size,
            head_size,
            block_stride_elems,
        )
    desc = shared.token_pointer_shape_desc(
        spec, key_value, page_buffer_size, block_size, head_size, block_stride_elems
    )
    return _device_pointer_layout(shared.pointer_list(paged), spec, desc, device)


@shared.falls_back_to(torch_ops.multi_layer_kv_transfer)
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
    spec = shared.format_spec(engine_kv_format)
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


@shared.falls_back_to(torch_ops.multi_layer_kv_transfer_unilateral)
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
    spec = shared.format_spec(engine_kv_format)
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
    flat = shared.format_spec(EngineKVFormat.TWO_X_NL_X_NBBS_NH_HS)
    paged = key_value_ptrs
    if not shared.is_pointer_tensor(paged):
        paged = [shared.as_token_rows(t) for t in paged]
    layout = _device_token_layout(
        paged, flat, key_value, paged_memory_device, page_buffer_size, 1, 0, 0
    )
    _native_token_transfer(layout, key_value, slot_mapping, direction, 0, page_buffer_size)


@shared.falls_back_to(torch_ops.single_layer_kv_transfer)
def single_layer_kv_transfer(
    lmc_key_value_cache: torch.Tensor,
    vllm_key_value_cache: Any,
    slot_mapping: torch.Tensor,
    direction: TransferDirection,
    engine_kv_format: EngineKVFormat,
    token_major: bool = False,
) -> None:
    """Native ``single_layer_kv_transfer``; semantics of the torch baseline."""
    spec = shared.format_spec(engine_kv_format)
    if spec.container not in ("layers", "layer_tuples"):
        raise Unsupported("not a per-layer format")  # the baseline raises its error
    layout = shared.paged_layout_from_tensors([vllm_key_value_cache], spec, 1)
    lmc = shared.single_layer_lmcache_view(lmc_key_value_cache, spec.kv_size, token_major)
    _native_token_transfer(layout, lmc, slot_mapping, direction)


@shared.falls_back_to(torch_ops.single_layer_kv_transfer_sgl)
def single_layer_kv_transfer_sgl(
    lmc_key_value_cache: torch.Tensor,
    sgl_key_cache: torch.Tensor,
    sgl_value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    direction: TransferDirection,
    token_major: bool = False,
) -> None:
    """Native ``single_layer_kv_transfer_sgl`` (separate K and V caches)."""
    layout = shared.separate_kv_layout(sgl_key_cache, sgl_value_cache)
    lmc = shared.single_layer_lmcache_view(lmc_key_value_cache, 2, token_major)
    _native_token_transfer(layout, lmc, slot_mapping, direction)


def _flash_layer(
    key_value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    layer_idx: int,
    direction: TransferDirection,
) -> None:
    layout = shared.separate_kv_layout(key_cache, value_cache)
    lmc = key_value[:, layer_idx : layer_idx + 1]
    _native_token_transfer(layout, lmc, slot_mapping, direction)


@shared.falls_back_to(torch_ops.load_and_reshape_flash)
def load_and_reshape_flash(
    key_value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    layer_idx: int,
) -> None:
    """Native ``load_and_reshape_flash`` (extract one layer into ``key_value``)."""
    _flash_layer(key_value, key_cache, value_cache, slot_mapping, layer_idx, TransferDirection.D2H)


@shared.falls_back_to(torch_ops.reshape_and_cache_back_flash)
def reshape_and_cache_back_flash(
    key_value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    layer_idx: int,
) -> None:
    """Native ``reshape_and_cache_back_flash`` (scatter one layer back)."""
    _flash_layer(key_value, key_cache, value_cache, slot_mapping, layer_idx, TransferDirection.H2D)


# -- raw memcpy -----------------------------------------------------------------------


def _address_and_device(buffer: int | torch.Tensor, nbytes: int) -> tuple[int, int | None]:
    if not isinstance(buffer, torch.Tensor):
        return int(buffer), None
    shared.check_copy_tensor(buffer, nbytes)
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
    direction = shared.check_memcpy_args(direction, nbytes)
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
