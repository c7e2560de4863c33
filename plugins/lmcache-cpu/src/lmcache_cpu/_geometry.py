"""Engine and LMCache buffers as base addresses plus byte strides, for the native kernels.

The torch baseline turns every ``EngineKVFormat`` into canonical views ``[KV, NL, NB, BS,
NH, HS]``. The native kernels need the same information without building views: for every
(KV plane, layer) pair one base address, and the element strides of the block, token and
head axes. This module derives them from the format's spec record (``torch_ops._format_spec``:
container, axis names, packed tail, tuple axis) with integer arithmetic only.

Anything the native path does not model raises :class:`Unsupported`; the wrappers then call
the torch baseline, which either handles the input or raises its own, documented error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lmcache.v1.platform.torch_ops.plan import (
    Unsupported,
    flatten_engine_buffers,
    infer_kv_dtype,
    pointer_container,
    pointer_count,
    pointer_tensor_geometry,
)

__all__ = [
    "Buf",
    "EngineGeometry",
    "PlaneGroup",
    "Unsupported",
    "geometry_from_bufs",
    "geometry_from_pointers",
    "geometry_from_tensors",
    "tensor_buf",
]

_CANONICAL = ("KV", "NL", "NB", "BS", "NH", "HS")


class Buf:
    """One engine buffer: a real tensor or one rebuilt from a raw pointer.

    Deliberately not a tuple (engine containers are told apart by tuple-ness) and a plain
    slotted class: dozens are built per call on the hot path.
    """

    __slots__ = ("dtype", "itemsize", "ptr", "shape", "strides")

    def __init__(
        self,
        ptr: int,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        itemsize: int,
        dtype: torch.dtype,
    ) -> None:
        self.ptr = ptr
        self.shape = shape
        self.strides = strides
        self.itemsize = itemsize
        self.dtype = dtype


@dataclass
class PlaneGroup:
    """(KV plane, layer) slabs sharing strides and width: one native kernel call."""

    block_stride: int  # elements
    tok_stride: int
    head_stride: int
    width: int  # HS elements of this plane
    bases: list[int] = field(default_factory=list)
    kv: list[int] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)  # element offset inside an LMCache head


@dataclass
class EngineGeometry:
    groups: list[PlaneGroup]
    kv_size: int
    num_layers: int
    num_blocks: int
    block_size: int
    num_heads: int
    head_width: int
    itemsize: int
    dtype: torch.dtype

    @property
    def row_elems(self) -> int:
        """Elements per token row of an LMCache plane (``NH * head_width``)."""
        return self.num_heads * self.head_width

    def lmcache_slab_bytes(self) -> int:
        """Bytes of one token across every plane and layer of an LMCache object."""
        return self.kv_size * self.num_layers * self.row_elems * self.itemsize


def tensor_buf(tensor: Any, arg: str = "engine buffer") -> Buf:
    if not isinstance(tensor, torch.Tensor):
        raise Unsupported(f"{arg} is not a tensor")
    if not tensor.is_cpu:
        raise Unsupported(f"{arg} is on {tensor.device}")
    return Buf(
        tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.element_size(), tensor.dtype
    )


def _engine_items(paged: Any, spec: Any) -> list[tuple[Any, int, int, int]]:
    """The baseline's container flattening; a lone K/V buffer is left to the baseline."""
    try:
        return flatten_engine_buffers(paged, spec)
    except ZeroDivisionError:  # a kv_layers container with fewer than two buffers
        raise Unsupported("empty kv_layers container") from None


