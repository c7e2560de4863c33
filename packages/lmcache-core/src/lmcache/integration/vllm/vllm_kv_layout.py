"""Recognize the paged KV layout vLLM hands to ``register_kv_caches``.

The transfer contexts move blocks of ``[2, NB, BS, NH, HS]`` per-layer tensors.  Other
vLLM layouts are presented to them as a *strided view* of the same memory in that shape
(no copy: stores read and loads write the engine's own pages):

* CPU attention: ``[NB, NH, BS, 2*HS]`` (K in the first ``HS`` of the last dim, V after);
* FlashInfer-style: ``[NB, 2, BS, NH, HS]``;
* flash-attention: ``[2, NB, BS, NH, HS]`` (passed through);
* MLA ``[NB, BS, HS]`` (passed through).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from lmcache.v1.platform.ops_types import EngineKVFormat


@dataclasses.dataclass(frozen=True)
class DetectedLayout:
    engine_kv_format: EngineKVFormat
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype


def detect_layout(
    tensor: torch.Tensor, block_size: int, num_kv_heads: int, head_size: int
) -> DetectedLayout:
    """The layout of one layer's KV tensor, checked against vLLM's KV-cache spec."""
    shape = tuple(tensor.shape)
    nh, hs, bs = num_kv_heads, head_size, block_size

    def found(fmt: EngineKVFormat, nb: int) -> DetectedLayout:
        return DetectedLayout(fmt, nb, bs, nh, hs, tensor.dtype)

    if len(shape) == 5 and shape[0] == 2 and shape[2:] == (bs, nh, hs):
        return found(EngineKVFormat.NL_X_TWO_NB_BS_NH_HS, shape[1])
    if len(shape) == 5 and shape[1] == 2 and shape[2:] == (bs, nh, hs):
        return found(EngineKVFormat.NL_X_NB_TWO_BS_NH_HS, shape[0])
    if len(shape) == 4 and shape[1:] == (nh, bs, 2 * hs):
        return found(EngineKVFormat.NL_X_NB_NH_BS_TWO_HS, shape[0])
    if len(shape) == 3 and shape[1:] == (bs, hs):
        return DetectedLayout(EngineKVFormat.NL_X_NB_BS_HS, shape[0], bs, 1, hs, tensor.dtype)
    raise ValueError(
        f"unrecognized vLLM KV-cache layer shape {shape} (block_size={bs}, "
        f"num_kv_heads={nh}, head_size={hs}); supported: [2, NB, BS, NH, HS], "
        "[NB, 2, BS, NH, HS], [NB, NH, BS, 2*HS] (vLLM CPU) and MLA [NB, BS, HS]"
    )


def as_transfer_view(tensor: torch.Tensor, layout: DetectedLayout) -> torch.Tensor:
    """``tensor`` seen as ``[2, NB, BS, NH, HS]`` (or MLA ``[NB, BS, HS]``), sharing memory."""
    fmt = layout.engine_kv_format
    nb, bs, nh, hs = layout.num_blocks, layout.block_size, layout.num_kv_heads, layout.head_size
    if fmt in (EngineKVFormat.NL_X_TWO_NB_BS_NH_HS, EngineKVFormat.NL_X_NB_BS_HS):
        return tensor
    if fmt == EngineKVFormat.NL_X_NB_TWO_BS_NH_HS:
        return tensor.transpose(0, 1)
    if fmt == EngineKVFormat.NL_X_NB_NH_BS_TWO_HS:
        return tensor.view(nb, nh, bs, 2, hs).permute(3, 0, 2, 1, 4)
    raise ValueError(f"no transfer view for {fmt.name}")


def transfer_views(
    kv_caches: Mapping[str, torch.Tensor], block_size: int, num_kv_heads: int, head_size: int
) -> tuple[dict[str, torch.Tensor], DetectedLayout]:
    """Per-layer transfer views (layer order kept) and the detected layout."""
    if not kv_caches:
        raise ValueError("vLLM registered no KV-cache tensors")
    layouts = {
        name: detect_layout(t, block_size, num_kv_heads, head_size) for name, t in kv_caches.items()
    }
    first = next(iter(layouts.values()))
    if any(layout != first for layout in layouts.values()):
        raise ValueError("KV-cache layers differ in layout; hybrid models are not supported")
    return {name: as_transfer_view(t, first) for name, t in kv_caches.items()}, first
