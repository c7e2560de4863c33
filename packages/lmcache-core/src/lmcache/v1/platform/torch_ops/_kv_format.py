"""Data-driven description of every ``EngineKVFormat`` and the views built from it.

Each format is one :class:`KVFormatSpec` record: how the engine hands over its buffers
(``container``), the axis names of one buffer (``dims``) and upstream's layout flags. The
transfer kernels never branch on a format: they turn the engine's buffers into *parts*, each a
view with the canonical axes ``[KV, NL, NB, BS, NH, HS]``, plus the slice of the LMCache
object (canonical ``[KV, NL, T, NH, HS]``) that the part maps to.

Engine buffers given as raw pointers are rebuilt into tensors by
:mod:`lmcache.v1.platform.torch_ops.plan`, which also re-exports this module's public
pieces for backends.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from lmcache.v1.platform.ops_types import EngineKVFormat

__all__ = ["KVFormatSpec", "_format_spec"]

CANONICAL_AXES = ("KV", "NL", "NB", "BS", "NH", "HS")

# How the engine passes its buffers:
#   cross        one tensor holding every layer
#   layers       NL x tensor
#   kv_layers    2 x NL x tensor (a K list and a V list; flat [K_0..K_n-1, V_0..V_n-1] too)
#   layer_tuples NL x tuple of tensors (K/V pairs, or MLA planes concatenated along HS)
CONTAINERS = ("cross", "layers", "kv_layers", "layer_tuples")


@dataclass(frozen=True)
class KVFormatSpec:
    """One engine KV layout.

    ``dims`` names the axes of one engine tensor after its ``packed_tail`` trailing axes are
    merged into ``HS`` (fused K|V layouts store ``[.., 2, HS]`` per head). ``ONE`` marks an
    axis of size one; ``PBS`` a fused ``NB*BS`` axis.
    """

    engine_kv_format: EngineKVFormat
    container: str
    dims: tuple[str, ...]
    attention_backends: tuple[str, ...]
    packed_tail: int = 1
    tuple_axis: str = ""  # layer_tuples only: "KV" (K, V) pairs or "HS" (MLA planes)
    cross_layer: bool = False
    kv_list: bool = False
    layer_list: bool = False
    mla: bool = False
    hnd: bool = False
    fused_packed: bool = False
    two_major: bool = False
    pbs_fused: bool = False
    kv_second_tuple: bool = False
    single_kv: bool = False

    @property
    def kv_size(self) -> int:
        """Planes in the LMCache object: 1 for MLA, fused K|V and single-KV layouts."""
        return 1 if (self.mla or self.fused_packed or self.single_kv) else 2

    # Upstream's KVFormatSpec class-attribute names, for code written against them.
    @property
    def is_cross_layer(self) -> bool:
        return self.cross_layer

    @property
    def is_kv_list(self) -> bool:
        return self.kv_list

    @property
    def is_layer_list(self) -> bool:
        return self.layer_list

    @property
    def is_mla(self) -> bool:
        return self.mla

    @property
    def is_hnd(self) -> bool:
        return self.hnd

    @property
    def is_fused_packed(self) -> bool:
        return self.fused_packed

    @property
    def is_two_major(self) -> bool:
        return self.two_major

    @property
    def is_pbs_fused(self) -> bool:
        return self.pbs_fused

    @property
    def is_kv_second_tuple(self) -> bool:
        return self.kv_second_tuple

    @property
    def is_single_kv(self) -> bool:
        return self.single_kv


F = EngineKVFormat
_SPECS: tuple[KVFormatSpec, ...] = (
    KVFormatSpec(F.NB_NL_TWO_BS_NH_HS, "cross", ("NB", "NL", "KV", "BS", "NH", "HS"),
                 ("vllm-cross-layer",), cross_layer=True),
    KVFormatSpec(F.NL_X_TWO_NB_BS_NH_HS, "layers", ("KV", "NB", "BS", "NH", "HS"),
                 ("vllm-flash-attn",), layer_list=True, two_major=True),
    KVFormatSpec(F.NL_X_NB_TWO_BS_NH_HS, "layers", ("NB", "KV", "BS", "NH", "HS"),
                 ("vllm-flashinfer",), layer_list=True),
    KVFormatSpec(F.NL_X_NB_BS_HS, "layers", ("NB", "BS", "HS"),
                 ("vllm-mla", "sglang-mla-mp"), layer_list=True, mla=True),
    KVFormatSpec(F.TWO_X_NL_X_NBBS_NH_HS, "kv_layers", ("PBS", "NH", "HS"),
                 ("sglang-mha",), kv_list=True, pbs_fused=True),
    KVFormatSpec(F.NL_X_NBBS_ONE_HS, "layers", ("PBS", "ONE", "HS"),
                 ("sglang-mla",), layer_list=True, mla=True, pbs_fused=True),
    KVFormatSpec(F.NL_X_TWO_NB_NH_BS_HS, "layers", ("KV", "NB", "NH", "BS", "HS"),
                 ("flash-attn-hnd",), layer_list=True, hnd=True, two_major=True),
    KVFormatSpec(F.NL_X_NB_TWO_NH_BS_HS, "layers", ("NB", "KV", "NH", "BS", "HS"),
                 ("flashinfer-hnd",), layer_list=True, hnd=True),
    KVFormatSpec(F.NB_NL_TWO_NH_BS_HS, "cross", ("NB", "NL", "KV", "NH", "BS", "HS"),
                 ("trtllm-cross-layer-hnd",), cross_layer=True, hnd=True),
    KVFormatSpec(F.TWO_X_NL_X_NB_BS_NH_HS, "kv_layers", ("NB", "BS", "NH", "HS"),
                 ("sglang-mha-mp",), kv_list=True),
    KVFormatSpec(F.NL_X_NB_NH_BS_TWO_HS, "layers", ("NB", "NH", "BS", "HS"),
                 ("vllm-blocks-first-hnd",), packed_tail=2, layer_list=True, hnd=True,
                 fused_packed=True),
    KVFormatSpec(F.NL_X_NB_BS_NH_TWO_HS, "layers", ("NB", "BS", "NH", "HS"),
                 ("vllm-blocks-first-nhd",), packed_tail=2, layer_list=True,
                 fused_packed=True),
    KVFormatSpec(F.NL_X_NB_NH_BS_CS, "layers", ("NB", "NH", "BS", "HS"),
                 ("fused-kv-hnd", "vllm-cpu"), layer_list=True, hnd=True, fused_packed=True),
    KVFormatSpec(F.NL_X_NB_BS_NH_CS, "layers", ("NB", "BS", "NH", "HS"),
                 ("fused-kv-nhd",), layer_list=True, fused_packed=True),
    KVFormatSpec(F.NL_X_NB_BSV_BSS, "layers", ("NB", "BS", "HS"),
                 ("dsa-indexer",), layer_list=True, mla=True),
    KVFormatSpec(F.NL_X_TWO_NB_NH_ONE_BS_HS, "layers", ("KV", "NB", "NH", "ONE", "BS", "HS"),
                 ("vllm-rbln",), layer_list=True, hnd=True, two_major=True),
    KVFormatSpec(F.NL_X_TWO_X_NB_BS_NH_HS, "layer_tuples", ("NB", "BS", "NH", "HS"),
                 ("vllm-ascend",), tuple_axis="KV", layer_list=True, kv_second_tuple=True),
    KVFormatSpec(F.NL_X_NP_X_NB_BS_ONE_HS, "layer_tuples", ("NB", "BS", "ONE", "HS"),
                 ("mla-dsa-planes",), tuple_axis="HS", layer_list=True, mla=True,
                 kv_second_tuple=True),
    KVFormatSpec(F.NL_X_NB_BS_NH_HS, "layers", ("NB", "BS", "NH", "HS"),
                 ("sglang-components",), layer_list=True, single_kv=True),
)  # fmt: skip
del F

_SPEC_BY_VALUE: dict[int, KVFormatSpec] = {int(s.engine_kv_format): s for s in _SPECS}


def _format_spec(fmt: int | EngineKVFormat) -> KVFormatSpec:
    """The spec of ``fmt``; ValueError for a value that is not an ``EngineKVFormat``."""
    try:
        return _SPEC_BY_VALUE[int(fmt)]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"unsupported engine_kv_format: {fmt!r}") from None


def _all_specs() -> tuple[KVFormatSpec, ...]:
    return _SPECS


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
    names = list(spec.dims)
    if tensor.dim() == len(names) + spec.packed_tail - 1 and spec.packed_tail > 1:
        tensor = tensor.flatten(-spec.packed_tail)
    if tensor.dim() != len(names):
        raise ValueError(
            f"{spec.engine_kv_format.name}: expected a {len(names)}-d engine tensor "
            f"{list(spec.dims)}, got shape {tuple(tensor.shape)}"
        )
    if "PBS" in names:
        if block_size <= 0:
            raise ValueError(f"{spec.engine_kv_format.name}: needs a positive block size")
        axis = names.index("PBS")
        tensor = tensor.unflatten(axis, (-1, block_size))
        names[axis : axis + 1] = ["NB", "BS"]
    while "ONE" in names:
        axis = names.index("ONE")
        tensor = tensor.squeeze(axis)
        names.pop(axis)
    for axis_name in CANONICAL_AXES:
        if axis_name not in names:
            tensor = tensor.unsqueeze(-1)
            names.append(axis_name)
    return tensor.permute([names.index(a) for a in CANONICAL_AXES])


def _engine_tensors(paged: Any, spec: KVFormatSpec) -> list[tuple[Any, int, int, int]]:
    """Flatten the engine container into ``(tensor, kv_index, layer_index, plane_index)``.

    An index of -1 means the tensor spans that whole axis. Elements are passed through
    untouched, so backends flatten their own buffer descriptions with it too (public as
    ``plan.flatten_engine_buffers``).
    """
    if spec.container == "cross":
        tensor = paged[0] if isinstance(paged, (list, tuple)) else paged
        return [(tensor, -1, -1, 0)]
    items = list(paged)
    if spec.container == "layers":
        return [(t, -1, layer, 0) for layer, t in enumerate(items)]
    if spec.container == "kv_layers":
        if len(items) == 2 and isinstance(items[0], (list, tuple)):
            items = [*items[0], *items[1]]
        half = len(items) // 2
        return [(t, i // half, i % half, 0) for i, t in enumerate(items)]
    out = []
    for layer, group in enumerate(items):
        for j, t in enumerate(group):
            kv = j if spec.tuple_axis == "KV" else -1
            out.append((t, kv, layer, j))
    return out


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


def paged_layout_from_tensors(paged: Any, spec: KVFormatSpec, block_size: int) -> PagedLayout:
    """Parts for engine buffers given as tensors (lists / tuples as the format says)."""
    tensors = _engine_tensors(paged, spec)
    if not tensors:
        raise ValueError("no engine KV buffers given")
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
