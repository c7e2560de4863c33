"""The argument checks of every KV op, in the order and with the messages of the baseline.

Each op of :mod:`lmcache.v1.platform.torch_ops` first normalizes and checks its arguments:
directions, chunk sizes, block ids and slot mappings, memcpy buffers. These functions are
that half, public for every backend: a native kernel wrapped by
:mod:`lmcache.v1.platform.kernel_kit.ops` raises the baseline's exception types and
messages by construction. An input a native path does not model raises
:class:`Unsupported`; :func:`falls_back_to` turns that into a call of the baseline.

Nothing here copies KV data, builds views or touches a device runtime.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

import torch

from lmcache.v1.platform.kv_formats import EngineKVFormat, KVFormatSpec, format_spec
from lmcache.v1.platform.ops_types import KVIndexError, PageBufferShapeDesc, TransferDirection

__all__ = [
    "BlockArgs",
    "BlockRun",
    "BlockSummary",
    "SlotSummary",
    "Unsupported",
    "as_block_ids",
    "as_int64_cpu",
    "block_runs",
    "block_summary",
    "block_transfer_args",
    "blocks_per_object",
    "check_block_capacity",
    "check_block_id_range",
    "check_block_runs",
    "check_block_slot",
    "check_copy_tensor",
    "check_engine_block_size",
    "check_engine_slot_range",
    "check_memcpy_args",
    "check_skip_tokens",
    "check_slot_range",
    "check_token_coverage",
    "falls_back_to",
    "is_pointer_tensor",
    "pointer_list",
    "selected_tokens",
    "slot_summary",
    "token_format_spec",
    "token_pointer_shape_desc",
    "validate_direction",
]

BlockRun = tuple[int, "slice | torch.Tensor", torch.Tensor]
"""``(object index, object block slots, engine block ids)`` of one LMCache object."""

_Op = TypeVar("_Op", bound=Callable[..., Any])


class Unsupported(Exception):
    """A native path does not model this input; the caller defers to the torch baseline.

    Raise it only before anything has been written, so the baseline can run from scratch.
    """


def falls_back_to(baseline: Callable[..., Any]) -> Callable[[_Op], _Op]:
    """Decorate a native op so that :class:`Unsupported` runs ``baseline`` instead.

    The baseline receives the caller's original arguments, so its semantics (errors
    included) apply to every input the native op declines. The decorated function keeps
    its own name, module and signature.
    """

    def decorate(native: _Op) -> _Op:
        @functools.wraps(native)
        def op(*args: Any, **kwargs: Any) -> Any:
            try:
                return native(*args, **kwargs)
            except Unsupported:
                return baseline(*args, **kwargs)

        return op  # type: ignore[return-value]

    return decorate


def validate_direction(direction: Any) -> TransferDirection:
    """``direction`` as a :class:`TransferDirection`; ValueError for anything else."""
    try:
        return TransferDirection(int(direction))
    except (ValueError, TypeError):
        raise ValueError(
            f"direction must be TransferDirection.H2D or TransferDirection.D2H, got {direction!r}"
        ) from None


def as_int64_cpu(values: Any) -> torch.Tensor:
    """Any index sequence or tensor as a flat, contiguous int64 host tensor."""
    return torch.as_tensor(values).reshape(-1).to("cpu", torch.int64).contiguous()


def check_memcpy_args(direction: Any, nbytes: int) -> TransferDirection:
    """The argument checks of ``lmcache_memcpy_async``: a valid direction, ``nbytes >= 0``."""
    checked = validate_direction(direction)
    if nbytes < 0:
        raise ValueError(f"nbytes must be non-negative, got {nbytes}")
    return checked


def check_copy_tensor(buffer: torch.Tensor, nbytes: int, name: str = "") -> None:
    """A tensor side of ``lmcache_memcpy_async``: contiguous and holding ``nbytes`` bytes.

    ``name`` (``"dest"`` / ``"src"``), when given, is added to the contiguity message.
    """
    if not buffer.is_contiguous():
        detail = f" ({name} is not)" if name else ""
        raise ValueError(f"lmcache_memcpy_async needs contiguous tensors{detail}")
    held = buffer.numel() * buffer.element_size()
    if held < nbytes:
        raise ValueError(f"tensor holds {held} bytes, {nbytes} requested")


def blocks_per_object(lmcache_chunk_size: int, block_size: int, skip: int) -> int:
    """Blocks per LMCache object, after upstream's argument checks."""
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


