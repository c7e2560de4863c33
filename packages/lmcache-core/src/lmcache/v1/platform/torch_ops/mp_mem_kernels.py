"""Block-granular KV transfer between engine page buffers and LMCache chunk objects.

This is the hot path of both MP transfer modes. Every layout goes through the same code:
``_kv_format`` turns the engine buffers into canonical views ``[KV, NL, NB, BS, NH, HS]``,
each LMCache object becomes ``[KV, NL, blocks, BS, NH, HS]``, and one ``index_select`` /
``index_copy_`` per (object, view) moves all its blocks. Layers that live at a constant
stride in one allocation collapse into a single view, so that case is one op per object.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from lmcache.v1.platform.ops_types import (
    EngineKVFormat,
    KVIndexError,
    PageBufferShapeDesc,
    TransferDirection,
)
from lmcache.v1.platform.torch_ops._kv_format import (
    PagedLayout,
    Part,
    _format_spec,
    canonical_object,
    paged_layout,
)
from lmcache.v1.platform.torch_ops._tensor_from_ptr import _tensor_from_ptr

__all__ = ["multi_layer_block_kv_transfer"]


def _validate_direction(direction: Any) -> TransferDirection:
    try:
        return TransferDirection(int(direction))
    except (ValueError, TypeError):
        raise ValueError(
            f"direction must be TransferDirection.H2D or TransferDirection.D2H, got {direction!r}"
        ) from None


def _validate_block_args(lmcache_chunk_size: int, block_size: int, skip: int) -> int:
    """Blocks per object, after upstream's argument checks."""
    if lmcache_chunk_size <= 0:
        raise ValueError(f"lmcache_chunk_size must be positive, got {lmcache_chunk_size}")
    if block_size <= 0 or lmcache_chunk_size % block_size:
        raise ValueError(
            f"lmcache_chunk_size ({lmcache_chunk_size}) must be a positive multiple of "
            f"shape_desc.bs ({block_size})"
        )
    if skip < 0:
        raise ValueError(f"skip_prefix_n_blocks must be non-negative, got {skip}")
    return lmcache_chunk_size // block_size


def _as_block_ids(block_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
    ids = torch.as_tensor(block_ids, dtype=torch.int64, device="cpu")
    return ids.reshape(-1)


def _valid_block_range(
    block_ids: torch.Tensor, blocks_per_object: int, skip: int, num_objects: int
) -> Iterator[tuple[int, slice | torch.Tensor, torch.Tensor]]:
    """Per object: (object index, object block slots, engine block ids), padding removed.

    Slots come as a slice when contiguous (the common case, no index op needed on the
    object side) and as an index tensor when padding ids punch holes.
    """
    total = block_ids.numel()
    if total > num_objects * blocks_per_object:
        raise ValueError(
            f"{total} block ids need {-(-total // blocks_per_object)} LMCache objects of "
            f"{blocks_per_object} blocks, got {num_objects}"
        )
    for obj in range(skip // blocks_per_object, -(-total // blocks_per_object)):
        start = max(skip, obj * blocks_per_object)
        stop = min(total, (obj + 1) * blocks_per_object)
        if start >= stop:
            continue
        ids = block_ids[start:stop]
        first_slot = start - obj * blocks_per_object
        valid = ids >= 0
        if bool(valid.all()):
            yield obj, slice(first_slot, first_slot + ids.numel()), ids
        elif bool(valid.any()):
            slots = torch.nonzero(valid).reshape(-1) + first_slot
            yield obj, slots, ids[valid]


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
    part: Part, region: torch.Tensor, slots: slice | torch.Tensor, engine_ids: torch.Tensor
) -> None:
    """D2H: engine blocks ``engine_ids`` -> object block ``slots``."""
    if isinstance(slots, slice):
        target = region[:, :, slots]
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


def _load_blocks(
    part: Part, region: torch.Tensor, slots: slice | torch.Tensor, engine_ids: torch.Tensor
) -> None:
    """H2D: object block ``slots`` -> engine blocks ``engine_ids``."""
    source = region[:, :, slots] if isinstance(slots, slice) else region.index_select(2, slots)
    part.view.index_copy_(2, engine_ids, source.to(part.view.device))


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
    spec = _format_spec(engine_kv_format)
    direction = _validate_direction(direction)
    skip = int(skip_prefix_n_blocks)
    blocks_per_object = _validate_block_args(int(lmcache_chunk_size), int(shape_desc.bs), skip)
    ids = _as_block_ids(block_ids)
    objects = list(lmcache_objects_ptrs)
    runs = list(_valid_block_range(ids, blocks_per_object, skip, len(objects)))
    if not runs:
        return
    layout = paged_layout(paged_buffer_ptrs_tensor, spec, shape_desc, device)
    if layout.block_size != shape_desc.bs:
        raise ValueError(
            f"engine block size {layout.block_size} does not match shape_desc.bs={shape_desc.bs}"
        )
    _check_block_ids(runs, layout.num_blocks)
    move = _store_blocks if direction == TransferDirection.D2H else _load_blocks
    for obj_index, slots, engine_ids in runs:
        obj_blocks = _object_tensor(objects[obj_index], layout, int(lmcache_chunk_size))
        last_slot = slots.stop - 1 if isinstance(slots, slice) else int(slots.max())
        if last_slot >= obj_blocks.shape[2]:
            raise KVIndexError(
                f"LMCache object {obj_index} holds {obj_blocks.shape[2]} blocks; "
                f"block slot {last_slot} is out of range"
            )
        engine_ids = engine_ids.to(layout.device)
        for part in layout.parts:
            move(part, _object_region(obj_blocks, part), slots, engine_ids)


def _check_block_ids(
    runs: list[tuple[int, slice | torch.Tensor, torch.Tensor]], num_blocks: int
) -> None:
    highest = max(int(engine_ids.max()) for _obj, _slots, engine_ids in runs)
    if highest >= num_blocks:
        raise KVIndexError(f"block id {highest} is out of range for {num_blocks} engine blocks")
