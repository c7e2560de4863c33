"""Argument normalization and geometry shared by the torch baseline and native backends.

Every KV-transfer op of :mod:`lmcache.v1.platform.torch_ops` first turns its arguments into
a backend-neutral description of the copy: which blocks or slots move (with padding and
skipped prefixes removed), the engine buffers as canonical views ``[KV, NL, NB, BS, NH,
HS]`` (:class:`PagedLayout`), the LMCache buffer as ``[KV, NL, T, NH, HS]`` and, in pointer
mode, the shapes and strides rebuilt from a :class:`PageBufferShapeDesc`. Only the final
data movement differs between backends.

This module is that first half, as a stable API for vendor plugins: a plugin that wraps
native kernels with the ``torch_ops`` signatures calls these helpers, so its checks, the
order they run in, and their exception types and messages are the baseline's by
construction. A native path that meets an input it does not model raises
:class:`Unsupported`; :func:`falls_back_to` turns that into a call of the baseline op
with the original arguments.

Nothing here copies KV data or touches a device runtime.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

import torch

from lmcache.v1.platform.ops_types import (
    EngineKVFormat,
    KVIndexError,
    PageBufferShapeDesc,
    TransferDirection,
)
from lmcache.v1.platform.torch_ops._kv_format import (
    KVFormatSpec,
    PagedLayout,
    Part,
    canonical_object,
    paged_layout_from_tensors,
)
from lmcache.v1.platform.torch_ops._kv_format import _engine_tensors as flatten_engine_buffers
from lmcache.v1.platform.torch_ops._kv_format import _format_spec as format_spec
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
    "token_layout",
    "token_pointer_shape_desc",
    "validate_direction",
]

BlockRun = tuple[int, "slice | torch.Tensor", torch.Tensor]
"""``(object index, object block slots, engine block ids)`` of one LMCache object."""

_Op = TypeVar("_Op", bound=Callable[..., Any])


# --------------------------------------------------------------------------------------
# Deferring to the baseline
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Scalar arguments
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Block-granular transfers (multi_layer_block_kv_transfer)
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Token-granular transfers (slot mappings)
# --------------------------------------------------------------------------------------


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


def _layer_count(key_value: torch.Tensor) -> int:
    """Layers of ``[KV, NL, T, D]`` (or an MLA ``[NL, T, D]``)."""
    planes = key_value if key_value.dim() == 4 else key_value.unsqueeze(0)
    return int(planes.shape[1])


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


# --------------------------------------------------------------------------------------
# Engine buffers given as raw pointers
# --------------------------------------------------------------------------------------

_ELEMENT_SIZE_DTYPES = {1: torch.uint8, 2: torch.float16, 4: torch.float32}


def is_pointer_tensor(paged: Any) -> bool:
    """True for a 1-d int64 / uint64 tensor of buffer addresses."""
    return (
        isinstance(paged, torch.Tensor)
        and paged.dim() == 1
        and paged.dtype in (torch.int64, torch.uint64)
    )


def pointer_list(paged: torch.Tensor) -> list[int]:
    return [int(p) for p in paged.tolist()]


def infer_kv_dtype(shape_desc: PageBufferShapeDesc) -> torch.dtype:
    """The dtype of raw-pointer buffers: ``shape_desc.dtype``, else by ``element_size``."""
    dtype = shape_desc.dtype
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype:
        candidate = getattr(torch, dtype.removeprefix("torch."), None)
        if isinstance(candidate, torch.dtype):
            return candidate
    try:
        return _ELEMENT_SIZE_DTYPES[int(shape_desc.element_size)]
    except KeyError:
        raise ValueError(
            f"cannot infer the KV dtype: shape_desc.dtype={dtype!r}, "
            f"element_size={shape_desc.element_size!r}"
        ) from None


def pointer_count(spec: KVFormatSpec, num_pointers: int, num_layers: int) -> int:
    """Tensors per pointer group (planes per layer for tuple layouts), validated."""
    expected = {"cross": 1, "layers": num_layers, "kv_layers": 2 * num_layers}
    if spec.container in expected:
        if num_pointers != expected[spec.container]:
            raise ValueError(
                f"{spec.engine_kv_format.name}: expected {expected[spec.container]} buffer "
                f"pointers (shape_desc.nl={num_layers}), got {num_pointers}"
            )
        return 1
    if num_layers <= 0 or num_pointers % num_layers:
        raise ValueError(
            f"{spec.engine_kv_format.name}: {num_pointers} pointers do not split into "
            f"shape_desc.nl={num_layers} layers"
        )
    return num_pointers // num_layers


def pointer_tensor_geometry(
    spec: KVFormatSpec, desc: PageBufferShapeDesc, planes: int
) -> tuple[list[int], list[int]]:
    """Shape and element strides of one engine tensor rebuilt from ``shape_desc``.

    ``planes`` is the :func:`pointer_count` of an ``HS``-tuple layout (MLA planes share
    ``shape_desc.hs`` equally), else 1.
    """
    sizes = {
        "KV": 2,
        "NL": desc.nl,
        "NB": desc.nb,
        "BS": desc.bs,
        "PBS": desc.nb * desc.bs,
        "NH": desc.nh,
        "HS": desc.hs // planes,
        "ONE": 1,
    }
    shape = [int(sizes[name]) for name in spec.dims]
    if min(shape) <= 0:
        raise ValueError(f"{spec.engine_kv_format.name}: shape_desc gives shape {shape}")
    strides = [1] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * shape[axis + 1]
    block_stride = int(desc.block_stride_elems)
    if block_stride and "NB" in spec.dims:
        nb_axis = spec.dims.index("NB")
        if block_stride < strides[nb_axis]:
            raise ValueError(
                f"shape_desc.block_stride_elems={block_stride} is smaller than one block "
                f"({strides[nb_axis]} elements)"
            )
        strides[nb_axis] = block_stride
        for axis in range(nb_axis - 1, -1, -1):
            strides[axis] = strides[axis + 1] * shape[axis + 1]
    elif block_stride and block_stride != math.prod(shape[1:]):
        raise ValueError(f"{spec.engine_kv_format.name}: non-tight block stride unsupported")
    return shape, strides


def pointer_container(spec: KVFormatSpec, buffers: list[Any], num_layers: int) -> Any:
    """Arrange buffers rebuilt from pointers the way the format's container expects."""
    if spec.container in ("cross", "layers", "kv_layers"):
        return buffers
    per_layer = len(buffers) // num_layers
    return [tuple(buffers[i * per_layer : (i + 1) * per_layer]) for i in range(num_layers)]


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
