"""The geometry of a worker's paged KV cache and of the server's chunk objects.

Two engine layouts are understood from tensor shapes alone (per layer):
``[2, NB, BS, NH, HS]`` (vLLM flash-attention, ``NL_X_TWO_NB_BS_NH_HS``) and
``[NB, BS, HS]`` (MLA, ``NL_X_NB_BS_HS``); a worker that declares upstream's
``layout_hints={"kv_layout": "HND"}`` (heads before block slots) is first re-viewed in that
shape by :func:`as_nhd_view`.  A chunk object is ``[2, NL, T, NH*HS]``
(``KV_2LTD``) or ``[1, NL, T, HS]`` (``KV_MLA_FMT``) for ``T = chunk_size`` tokens.

This module sits in the platform layer (cache contexts need it) and so knows nothing of
memory objects: the ``MemoryFormat`` of a chunk is
:func:`lmcache.v1.multiprocess.server.kv_layout.chunk_memory_format`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from lmcache.v1.platform.dtype_names import dtype_to_str as dtype_name
from lmcache.v1.platform.dtype_names import str_to_dtype as dtype_from_name
from lmcache.v1.platform.ops_types import EngineKVFormat, PageBufferShapeDesc

__all__ = [
    "HONORED_KV_LAYOUTS",
    "KVLayout",
    "as_layer_views",
    "as_nhd_view",
    "declared_kv_layout",
    "declared_kv_list_layout",
    "dtype_from_name",
    "dtype_name",
]

# Upstream's ``LayoutHints["kv_layout"]`` names a cache context can honour by re-viewing
# the engine's tensors (no copy) as ``[2, NB, BS, NH, HS]``.
HONORED_KV_LAYOUTS = frozenset({"NHD", "HND"})


def declared_kv_layout(layout_hints: object) -> str | None:
    """The ``kv_layout`` a worker declared in upstream's ``layout_hints`` dict, if any."""
    if not isinstance(layout_hints, dict):
        return None
    kv_layout = layout_hints.get("kv_layout")
    if kv_layout is not None and not isinstance(kv_layout, str):
        raise TypeError(f"layout_hints kv_layout must be a string, got {type(kv_layout).__name__}")
    return kv_layout


# Upstream's ``LayoutHints["kv_list_layout"]``, SGLang's flat tensor list (one tensor per K
# or V plane of a layer, every K plane first): "unified" planes are ``[NB, BS, NH, HS]``
# (or MLA ``[NB, BS, HS]``); "k_v" planes are ``[NB*BS, NH, HS]`` token slots, paged by the
# hint's ``tokens_per_block``.  Without the key, one tensor per layer (vLLM).
UNIFIED_KV_LIST = "unified"
K_V_KV_LIST = "k_v"
HONORED_KV_LIST_LAYOUTS = frozenset({UNIFIED_KV_LIST, K_V_KV_LIST})


def declared_kv_list_layout(layout_hints: object) -> str | None:
    """The ``kv_list_layout`` a worker declared in ``layout_hints``, if any."""
    if not isinstance(layout_hints, dict):
        return None
    list_layout = layout_hints.get("kv_list_layout")
    if list_layout is None:
        return None
    if not isinstance(list_layout, str) or list_layout not in HONORED_KV_LIST_LAYOUTS:
        raise ValueError(
            f"layout_hints kv_list_layout {list_layout!r} is not supported; supported: "
            f"{sorted(HONORED_KV_LIST_LAYOUTS)}"
        )
    return list_layout


def as_layer_views(tensors: Sequence[torch.Tensor], layout_hints: object) -> list[torch.Tensor]:
    """The engine's KV tensors seen as the per-layer tensors the block transfer takes.

    With a ``kv_list_layout`` (SGLang) each plane becomes one single-plane layer
    ``[NB, BS, NH*HS]`` (a view: no copy), so a chunk object is ``[1, 2*NL, T, NH*HS]``
    with every K plane before every V plane: the same bytes, in the same order, as the
    ``[2, NL, T, NH*HS]`` object of a per-layer engine.
    """
    list_layout = declared_kv_list_layout(layout_hints)
    if list_layout == UNIFIED_KV_LIST:
        return [_unified_plane(t) for t in tensors]
    if list_layout == K_V_KV_LIST:
        assert isinstance(layout_hints, dict)
        block_size = layout_hints.get("tokens_per_block")
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError("kv_list_layout 'k_v' needs a positive tokens_per_block hint")
        return [_token_slot_plane(t, block_size) for t in tensors]
    kv_layout = declared_kv_layout(layout_hints)
    return [as_nhd_view(t, kv_layout) for t in tensors]


