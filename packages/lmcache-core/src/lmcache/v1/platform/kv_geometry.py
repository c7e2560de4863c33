"""View-free strided geometry of engine KV buffers, shared by the baseline and every kernel.

For every ``EngineKVFormat`` (:mod:`lmcache.v1.platform.kv_formats`) this module turns the
engine's buffers -- tensors, or raw addresses shaped by a ``PageBufferShapeDesc`` -- into
integers: for each (KV plane, layer) slab one base address, plus the element strides of the
block, token and head axes and the slab's column offset inside an LMCache head. The torch
baseline builds its views from the same numbers (:func:`canonical_axes`), so a native kernel
that copies by these strides addresses exactly the bytes the baseline does.

Only shapes and strides are read: no views, no copies, no device runtime.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lmcache.v1.platform.kv_formats import CANONICAL_AXES, KVFormatSpec

__all__ = [
    "Axes",
    "Buf",
    "byte_plane_geometry",
    "EngineGeometry",
    "ObjectGeometry",
    "PlaneGroup",
    "canonical_axes",
    "flatten_engine_buffers",
    "geometry_from_bufs",
    "geometry_from_tensors",
    "mixed_plane_dtypes",
    "pointer_object_geometry",
    "tensor_buf",
]

Axes = tuple[tuple[int, int], ...]
"""``(size, element stride)`` for each of ``CANONICAL_AXES`` (``[KV, NL, NB, BS, NH, HS]``)."""

TensorCheck = Callable[[torch.Tensor, str], None]

_KV, _NL, _NB, _BS, _NH, _HS = range(6)


def canonical_axes(
    shape: Sequence[int], strides: Sequence[int], spec: KVFormatSpec, block_size: int, arg: str = ""
) -> Axes:
    """Sizes and element strides of one engine buffer over ``[KV, NL, NB, BS, NH, HS]``.

    Merges a packed K|V tail into ``HS``, splits a fused ``PBS`` axis by ``block_size``,
    drops unit ``ONE`` axes and gives absent axes size 1 (stride 0). ValueError, naming the
    format (and ``arg`` when given), for a buffer the format cannot describe.
    """
    name = spec.engine_kv_format.name
    where = f"{name} {arg}".rstrip()
    names = list(spec.dims)
    sizes, steps = [int(s) for s in shape], [int(s) for s in strides]
    tail = spec.packed_tail
    if tail > 1 and len(sizes) == len(names) + tail - 1:
        for axis in range(len(sizes) - tail, len(sizes) - 1):
            if sizes[axis] != 1 and steps[axis] != steps[axis + 1] * sizes[axis + 1]:
                raise ValueError(
                    f"{where}: the packed K|V tail of the engine buffer is not contiguous"
                )
        sizes[-tail:] = [math.prod(sizes[-tail:])]
        steps[-tail:] = [steps[-1]]
    if len(sizes) != len(names):
        raise ValueError(
            f"{name}: expected a {len(names)}-d engine tensor {list(spec.dims)}, "
            f"got shape {tuple(int(s) for s in shape)}"
        )
    axes: dict[str, tuple[int, int]] = {}
    for axis_name, size, step in zip(names, sizes, steps):
        if axis_name == "PBS":
            if block_size <= 0:
                raise ValueError(f"{name}: needs a positive block size")
            if size % block_size:
                raise ValueError(
                    f"{where}: fused page axis of {size} slots is not a multiple of the "
                    f"block size {block_size}"
                )
            axes["NB"] = (size // block_size, step * block_size)
            axes["BS"] = (block_size, step)
        elif axis_name == "ONE":
            if size != 1:
                raise ValueError(f"{where}: the unit axis of the engine buffer has size {size}")
        else:
            axes[axis_name] = (size, step)
    return tuple(axes.get(axis_name, (1, 0)) for axis_name in CANONICAL_AXES)


def flatten_engine_buffers(paged: Any, spec: KVFormatSpec) -> list[tuple[Any, int, int, int]]:
    """The engine container as ``(buffer, kv_index, layer_index, plane_index)`` items.

    An index of -1 means the buffer spans that whole axis. Items are passed through
    untouched, so tensors, :class:`Buf` records or anything else can be flattened.
    """
    if spec.container == "cross":
        return [(paged[0] if isinstance(paged, (list, tuple)) else paged, -1, -1, 0)]
    items = list(paged)
    if spec.container == "layers":
        return [(t, -1, layer, 0) for layer, t in enumerate(items)]
    if spec.container == "kv_layers":
        if len(items) == 2 and isinstance(items[0], (list, tuple)):
            items = [*items[0], *items[1]]
        if len(items) < 2 or len(items) % 2:
            raise ValueError(
                f"{spec.engine_kv_format.name}: needs a K and a V buffer per layer, "
                f"got {len(items)} buffers"
            )
        half = len(items) // 2
        return [(t, i // half, i % half, 0) for i, t in enumerate(items)]
    out = []
    for layer, group in enumerate(items):
        for j, t in enumerate(group):
            out.append((t, j if spec.tuple_axis == "KV" else -1, layer, j))
    return out


# --------------------------------------------------------------------------------------
# Mixed-dtype MLA planes
# --------------------------------------------------------------------------------------


def mixed_plane_dtypes(spec: KVFormatSpec, dtypes: Iterable[torch.dtype]) -> bool:
    """True when the planes of an MLA plane tuple do not share one dtype.

    Such planes (an int8 latent beside a float16 scale, say) are packed into the LMCache
    head by bytes, as upstream packs them: every plane is then moved as raw bytes.
    """
    return spec.tuple_axis == "HS" and len(set(dtypes)) > 1


def byte_plane_geometry(
    shape: Sequence[int], strides: Sequence[int], itemsize: int, arg: str = ""
) -> tuple[list[int], list[int]]:
    """Shape and strides of one plane reinterpreted as bytes along its last axis."""
    sizes, steps = [int(s) for s in shape], [int(s) for s in strides]
    if not sizes:
        return sizes, steps  # canonical_axes refuses a 0-d buffer with its own message
    if sizes[-1] > 1 and steps[-1] != 1:
        where = f"{arg}: " if arg else ""
        raise ValueError(
            f"{where}planes of mixed dtypes move as bytes and must be contiguous in their "
            f"last axis (got strides {tuple(steps)})"
        )
    return [*sizes[:-1], sizes[-1] * itemsize], [s * itemsize for s in steps[:-1]] + [1]


def _byte_buf(buf: Buf, arg: str) -> Buf:
    shape, strides = byte_plane_geometry(buf.shape, buf.strides, buf.itemsize, arg)
    return Buf(buf.ptr, shape, strides, 1, torch.uint8, buf.device)


# --------------------------------------------------------------------------------------
# Engine buffers -> plane groups
# --------------------------------------------------------------------------------------


class Buf:
    """One engine buffer as numbers: a real tensor's, or one described by a pointer.

    Deliberately not a tuple (engine containers are told apart by tuple-ness) and a plain
    slotted class: dozens are built per call on the hot path.
    """

    __slots__ = ("device", "dtype", "itemsize", "ptr", "shape", "strides")

    def __init__(
        self,
        ptr: int,
        shape: Sequence[int],
        strides: Sequence[int],
        itemsize: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.ptr = ptr
        self.shape = tuple(shape)
        self.strides = tuple(strides)
        self.itemsize = itemsize
        self.dtype = dtype
        self.device = device


def tensor_buf(tensor: torch.Tensor) -> Buf:
    """The numbers of one engine tensor (its address, shape, strides, dtype, device)."""
    return Buf(
        tensor.data_ptr(),
        tensor.shape,
        tensor.stride(),
        tensor.element_size(),
        tensor.dtype,
        tensor.device,
    )


@dataclass
class PlaneGroup:
    """(KV plane, layer) slabs sharing strides and width: one kernel call moves them all."""

    block_stride: int  # elements
    tok_stride: int
    head_stride: int
    width: int  # HS elements of this plane
    bases: list[int] = field(default_factory=list)  # addresses
    kv: list[int] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)  # element offset inside an LMCache head


@dataclass
class EngineGeometry:
    """Every engine buffer of one call as plane groups, plus the derived sizes."""

    groups: list[PlaneGroup]
    kv_size: int
    num_layers: int
    num_blocks: int
    block_size: int
    num_heads: int
    head_width: int  # HS of the LMCache object (sum over MLA planes)
    itemsize: int
    dtype: torch.dtype
    device: torch.device
    strided_head_arg: str = ""  # first buffer whose head axis is not contiguous

    @property
    def row_elems(self) -> int:
        """Elements per token row of an LMCache plane (``NH * head_width``)."""
        return self.num_heads * self.head_width

    def lmcache_slab_bytes(self) -> int:
        """Bytes of one token across every plane and layer of an LMCache object."""
        return self.kv_size * self.num_layers * self.row_elems * self.itemsize

    def object_shape(self, num_tokens: int) -> tuple[int, ...]:
        """The LMCache object shape upstream uses for raw-pointer objects."""
        if self.kv_size == 1:
            return (self.num_layers, num_tokens, self.row_elems)
        return (2, self.num_layers, num_tokens, self.row_elems)


def _arg_name(root: str, spec: KVFormatSpec, index: int, plane: int) -> str:
    if spec.container == "cross":
        return root
    if spec.container == "layer_tuples":
        return f"{root}[{index}][{plane}]"
    return f"{root}[{index}]"


def _plane_offsets(described: list[tuple[Buf, Axes, int, int, int]]) -> dict[int, int]:
    """MLA planes sit side by side along the LMCache head; offsets from layer 0's widths."""
    widths: dict[int, int] = {}
    for _buf, axes, _kv, layer, plane in described:
        if layer <= 0:
            widths.setdefault(plane, axes[_HS][0])
    offsets: dict[int, int] = {}
    acc = 0
    for plane in sorted(widths):
        offsets[plane] = acc
        acc += widths[plane]
    return offsets


