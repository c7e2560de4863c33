"""Torch views of engine and LMCache buffers, built from the shared geometry.

The format table lives in :mod:`lmcache.v1.platform.kv_formats` and the view-free strided
geometry in :mod:`lmcache.v1.platform.kv_geometry`; this module only turns that
geometry into views for the torch baseline: each engine buffer becomes *parts*, views with
the canonical axes ``[KV, NL, NB, BS, NH, HS]``, plus the slice of the LMCache object
(canonical ``[KV, NL, T, NH, HS]``) that each part maps to.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from lmcache.v1.platform.kv_formats import KVFormatSpec, all_specs, format_spec
from lmcache.v1.platform.kv_geometry import (
    byte_plane_geometry,
    canonical_axes,
    flatten_engine_buffers,
    mixed_plane_dtypes,
)

__all__ = ["KVFormatSpec", "_format_spec"]

# Kept for code written against the 0.5.6 private names.
_format_spec = format_spec
_all_specs = all_specs
_engine_tensors = flatten_engine_buffers


# --------------------------------------------------------------------------------------
# Engine side: buffers -> canonical parts
# --------------------------------------------------------------------------------------


class Part(NamedTuple):
    """One engine view ``[KV, NL, NB, BS, NH, HS]`` and where it lands in the object."""

    view: torch.Tensor
    kv: slice
    layers: slice
    cols: slice


@dataclass
class PagedLayout:
    """Every engine buffer of one call as canonical parts, plus the derived sizes."""

    spec: KVFormatSpec
    parts: list[Part]
    num_layers: int
    num_blocks: int
    block_size: int
    num_heads: int
    head_width: int  # HS of the LMCache object (sum over MLA planes)
    dtype: torch.dtype
    device: torch.device

    def object_shape(self, num_tokens: int) -> tuple[int, ...]:
        """The LMCache object shape upstream uses for raw-pointer objects."""
        row = self.num_heads * self.head_width
        if self.spec.kv_size == 1:
            return (self.num_layers, num_tokens, row)
        return (2, self.num_layers, num_tokens, row)


def _canonical_view(tensor: torch.Tensor, spec: KVFormatSpec, block_size: int) -> torch.Tensor:
    """View one engine tensor with the axes ``[KV, NL, NB, BS, NH, HS]`` (no copy)."""
    axes = canonical_axes(tensor.shape, tensor.stride(), spec, block_size)
    return tensor.as_strided(
        [size for size, _ in axes], [stride for _, stride in axes], tensor.storage_offset()
    )


def _merge_layer_parts(parts: list[Part]) -> list[Part]:
    """Fuse per-layer views that sit at a constant stride in one storage into one view.

    Engines often carve every layer out of one allocation; one strided view then moves all
    layers with a single op instead of one op per layer.
    """
    if len(parts) < 2:
        return parts
    first = parts[0].view
    same = all(
        p.kv == parts[0].kv
        and p.cols == parts[0].cols
        and p.layers == slice(i, i + 1)
        and p.view.shape == first.shape
        and p.view.stride() == first.stride()
        and p.view.dtype == first.dtype
        and p.view.device == first.device
        and p.view.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        for i, p in enumerate(parts)
    )
    if not same or first.shape[1] != 1:
        return parts
    offsets = [int(p.view.storage_offset()) for p in parts]
    step = offsets[1] - offsets[0]
    if step <= 0 or any(b - a != step for a, b in itertools.pairwise(offsets)):
        return parts
    size = [int(s) for s in first.shape]
    size[1] = len(parts)
    stride = list(first.stride())
    stride[1] = step
    merged = first.as_strided(size, stride, offsets[0])
    return [Part(merged, parts[0].kv, slice(0, len(parts)), parts[0].cols)]


def _build_parts(
    tensors: list[tuple[torch.Tensor, int, int, int]], spec: KVFormatSpec, block_size: int
) -> list[Part]:
    views = [
        (_canonical_view(t, spec, block_size), kv, layer, plane) for t, kv, layer, plane in tensors
    ]
    # MLA planes sit side by side along HS; their offsets come from the widths of layer 0.
    plane_widths: dict[int, int] = {}
    for view, _kv, layer, plane in views:
        if layer <= 0:
            plane_widths.setdefault(plane, view.shape[-1])
    plane_offsets = [0]
    for plane in sorted(plane_widths):
        plane_offsets.append(plane_offsets[-1] + plane_widths[plane])
    parts = []
    for view, kv, layer, plane in views:
        kv_slice = slice(None) if kv < 0 else slice(kv, kv + 1)
        layer_slice = slice(None) if layer < 0 else slice(layer, layer + 1)
        if spec.tuple_axis == "HS":
            cols = slice(plane_offsets[plane], plane_offsets[plane] + view.shape[-1])
        else:
            cols = slice(None)
        parts.append(Part(view, kv_slice, layer_slice, cols))
    if spec.container == "layers":
        return _merge_layer_parts(parts)
    return parts


def _layout_from_parts(spec: KVFormatSpec, parts: list[Part], num_layers: int) -> PagedLayout:
    view = parts[0].view
    head_width = max(p.cols.stop or p.view.shape[-1] for p in parts)
    return PagedLayout(
        spec=spec,
        parts=parts,
        num_layers=num_layers,
        num_blocks=view.shape[2],
        block_size=view.shape[3],
        num_heads=view.shape[4],
        head_width=head_width,
        dtype=view.dtype,
        device=view.device,
    )


def _byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as uint8, its last axis widened to bytes (same storage, no copy)."""
    itemsize = tensor.element_size()
    shape, strides = byte_plane_geometry(tensor.shape, tensor.stride(), itemsize)
    data = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    data.set_(tensor.untyped_storage())
    return data.as_strided(shape, strides, tensor.storage_offset() * itemsize)