def _unified_plane(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() not in (3, 4):
        raise ValueError(
            f"a unified KV list holds [NB, BS, NH, HS] or [NB, BS, HS] planes, got shape "
            f"{tuple(tensor.shape)}"
        )
    return tensor if tensor.dim() == 3 else tensor.flatten(2)


def _token_slot_plane(tensor: torch.Tensor, block_size: int) -> torch.Tensor:
    if tensor.dim() != 3 or tensor.shape[0] % block_size:
        raise ValueError(
            f"a k_v KV list holds [slots, NH, HS] planes with slots a multiple of "
            f"tokens_per_block {block_size}, got shape {tuple(tensor.shape)}"
        )
    return tensor.view(tensor.shape[0] // block_size, block_size, -1)


def as_nhd_view(tensor: torch.Tensor, kv_layout: str | None) -> torch.Tensor:
    """One layer's KV tensor seen as ``[2, NB, BS, NH, HS]`` (MLA ``[NB, BS, HS]`` as is).

    Sharing memory, so stores read and loads write the engine's own pages.  Without a
    declared layout (or ``"NHD"``) the tensor is taken as it is; ``"HND"`` (heads before
    block slots, e.g. vLLM on CPU) accepts ``[2, NB, NH, BS, HS]``, ``[NB, 2, NH, BS, HS]``
    and the fused ``[NB, NH, BS, 2*HS]`` (K in the first half of the last axis).
    """
    if kv_layout in (None, "NHD") or tensor.dim() == 3:
        return tensor
    if kv_layout != "HND":
        raise ValueError(
            f"KV layout {kv_layout!r} is not supported; supported: {sorted(HONORED_KV_LAYOUTS)}"
        )
    shape = tuple(tensor.shape)
    if len(shape) == 5 and shape[0] == 2:
        return tensor.transpose(2, 3)
    if len(shape) == 5 and shape[1] == 2:
        return tensor.permute(1, 0, 3, 2, 4)
    if len(shape) == 4 and shape[3] % 2 == 0:
        return tensor.unflatten(3, (2, shape[3] // 2)).permute(3, 0, 2, 1, 4)
    raise ValueError(
        f"unsupported HND KV-cache layer shape {shape}: expected [2, NB, NH, BS, HS], "
        "[NB, 2, NH, BS, HS] or [NB, NH, BS, 2*HS]"
    )


@dataclasses.dataclass(frozen=True)
class KVLayout:
    num_layers: int
    num_blocks: int
    block_size: int
    num_heads: int
    head_size: int
    dtype: torch.dtype
    use_mla: bool

    @property
    def engine_kv_format(self) -> EngineKVFormat:
        if self.use_mla:
            return EngineKVFormat.NL_X_NB_BS_HS
        return EngineKVFormat.NL_X_TWO_NB_BS_NH_HS

    @property
    def hidden_dim_size(self) -> int:
        return self.num_heads * self.head_size

    def shape_desc(self) -> PageBufferShapeDesc:
        return PageBufferShapeDesc(
            kv_size=1 if self.use_mla else 2,
            nl=self.num_layers,
            nb=self.num_blocks,
            bs=self.block_size,
            nh=self.num_heads,
            hs=self.head_size,
            element_size=self.dtype.itemsize,
            dtype=self.dtype,
        )

    def object_shape(self, chunk_size: int) -> torch.Size:
        """Shape of a stored chunk object (the storage tiers' format)."""
        kv = 1 if self.use_mla else 2
        return torch.Size([kv, self.num_layers, chunk_size, self.hidden_dim_size])

    def transfer_shape(self, chunk_size: int) -> torch.Size:
        """Shape the block-transfer kernel expects for one chunk object."""
        if self.use_mla:
            return torch.Size([self.num_layers, chunk_size, self.head_size])
        return self.object_shape(chunk_size)

    def chunk_nbytes(self, chunk_size: int) -> int:
        return self.object_shape(chunk_size).numel() * self.dtype.itemsize

    def bytes_per_token(self) -> int:
        return self.chunk_nbytes(1)

    def check_chunk_size(self, chunk_size: int) -> None:
        if chunk_size % self.block_size:
            raise ValueError(
                f"the server chunk size {chunk_size} is not a multiple of the engine block "
                f"size {self.block_size}"
            )

    @staticmethod
    def from_tensors(kv_caches: Sequence[torch.Tensor]) -> KVLayout:
        """Infer the layout from per-layer KV tensors; raises ``ValueError`` if unsupported."""
        if not kv_caches:
            raise ValueError("no KV-cache tensors given")
        first = kv_caches[0]
        for tensor in kv_caches[1:]:
            if tensor.shape != first.shape or tensor.dtype != first.dtype:
                raise ValueError("KV-cache layers differ in shape or dtype")
        shape = tuple(first.shape)
        if len(shape) == 5 and shape[0] == 2:
            _, nb, bs, nh, hs = shape
            return KVLayout(len(kv_caches), nb, bs, nh, hs, first.dtype, use_mla=False)
        if len(shape) == 3:
            nb, bs, hs = shape
            return KVLayout(len(kv_caches), nb, bs, 1, hs, first.dtype, use_mla=True)
        raise ValueError(
            f"unsupported KV-cache layer shape {shape}: expected [2, NB, BS, NH, HS] "
            "(flash-attention) or [NB, BS, HS] (MLA)"
        )

    @staticmethod
    def from_engine_payload(
        num_layers: int, block_size: int, hidden_dim_size: int, dtype_str: str, use_mla: bool
    ) -> KVLayout:
        if min(num_layers, block_size, hidden_dim_size) <= 0:
            raise ValueError("num_layers, block_size and hidden_dim_size must be positive")
        return KVLayout(
            num_layers=num_layers,
            num_blocks=0,
            block_size=block_size,
            num_heads=1,
            head_size=hidden_dim_size,
            dtype=dtype_from_name(dtype_str),
            use_mla=use_mla,
        )