def _canonical_axes(buf: Buf, spec: Any, block_size: int, arg: str) -> dict[str, tuple[int, int]]:
    """``{axis: (size, element stride)}`` over the canonical axes for one buffer."""
    names = list(spec.dims)
    shape, strides = list(buf.shape), list(buf.strides)
    tail = spec.packed_tail
    if tail > 1 and len(shape) == len(names) + tail - 1:
        for axis in range(len(shape) - tail, len(shape) - 1):
            if shape[axis] != 1 and strides[axis] != strides[axis + 1] * shape[axis + 1]:
                raise ValueError(
                    f"{arg}: the packed K|V tail of the engine buffer is not contiguous"
                )
        shape[-tail:] = [math.prod(shape[-tail:])]
        strides[-tail:] = [strides[-1]]
    if len(shape) != len(names):
        raise Unsupported(f"{arg}: rank {len(shape)} does not match {spec.dims}")
    axes: dict[str, tuple[int, int]] = {}
    for name, size, stride in zip(names, shape, strides):
        if name == "PBS":
            if block_size <= 0 or size % block_size:
                raise Unsupported(f"{arg}: fused page axis of {size} is not a block multiple")
            axes["NB"] = (size // block_size, stride * block_size)
            axes["BS"] = (block_size, stride)
        elif name == "ONE":
            if size != 1:
                raise Unsupported(f"{arg}: unit axis has size {size}")
        else:
            axes[name] = (size, stride)
    for name in _CANONICAL:
        axes.setdefault(name, (1, 0))
    hs_size, hs_stride = axes["HS"]
    if hs_size > 1 and hs_stride != 1:
        raise ValueError(
            f"{arg}: the head dimension of the engine buffer must be contiguous "
            f"(stride {hs_stride}); pass a contiguous tensor or a view with unit head stride"
        )
    return axes


def _arg_name(root: str, spec: Any, index: int, plane: int) -> str:
    if spec.container == "cross":
        return root
    if spec.container == "layer_tuples":
        return f"{root}[{index}][{plane}]"
    return f"{root}[{index}]"


def geometry_from_bufs(
    items: list[tuple[Buf, int, int, int]], spec: Any, block_size: int, root: str
) -> EngineGeometry:
    """Plane groups for already-flattened engine buffers (see :func:`_engine_items`)."""
    if not items:
        raise Unsupported("no engine KV buffers given")
    described = []
    # Engines hand over many buffers of one shape: describe each distinct geometry once.
    seen: dict[tuple[Any, ...], dict[str, tuple[int, int]]] = {}
    for i, (buf, kv, layer, plane) in enumerate(items):
        shape_key = (tuple(buf.shape), tuple(buf.strides))
        axes = seen.get(shape_key)
        if axes is None:
            axes = _canonical_axes(buf, spec, block_size, _arg_name(root, spec, i, plane))
            seen[shape_key] = axes
        described.append((buf, axes, kv, layer, plane))

    first_buf, first_axes = described[0][0], described[0][1]
    ref = tuple(first_axes[a][0] for a in ("NB", "BS", "NH"))
    for buf, axes, *_ in described[1:]:
        if tuple(axes[a][0] for a in ("NB", "BS", "NH")) != ref or buf.dtype != first_buf.dtype:
            raise Unsupported("engine buffers disagree in shape or dtype")

    # MLA planes sit side by side along the LMCache head; offsets come from layer 0's widths.
    widths: dict[int, int] = {}
    for _buf, axes, _kv, layer, plane in described:
        if layer <= 0:
            widths.setdefault(plane, axes["HS"][0])
    offsets: dict[int, int] = {}
    acc = 0
    for plane in sorted(widths):
        offsets[plane] = acc
        acc += widths[plane]

    groups: dict[tuple[int, int, int, int], PlaneGroup] = {}
    head_width = 0
    for buf, axes, kv, layer, plane in described:
        width = axes["HS"][0]
        col = offsets.get(plane, 0) if spec.tuple_axis == "HS" else 0
        head_width = max(head_width, col + width)
        key = (axes["NB"][1], axes["BS"][1], axes["NH"][1], width)
        group = groups.get(key)
        if group is None:
            group = groups[key] = PlaneGroup(*key)
        kv_range = range(axes["KV"][0]) if kv < 0 else [kv]
        layer_range = range(axes["NL"][0]) if layer < 0 else [layer]
        for kv_i in kv_range:
            kv_off = kv_i * axes["KV"][1] if kv < 0 else 0
            for layer_i in layer_range:
                layer_off = layer_i * axes["NL"][1] if layer < 0 else 0
                group.bases.append(buf.ptr + (kv_off + layer_off) * buf.itemsize)
                group.kv.append(kv_i)
                group.layers.append(layer_i)
                group.cols.append(col)

    if spec.container == "cross":
        num_layers = first_axes["NL"][0]
    else:
        num_layers = 1 + max(layer for _b, _a, _kv, layer, _p in described)
    return EngineGeometry(
        groups=list(groups.values()),
        kv_size=spec.kv_size,
        num_layers=num_layers,
        num_blocks=first_axes["NB"][0],
        block_size=first_axes["BS"][0],
        num_heads=first_axes["NH"][0],
        head_width=head_width,
        itemsize=first_buf.itemsize,
        dtype=first_buf.dtype,
    )


def geometry_from_tensors(paged: Any, spec: Any, block_size: int, root: str) -> EngineGeometry:
    items = [
        (tensor_buf(t), kv, layer, plane) for t, kv, layer, plane in _engine_items(paged, spec)
    ]
    return geometry_from_bufs(items, spec, block_size, root)


# -- raw pointers ---------------------------------------------------------------------


def geometry_from_pointers(
    pointers: Sequence[int], spec: Any, desc: Any, device: Any, root: str
) -> EngineGeometry:
    """The baseline's pointer reconstruction (same checks), without building tensors."""
    if torch.device(device).type != "cpu":
        raise Unsupported("raw-pointer engine buffers on a non-cpu device")
    dtype = infer_kv_dtype(desc)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    nl = int(desc.nl)
    per_layer = pointer_count(spec, len(pointers), nl)
    shape, strides = pointer_tensor_geometry(
        spec, desc, per_layer if spec.tuple_axis == "HS" else 1
    )
    bufs = [Buf(int(p), tuple(shape), tuple(strides), itemsize, dtype) for p in pointers]
    items = _engine_items(pointer_container(spec, bufs, nl), spec)
    return geometry_from_bufs(items, spec, int(desc.bs), root)