def geometry_from_bufs(
    items: list[tuple[Buf, int, int, int]], spec: KVFormatSpec, block_size: int, root: str
) -> EngineGeometry:
    """Plane groups for flattened engine buffers (see :func:`flatten_engine_buffers`)."""
    if not items:
        raise ValueError("no engine KV buffers given")
    if mixed_plane_dtypes(spec, (buf.dtype for buf, *_ in items)):
        items = [
            (_byte_buf(buf, _arg_name(root, spec, i, plane)), kv, layer, plane)
            for i, (buf, kv, layer, plane) in enumerate(items)
        ]
    described = []
    strided_head = ""
    # Engines hand over many buffers of one shape: describe each distinct geometry once.
    seen: dict[tuple[Any, ...], Axes] = {}
    for i, (buf, kv, layer, plane) in enumerate(items):
        axes = seen.get((buf.shape, buf.strides))
        arg = _arg_name(root, spec, i, plane)
        if axes is None:
            axes = seen[buf.shape, buf.strides] = canonical_axes(
                buf.shape, buf.strides, spec, block_size, arg
            )
        if not strided_head and axes[_HS][0] > 1 and axes[_HS][1] != 1:
            strided_head = arg
        described.append((buf, axes, kv, layer, plane))

    first_buf, first_axes = described[0][0], described[0][1]
    ref = (first_axes[_NB][0], first_axes[_BS][0], first_axes[_NH][0])
    for buf, axes, *_ in described[1:]:
        if (axes[_NB][0], axes[_BS][0], axes[_NH][0]) != ref or buf.dtype != first_buf.dtype:
            raise ValueError(
                f"{spec.engine_kv_format.name}: engine buffers disagree in shape or dtype"
            )

    offsets = _plane_offsets(described)
    groups: dict[tuple[int, int, int, int], PlaneGroup] = {}
    head_width = 0
    for buf, axes, kv, layer, plane in described:
        width = axes[_HS][0]
        col = offsets.get(plane, 0) if spec.tuple_axis == "HS" else 0
        head_width = max(head_width, col + width)
        key = (axes[_NB][1], axes[_BS][1], axes[_NH][1], width)
        group = groups.get(key)
        if group is None:
            group = groups[key] = PlaneGroup(*key)
        for kv_i in range(axes[_KV][0]) if kv < 0 else [kv]:
            kv_off = kv_i * axes[_KV][1] if kv < 0 else 0
            for layer_i in range(axes[_NL][0]) if layer < 0 else [layer]:
                layer_off = layer_i * axes[_NL][1] if layer < 0 else 0
                group.bases.append(buf.ptr + (kv_off + layer_off) * buf.itemsize)
                group.kv.append(kv_i)
                group.layers.append(layer_i)
                group.cols.append(col)

    if spec.container == "cross":
        num_layers = first_axes[_NL][0]
    else:
        num_layers = 1 + max(layer for _b, _a, _kv, layer, _p in described)
    return EngineGeometry(
        groups=list(groups.values()),
        kv_size=spec.kv_size,
        num_layers=num_layers,
        num_blocks=first_axes[_NB][0],
        block_size=first_axes[_BS][0],
        num_heads=first_axes[_NH][0],
        head_width=head_width,
        itemsize=first_buf.itemsize,
        dtype=first_buf.dtype,
        device=first_buf.device,
        strided_head_arg=strided_head,
    )