def paged_layout_from_tensors(paged: Any, spec: KVFormatSpec, block_size: int) -> PagedLayout:
    """Parts for engine buffers given as tensors (lists / tuples as the format says).

    MLA planes of mixed dtypes become byte views, so the LMCache head packs them by bytes.
    """
    tensors = flatten_engine_buffers(paged, spec)
    if not tensors:
        raise ValueError("no engine KV buffers given")
    if mixed_plane_dtypes(spec, (t.dtype for t, *_ in tensors if isinstance(t, torch.Tensor))):
        tensors = [
            (_byte_view(t) if isinstance(t, torch.Tensor) else t, kv, layer, plane)
            for t, kv, layer, plane in tensors
        ]
    parts = _build_parts(tensors, spec, block_size)
    if spec.container == "cross":
        num_layers = parts[0].view.shape[1]
    else:
        num_layers = 1 + max(layer for _t, _kv, layer, _p in tensors)
    layout = _layout_from_parts(spec, parts, num_layers)
    for _view, *_ in parts[1:]:
        if _view.shape[2:5] != parts[0].view.shape[2:5] or _view.dtype != layout.dtype:
            raise ValueError(
                f"{spec.engine_kv_format.name}: engine buffers disagree in shape or dtype"
            )
    return layout


# --------------------------------------------------------------------------------------
# LMCache side
# --------------------------------------------------------------------------------------


def canonical_object(obj: torch.Tensor, layout: PagedLayout) -> torch.Tensor:
    """View an LMCache object / key_value buffer as ``[KV, NL, T, NH, HS]`` (no copy).

    Accepts the upstream shapes (``[2, NL, T, NH*HS]``, ``[NL, T, NH*HS]``, MLA
    ``[NL, T, HS]``) and any other contiguous tensor with the same bytes.
    """
    if obj.dtype != layout.dtype:
        obj = obj.view(layout.dtype)
    kv = layout.spec.kv_size
    if obj.dim() == 4 and obj.shape[0] != kv:
        raise ValueError(
            f"{layout.spec.engine_kv_format.name}: LMCache buffer has {obj.shape[0]} KV planes, "
            f"the layout stores {kv}"
        )
    return obj.view(kv, layout.num_layers, -1, layout.num_heads, layout.head_width)
