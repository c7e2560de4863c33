"""Block-granular KV transfer between engine page buffers and LMCache chunk objects.

This is the hot path of both MP transfer modes. Every layout goes through the same code:
``_kv_format`` turns the engine buffers into canonical views ``[KV, NL, NB, BS, NH, HS]``,
each LMCache object becomes ``[KV, NL, blocks, BS, NH, HS]``, and one ``index_select`` /
``index_copy_`` per (object, view) moves all its blocks. Layers that live at a constant
stride in one allocation collapse into a single view, so that case is one op per object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmcache.v1.platform.ops_types import (
    EngineKVFormat,
    PageBufferShapeDesc,
    TransferDirection,
)
from lmcache.v1.platform.torch_ops._kv_format import PagedLayout, Part, canonical_object
from lmcache.v1.platform.torch_ops._tensor_from_ptr import _tensor_from_ptr
from lmcache.v1.platform.torch_ops.plan import (
    block_runs,
    block_transfer_args,
    check_block_runs,
    check_block_slot,
    check_engine_block_size,
    paged_layout,
)

__all__ = ["multi_layer_block_kv_transfer"]


def _object_tensor(obj: Any, layout: PagedLayout, chunk_tokens: int) -> torch.Tensor:
    """An LMCache object as ``[KV, NL, blocks, BS, NH, HS]``; raw pointers are wrapped."""
    if not isinstance(obj, torch.Tensor):
        obj = _tensor_from_ptr(int(obj), layout.object_shape(chunk_tokens), layout.dtype)
    canon = canonical_object(obj, layout)
    whole_blocks = canon.shape[2] // layout.block_size
    canon = canon[:, :, : whole_blocks * layout.block_size]
    return canon.unflatten(2, (whole_blocks, layout.block_size))


def _object_region(obj_blocks: torch.Tensor, part: Part) -> torch.Tensor:
    return obj_blocks[part.kv, part.layers][..., part.cols]


def _kv_planes(target: torch.Tensor) -> list[slice]:
    return [slice(k, k + 1) for k in range(target.shape[0])]


def _store_blocks(
    part: Part,
    region: torch.Tensor,
    slots: slice | torch.Tensor,
    engine_ids: torch.Tensor,
    runs: list[tuple[int, int, int]] | None = None,
) -> None:
    """D2H: engine blocks ``engine_ids`` -> object block ``slots`` (``runs``: the ids as
    consecutive runs, copied as slices; None gathers with ``index_select``)."""
    if isinstance(slots, slice):
        target = region[:, :, slots]
        if runs is not None:
            for pos, first, length in runs:
                target[:, :, pos : pos + length].copy_(part.view[:, :, first : first + length])
            return
        # Gathering straight into the object (out=) saves a temporary and a second copy;
        # K and V planes of one layer are each contiguous even when the pair is not.
        planes = [slice(None)] if target.is_contiguous() else _kv_planes(target)
        for plane in planes:
            dst, src = target[plane], part.view[plane]
            if dst.is_contiguous() and dst.device == src.device:
                torch.index_select(src, 2, engine_ids, out=dst)
            else:
                dst.copy_(src.index_select(2, engine_ids))
        return
    gathered = part.view.index_select(2, engine_ids).to(region.device)
    region.index_copy_(2, slots, gathered)


# Below this mean run length a scatter (index_copy_) or gather (index_select) beats one
# slice copy per run: on CPU index_copy_ moves ~0.45x memcpy whatever the ids, a slice copy
# per run ~0.75x at one run per object but 0.3x at runs of 2 blocks (interleaved
# micro-benchmark, issue 32).
MIN_MEAN_RUN_BLOCKS = 8


def consecutive_runs(engine_ids: torch.Tensor) -> list[tuple[int, int, int]] | None:
    """``(position, first engine id, length)`` per run of consecutive ids, when the runs
    are long enough for slice copies to beat a scatter; None otherwise."""
    ids = engine_ids.tolist()
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            runs.append((start, ids[start], i - start))
            start = i
    if len(runs) == 1 or len(ids) >= MIN_MEAN_RUN_BLOCKS * len(runs):
        return runs
    return None


def _load_blocks(
    part: Part,
    region: torch.Tensor,
    slots: slice | torch.Tensor,
    engine_ids: torch.Tensor,
    runs: list[tuple[int, int, int]] | None = None,
) -> None:
    """H2D: object block ``slots`` -> engine blocks ``engine_ids`` (``runs``: the ids as
    consecutive runs, copied as slices; None scatters with ``index_copy_``)."""
    source = region[:, :, slots] if isinstance(slots, slice) else region.index_select(2, slots)
    if runs is None:
        part.view.index_copy_(2, engine_ids, source.to(part.view.device))
        return
    for pos, first, length in runs:
        part.view[:, :, first : first + length].copy_(source[:, :, pos : pos + length])


def multi_layer_block_kv_transfer(
    paged_buffer_ptrs_tensor: torch.Tensor | list,
    lmcache_objects_ptrs: list[int] | list[torch.Tensor],
    block_ids: torch.Tensor | Sequence[int],
    device: torch.device | str,
    direction: TransferDirection,
    shape_desc: PageBufferShapeDesc,
    lmcache_chunk_size: int,
    engine_kv_format: EngineKVFormat,
    skip_prefix_n_blocks: int,
) -> None:
    """Copy whole engine blocks between the paged KV buffers and LMCache chunk objects.

    Object ``i`` holds the blocks at positions ``[i*bpo, (i+1)*bpo)`` of ``block_ids``
    (``bpo = lmcache_chunk_size // shape_desc.bs``), token-major inside the object. The first
    ``skip_prefix_n_blocks`` positions and every negative (padding) id are skipped; the
    positions keep their place in the object. Fewer ids than ``objects * bpo`` is a partial
    last chunk.

    ``paged_buffer_ptrs_tensor`` is a 1-d int64/uint64 tensor of host pointers (rebuilt with
    ``shape_desc``) or the engine's tensors in the container the format names.
    ``lmcache_objects_ptrs`` holds tensors or raw host pointers; pointer objects are shaped
    ``(NL, T, NH*HS)`` for MLA / fused / single-KV layouts, else ``(2, NL, T, NH*HS)``.
    """
    args = block_transfer_args(
        lmcache_objects_ptrs,
        block_ids,
        direction,
        shape_desc,
        lmcache_chunk_size,
        engine_kv_format,
        skip_prefix_n_blocks,
    )
    objects = args.objects
    runs = list(block_runs(args.block_ids, args.blocks_per_object, args.skip, len(objects)))
    if not runs:
        return
    layout = paged_layout(paged_buffer_ptrs_tensor, args.spec, shape_desc, device)
    check_engine_block_size(layout.block_size, shape_desc)
    check_block_runs(runs, layout.num_blocks)
    store = args.direction == TransferDirection.D2H
    for obj_index, slots, engine_ids in runs:
        obj_blocks = _object_tensor(objects[obj_index], layout, args.chunk_size)
        last_slot = slots.stop - 1 if isinstance(slots, slice) else int(slots.max())
        check_block_slot(obj_index, last_slot, obj_blocks.shape[2])
        # One look at the ids per object, reused by every layer part.
        id_runs = consecutive_runs(engine_ids)
        engine_ids = engine_ids.to(layout.device)
        for part in layout.parts:
            region = _object_region(obj_blocks, part)
            if store:
                _store_blocks(part, region, slots, engine_ids, id_runs)
            else:
                _load_blocks(part, region, slots, engine_ids, id_runs)