def as_block_ids(block_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
    """Block ids as a flat, contiguous int64 host tensor."""
    ids = torch.as_tensor(block_ids, dtype=torch.int64, device="cpu")
    return ids.reshape(-1).contiguous()


class BlockArgs(NamedTuple):
    """The scalar arguments of ``multi_layer_block_kv_transfer``, checked and normalized."""

    spec: KVFormatSpec
    direction: TransferDirection
    skip: int
    chunk_size: int
    blocks_per_object: int
    block_ids: torch.Tensor
    objects: list[Any]


def block_transfer_args(
    lmcache_objects_ptrs: Any,
    block_ids: Any,
    direction: Any,
    shape_desc: PageBufferShapeDesc,
    lmcache_chunk_size: int,
    engine_kv_format: Any,
    skip_prefix_n_blocks: int,
) -> BlockArgs:
    """Every check of ``multi_layer_block_kv_transfer`` that needs no engine buffer."""
    spec = format_spec(engine_kv_format)
    checked = validate_direction(direction)
    skip = int(skip_prefix_n_blocks)
    chunk = int(lmcache_chunk_size)
    bpo = blocks_per_object(chunk, int(shape_desc.bs), skip)
    ids = as_block_ids(block_ids)
    return BlockArgs(spec, checked, skip, chunk, bpo, ids, list(lmcache_objects_ptrs))


def check_block_capacity(total: int, blocks_per_object: int, num_objects: int) -> None:
    """``total`` block ids must fit into ``num_objects`` objects."""
    if total > num_objects * blocks_per_object:
        raise ValueError(
            f"{total} block ids need {-(-total // blocks_per_object)} LMCache objects of "
            f"{blocks_per_object} blocks, got {num_objects}"
        )


def block_runs(
    block_ids: torch.Tensor, blocks_per_object: int, skip: int, num_objects: int
) -> Iterator[BlockRun]:
    """Per object: (object index, object block slots, engine block ids), padding removed.

    Object ``i`` owns positions ``[i*bpo, (i+1)*bpo)`` of ``block_ids``; the first ``skip``
    positions and negative (padding) ids are left out, the rest keep their place. Slots
    come as a slice when contiguous (the common case, no index op needed on the object
    side) and as an index tensor when padding ids punch holes. Objects that receive no
    block are not yielded.
    """
    total = block_ids.numel()
    check_block_capacity(total, blocks_per_object, num_objects)
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


def check_engine_block_size(block_size: int, shape_desc: PageBufferShapeDesc) -> None:
    """The engine buffers' block size must be the one ``shape_desc`` announces."""
    if block_size != shape_desc.bs:
        raise ValueError(
            f"engine block size {block_size} does not match shape_desc.bs={shape_desc.bs}"
        )


def check_block_id_range(highest: int, num_blocks: int) -> None:
    """KVIndexError unless block id ``highest`` exists among ``num_blocks`` engine blocks."""
    if highest >= num_blocks:
        raise KVIndexError(f"block id {highest} is out of range for {num_blocks} engine blocks")


def check_block_runs(runs: Sequence[BlockRun], num_blocks: int) -> None:
    """:func:`check_block_id_range` for the highest engine id of non-empty ``runs``."""
    check_block_id_range(max(int(ids.max()) for _obj, _slots, ids in runs), num_blocks)


def check_block_slot(
    obj_index: int,
    last_slot: int,
    num_blocks: int,
    error: type[ValueError] = KVIndexError,
) -> None:
    """Block slot ``last_slot`` must exist in object ``obj_index`` of ``num_blocks`` blocks.

    The baseline raises :class:`KVIndexError`; ``error`` lets a backend keep the
    ``ValueError`` it has always raised here.
    """
    if last_slot >= num_blocks:
        raise error(
            f"LMCache object {obj_index} holds {num_blocks} blocks; "
            f"block slot {last_slot} is out of range"
        )


def check_skip_tokens(skip: int) -> None:
    if skip < 0:
        raise ValueError(f"skip_prefix_n_tokens must be non-negative, got {skip}")


def check_slot_range(highest: int, page_buffer_size: int) -> None:
    """KVIndexError when slot ``highest`` lies past a positive ``page_buffer_size``."""
    if page_buffer_size > 0 and highest >= page_buffer_size:
        raise KVIndexError(
            f"slot {highest} is out of range for page_buffer_size={page_buffer_size}"
        )


def check_token_coverage(last: int, num_tokens: int) -> None:
    """Token position ``last`` must exist in an LMCache buffer of ``num_tokens`` tokens."""
    if last >= num_tokens:
        raise ValueError(f"slot_mapping covers {last + 1} tokens, the LMCache buffer {num_tokens}")


def selected_tokens(
    slot_mapping: Any, skip: int, page_buffer_size: int
) -> tuple[slice | torch.Tensor, torch.Tensor]:
    """(LMCache token positions, their engine slots): skipped prefix and slots < 0 removed.

    Positions come as a slice when no slot is padding, else as an index tensor.
    """
    check_skip_tokens(skip)
    slots = torch.as_tensor(slot_mapping).reshape(-1)[skip:].to("cpu", torch.int64)
    if slots.numel():
        check_slot_range(int(slots.max()), page_buffer_size)
    valid = slots >= 0
    if bool(valid.all()):
        return slice(skip, skip + slots.numel()), slots
    positions = torch.nonzero(valid).reshape(-1) + skip
    return positions, slots[valid]


def _layer_count(key_value: torch.Tensor) -> int:
    """Layers of ``[KV, NL, T, D]`` (or an MLA ``[NL, T, D]``)."""
    planes = key_value if key_value.dim() == 4 else key_value.unsqueeze(0)
    return int(planes.shape[1])


# Upstream's slot-mapped kernels address the vLLM cross-layer format exactly like flash
# attention: one [2, NB*BS, NH*HS] buffer per layer (its fallback does the same).
_PER_LAYER_TOKEN_FORMAT = {
    EngineKVFormat.NB_NL_TWO_BS_NH_HS: EngineKVFormat.NL_X_TWO_NB_BS_NH_HS,
}


def token_format_spec(spec: KVFormatSpec, paged: Any) -> KVFormatSpec:
    """The format a slot-mapped op reads ``paged`` in.

    ``NB_NL_TWO_BS_NH_HS`` given as one buffer per layer -- more than one pointer, or a
    list of tensors that is not a single 6-d cross-layer tensor -- is read as upstream
    reads it, like ``NL_X_TWO_NB_BS_NH_HS``. A bare tensor, a one-tensor list holding a
    6-d tensor and a single pointer stay one real cross-layer buffer ``[NB, NL, 2, BS, NH,
    HS]`` (upstream would read a single pointer per-layer; see docs/compatibility.md).
    """
    per_layer = _PER_LAYER_TOKEN_FORMAT.get(spec.engine_kv_format)
    if per_layer is None:
        return spec
    if isinstance(paged, torch.Tensor):
        several = paged.dim() == 1 and paged.numel() > 1
    elif isinstance(paged, (list, tuple)):
        only = paged[0] if len(paged) == 1 else None
        several = len(paged) > 1 or (isinstance(only, torch.Tensor) and only.dim() != 6)
    else:
        several = False
    return format_spec(per_layer) if several else spec


def token_pointer_shape_desc(
    spec: KVFormatSpec,
    key_value: torch.Tensor,
    page_buffer_size: int,
    block_size: int,
    head_size: int,
    block_stride_elems: int,
) -> PageBufferShapeDesc:
    """The engine buffer shape a slot-mapped op assumes for per-buffer pointers."""
    if block_stride_elems:
        raise ValueError("non-tight page pools (block_stride_elems) need tensor inputs")
    if spec.hnd and (block_size <= 0 or head_size <= 0):
        raise ValueError(
            f"{spec.engine_kv_format.name}: pointer mode needs block_size and head_size"
        )
    hidden = key_value.shape[-1]
    # NHD rows are contiguous, so one block of page_buffer_size tokens and one head of
    # `hidden` elements address the same bytes as the real geometry.
    bs = block_size if block_size > 0 else page_buffer_size
    hs = head_size if head_size > 0 and not spec.mla else hidden
    return PageBufferShapeDesc(
        kv_size=spec.kv_size,
        nl=_layer_count(key_value),
        nb=page_buffer_size // bs,
        bs=bs,
        nh=hidden // hs,
        hs=hs,
        dtype=key_value.dtype,
    )


def is_pointer_tensor(paged: Any) -> bool:
    """True for a 1-d int64 / uint64 tensor of buffer addresses."""
    return (
        isinstance(paged, torch.Tensor)
        and paged.dim() == 1
        and paged.dtype in (torch.int64, torch.uint64)
    )


def pointer_list(paged: torch.Tensor) -> list[int]:
    return [int(p) for p in paged.tolist()]


class BlockSummary(NamedTuple):
    """What the block checks need from the ids: counts, highest id, last slot per object."""

    valid_count: int
    highest: int
    last_slots: list[int]  # per object: last block slot that receives a block, or -1


def block_summary(block_ids: torch.Tensor, skip: int, blocks_per_object: int) -> BlockSummary:
    """Valid ids after ``skip``, the highest of them, and each object's last used slot."""
    total = block_ids.numel()
    objects = -(-total // blocks_per_object)
    positions = torch.arange(total, dtype=torch.int64)
    keep = (positions >= skip) & (block_ids >= 0)
    last_slots = [-1] * objects
    valid = positions[keep]
    for position in valid.tolist():
        last_slots[position // blocks_per_object] = position % blocks_per_object
    highest = int(block_ids[keep].max()) if valid.numel() else -1
    return BlockSummary(int(valid.numel()), highest, last_slots)


class SlotSummary(NamedTuple):
    """What the slot checks need: highest slot after skip (None: none), counts, last."""

    highest: int | None
    valid_count: int
    last: int  # position of the last valid slot, -1 when there is none


def slot_summary(slots: torch.Tensor, skip: int) -> SlotSummary:
    """Summary of a flat int64 slot mapping from position ``skip`` on."""
    tail = slots[max(0, skip) :]
    if tail.numel() == 0:
        return SlotSummary(None, 0, -1)
    valid = torch.nonzero(tail >= 0).reshape(-1)
    last = int(valid[-1]) + max(0, skip) if valid.numel() else -1
    return SlotSummary(int(tail.max()), int(valid.numel()), last)


def check_engine_slot_range(highest: int, num_slots: int) -> None:
    """KVIndexError unless slot ``highest`` exists among the engine's ``num_slots`` slots."""
    if highest >= num_slots:
        raise KVIndexError(f"slot {highest} is out of range for {num_slots} engine slots")