def geometry_from_tensors(
    paged: Any,
    spec: KVFormatSpec,
    block_size: int,
    root: str,
    check: TensorCheck | None = None,
) -> EngineGeometry:
    """Plane groups for engine tensors; ``check(tensor, arg)`` vets each one first."""
    items = []
    for i, (tensor, kv, layer, plane) in enumerate(flatten_engine_buffers(paged, spec)):
        if check is not None:
            check(tensor, _arg_name(root, spec, i, plane))
        items.append((tensor_buf(tensor), kv, layer, plane))
    return geometry_from_bufs(items, spec, block_size, root)


# --------------------------------------------------------------------------------------
# LMCache side
# --------------------------------------------------------------------------------------


@dataclass
class ObjectGeometry:
    """An LMCache buffer ``[KV, NL, T, NH, HW]``: address plus byte strides and tokens."""

    address: int
    kv_stride: int
    layer_stride: int
    row_stride: int
    head_stride: int
    tokens: int

    def plane_address(self, kv: int, layer: int, col_bytes: int = 0) -> int:
        """Address of token 0 of plane ``kv`` of ``layer``, ``col_bytes`` into the head."""
        return self.address + kv * self.kv_stride + layer * self.layer_stride + col_bytes


def pointer_object_geometry(address: int, geom: EngineGeometry, tokens: int) -> ObjectGeometry:
    """A contiguous chunk object of ``tokens`` tokens at ``address`` (upstream's shape)."""
    row = geom.row_elems * geom.itemsize
    per_layer = tokens * row
    return ObjectGeometry(
        address,
        geom.num_layers * per_layer,
        per_layer,
        row,
        geom.head_width * geom.itemsize,
        tokens,
    )
