"""Upstream LMCache 0.5.6's ``KVFormatSpec`` interface, driven by lmcache-core's format table.

Upstream hand-writes one ``KVFormatSpec`` subclass per ``EngineKVFormat``. Here the
subclasses are generated (:mod:`.registry`) from the records of
:mod:`lmcache.v1.platform.kv_formats`, so the layout facts live in one table only; this
base class answers every geometry question generically from the record's axis names,
through :func:`lmcache.v1.platform.kv_geometry.canonical_axes` (the same axis reading the
transfer kernels use) and :func:`~lmcache.v1.platform.kv_geometry.flatten_engine_buffers`.

A spec *borrows* ``kv_caches``: build one per question (``get_spec(...).num_layers()``) and
drop it, so it never keeps an engine's KV tensors alive.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from lmcache.compat.upstream_056.gpu_connector.kv_format.types import DiscoverableKVCache
from lmcache.v1.platform.kv_formats import EngineKVFormat
from lmcache.v1.platform.kv_formats import KVFormatSpec as FormatRecord
from lmcache.v1.platform.kv_geometry import Axes, canonical_axes, flatten_engine_buffers

__all__ = ["KVFormatSpec", "concrete_shape", "describe_shape"]

# Indices into canonical_axes' result (its order is CANONICAL_AXES).
_KV, _NL, _NB, _BS, _NH, _HS = range(6)

# The enum name of a format spells its shape: "_X_" separates list levels, "_" the axes
# of the innermost tensor. Symbol shown for each name token (upstream's legend).
_SYMBOLS: dict[str, str] = {
    "ONE": "1",
    "TWO": "2",
    "NP": "NP",
    "NB": "NB",
    "NL": "NL",
    "BS": "BS",
    "NH": "NH",
    "HS": "HS",
    "CS": "CS",
    "NBBS": "PBS",
    "BSV": "BSxVALS",
    "BSS": "BSxSCALES",
}
# Symbols that stay literal in a concrete shape; every other one is sized by a getter.
_LITERAL = frozenset({"1", "2", "NP"})
_GETTER: dict[str, str] = {
    "NB": "num_blocks",
    "NL": "num_layers",
    "BS": "block_size",
    "NH": "num_heads",
    "HS": "head_size",
    "CS": "head_size",
    "PBS": "page_buffer_size",
    "BSxVALS": "block_size",
    "BSxSCALES": "block_size",
}


def _render(fmt: int | EngineKVFormat, symbol: Callable[[str], str]) -> str:
    levels = EngineKVFormat(int(fmt)).name.split("_X_")
    inner = ", ".join(symbol(_SYMBOLS[token]) for token in levels[-1].split("_"))
    return " x ".join([symbol(_SYMBOLS[token]) for token in levels[:-1]] + [f"[{inner}]"])


def describe_shape(fmt: int | EngineKVFormat) -> str:
    """The symbolic shape of ``fmt``, e.g. ``NL_X_TWO_NB_BS_NH_HS`` -> ``NL x [2, NB, BS, NH, HS]``.

    Raises:
        ValueError: ``fmt`` is not an ``EngineKVFormat`` value.
    """
    return _render(fmt, lambda sym: sym)


def concrete_shape(fmt: int | EngineKVFormat, size: Callable[[str], int]) -> str:
    """The shape of ``fmt`` with every symbol but ``1``/``2``/``NP`` replaced by ``size(symbol)``.

    E.g. ``NL_X_TWO_NB_BS_NH_HS`` -> ``32 x [2, 2048, 16, 8, 128]``.
    """
    return _render(fmt, lambda sym: sym if sym in _LITERAL else str(size(sym)))


class KVFormatSpec:
    """Static layout facts and geometry getters of one ``EngineKVFormat``.

    Class attributes (all ``False`` unless the format says otherwise):
    ``engine_kv_format``, ``attention_backends`` (diagnostic labels, the first one
    representative), the structural shape -- exactly one of ``is_cross_layer`` (one
    tensor for every layer), ``is_kv_list`` (``[K layers, V layers]``) and
    ``is_layer_list`` (one entry per layer) -- and the modifiers ``is_mla``, ``is_hnd``,
    ``is_fused_packed``, ``is_two_major``, ``is_pbs_fused``, ``is_kv_second_tuple``,
    ``is_single_kv``.

    An instance wraps an already-normalised ``kv_caches`` of that format and reads its
    geometry. ``layer_idx`` selects the layer where layers may differ; cross-layer
    formats ignore it.
    """

    engine_kv_format: ClassVar[EngineKVFormat]
    attention_backends: ClassVar[tuple[str, ...]] = ()
    is_cross_layer: ClassVar[bool] = False
    is_kv_list: ClassVar[bool] = False
    is_layer_list: ClassVar[bool] = False
    is_mla: ClassVar[bool] = False
    is_hnd: ClassVar[bool] = False
    is_fused_packed: ClassVar[bool] = False
    is_two_major: ClassVar[bool] = False
    is_pbs_fused: ClassVar[bool] = False
    is_kv_second_tuple: ClassVar[bool] = False
    is_single_kv: ClassVar[bool] = False
    # The lmcache-core table record every answer below is derived from.
    format_record: ClassVar[FormatRecord]

    def __init__(self, kv_caches: DiscoverableKVCache) -> None:
        if not hasattr(type(self), "format_record"):
            raise TypeError(
                "KVFormatSpec is the interface; use get_spec_class(fmt) for a format's spec"
            )
        if self.format_record.packed_tail > 1:
            name = self.engine_kv_format.name
            warnings.warn(
                f"{name} is deprecated: superseded by {name.replace('_TWO_HS', '_CS')} "
                "(the K|V pair as one raw content axis)",
                DeprecationWarning,
                stacklevel=2,
            )
        self.kv_caches = kv_caches
        self._items: list[tuple[Any, int, int, int]] | None = None

    # ----------------------------------------------------------------------------------
    # Static
    # ----------------------------------------------------------------------------------

    @classmethod
    def paged_layer_shape(cls, nb: int, bs: int, nh: int, hs: int) -> tuple[int, ...]:
        """The physical shape of one layer's tensor for the given geometry.

        ``hs`` is the trailing per-head width (the packed ``K|V`` width for fused
        formats). Only for formats whose per-layer entry is one tensor.

        Raises:
            ValueError: the format is cross-layer, a K/V list or a per-layer tuple.
        """
        rec = cls.format_record
        if rec.container != "layers":
            raise ValueError(f"{cls.engine_kv_format!r} does not have one paged tensor per layer")
        sizes = {"KV": 2, "NB": nb, "BS": bs, "NH": nh, "HS": hs, "ONE": 1, "PBS": nb * bs}
        return tuple(sizes[axis] for axis in rec.dims)

    # ----------------------------------------------------------------------------------
    # Reading the buffers
    # ----------------------------------------------------------------------------------

    def _buffers(self) -> list[tuple[Any, int, int, int]]:
        """``(tensor, kv, layer, plane)`` for every engine buffer (-1: spans the axis)."""
        if self._items is None:
            self._items = flatten_engine_buffers(self.kv_caches, self.format_record)
        return self._items

    def _planes(self, layer_idx: int) -> list[torch.Tensor]:
        """The buffers describing ``layer_idx``: its K buffer (or the shared one), or
        every plane of an MLA plane tuple."""
        planes = [
            t for t, kv, layer, _plane in self._buffers() if layer in (-1, layer_idx) and kv <= 0
        ]
        if not planes:
            raise IndexError(f"{self.engine_kv_format.name}: no layer {layer_idx}")
        return planes

    def _axes(self, layer_idx: int = 0, plane: int = 0) -> Axes:
        tensor = self._planes(layer_idx)[plane]
        # A fused NB*BS axis cannot be split without a block size; 1 keeps it whole in NB.
        return canonical_axes(tensor.shape, tensor.stride(), self.format_record, 1, "kv_caches")

    def _require_block_axis(self, what: str) -> None:
        if self.is_pbs_fused:
            raise ValueError(
                f"{what} is undefined for {self.engine_kv_format.name}: "
                "its blocks and block slots share one fused axis"
            )

    # ----------------------------------------------------------------------------------
    # Geometry
    # ----------------------------------------------------------------------------------

    def num_layers(self) -> int:
        if self.is_cross_layer:
            return self._axes()[_NL][0]
        return 1 + max(layer for _t, _kv, layer, _p in self._buffers())

    def num_blocks(self) -> int:
        """Blocks of the paged cache; ValueError for a fused ``NB*BS`` format."""
        self._require_block_axis("num_blocks")
        return self._axes()[_NB][0]

    def block_size(self, layer_idx: int = 0) -> int:
        """Tokens per block; ValueError for a fused ``NB*BS`` format."""
        self._require_block_axis("block_size")
        return self._axes(layer_idx)[_BS][0]

    def page_buffer_size(self) -> int:
        """Token slots per layer (``NB * BS``, or the fused axis)."""
        axes = self._axes()
        return axes[_NB][0] * axes[_BS][0]

    def tokens_per_layer(self) -> int:
        return self.page_buffer_size()

    def kv_size(self) -> int:
        """Planes of an LMCache object: 2 for split K/V, 1 for MLA, fused and single-KV."""
        return self.format_record.kv_size

    def num_heads(self, layer_idx: int = 0) -> int:
        return self._axes(layer_idx)[_NH][0]

    def head_size(self, layer_idx: int = 0) -> int:
        """Per-head width; a packed ``K|V`` head counts both halves, an MLA plane tuple
        the sum of its planes (in units of the first plane's dtype)."""
        if self.format_record.tuple_axis != "HS":
            return self._axes(layer_idx)[_HS][0]
        planes = self._planes(layer_idx)
        total_bytes = sum(
            self._axes(layer_idx, i)[_HS][0] * t.element_size() for i, t in enumerate(planes)
        )
        itemsize = planes[0].element_size()
        if total_bytes % itemsize:
            raise ValueError(
                f"{self.engine_kv_format.name}: planes of {total_bytes} bytes per token are "
                f"not a whole number of {planes[0].dtype} elements"
            )
        return total_bytes // itemsize

    def hidden_dim(self, layer_idx: int = 0) -> int:
        """Row width of one plane, ``num_heads * head_size``.

        The deprecated ``..._TWO_HS`` layouts keep upstream's count there, which is the
        width of one half (``NH * HS``) although ``head_size`` is the packed ``2 * HS``.
        """
        width = self.num_heads(layer_idx) * self.head_size(layer_idx)
        return width // self.format_record.packed_tail

    def elements_per_layer(self) -> int:
        """Elements one layer holds across all its buffers (K and V, every plane)."""
        if self.is_cross_layer:
            tensor = self._buffers()[0][0]
            return int(tensor.numel()) // self.num_layers()
        return sum(int(t.numel()) for t, _kv, layer, _p in self._buffers() if layer == 0)

    def dtype(self, layer_idx: int = 0) -> torch.dtype:
        return self._planes(layer_idx)[0].dtype

    def data_ptrs(self, layer_indices: list[int]) -> list[int]:
        """Device addresses for ``layer_indices``, in the order the transfer kernels take:
        one base for a cross-layer tensor (layers ignored), every K then every V for a
        K/V list, otherwise each layer's buffers in turn (a tuple's planes in order)."""
        items = self._buffers()
        if self.is_cross_layer:
            return [items[0][0].data_ptr()]
        by_layer: dict[int, list[tuple[int, torch.Tensor]]] = {}
        for tensor, kv, layer, _plane in items:
            by_layer.setdefault(layer, []).append((kv, tensor))
        if self.is_kv_list:
            return [
                tensor.data_ptr()
                for want in (0, 1)
                for layer in layer_indices
                for kv, tensor in by_layer[layer]
                if kv == want
            ]
        return [tensor.data_ptr() for layer in layer_indices for _kv, tensor in by_layer[layer]]

    def concrete_shape_str(self) -> str:
        """:func:`describe_shape` with this cache's sizes, e.g. ``80 x [2, 2048, 16, 8, 128]``."""
        if self.format_record.packed_tail > 1:
            # head_size is the packed width here; beside the literal TWO axis it would be
            # counted twice, so show the tensor's real dims.
            return f"{self.num_layers()} x {list(self._planes(0)[0].shape)}"
        return concrete_shape(self.engine_kv_format, lambda sym: getattr(self, _GETTER[sym])())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({describe_shape(self.engine_kv_format)})"
