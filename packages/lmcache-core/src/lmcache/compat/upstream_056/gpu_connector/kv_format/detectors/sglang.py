"""SGLang's KV-cache layouts (upstream 0.5.6's ``detectors.sglang``).

In-process SGLang hands over ``[K layers, V layers]`` of ``[PBS, NH, HS]`` (MHA) or a list
of ``[PBS, 1, HS]`` (MLA), ``PBS`` being blocks and slots fused. Registrations through the
MP server add ``tokens_per_block``, which splits ``PBS`` back into ``NB, BS``; the
``kv_list_layout`` hint says how the list is organised (``"k_v"``: flat K layers then V
layers -- needed because one head per rank looks like MLA; ``"unified"``: one view per
component, whose rank tells MLA ``[NB, BS, HS]`` from ``[NB, BS, NH, HS]``).
"""

from __future__ import annotations

import torch

from lmcache.compat.upstream_056.gpu_connector.kv_format.detectors.base import (
    EngineDetector,
    measure_list_depth_until_tensor,
)
from lmcache.compat.upstream_056.gpu_connector.kv_format.types import (
    DiscoverableKVCache,
    LayoutHints,
)
from lmcache.utils import EngineType
from lmcache.v1.platform.kv_formats import EngineKVFormat

__all__ = ["SGLANG_Detector"]


def _split_page_axis(
    layer: torch.Tensor, block_size: int, what: str, drop_unit_head: bool = False
) -> torch.Tensor:
    """``[PBS, ...]`` viewed as ``[NB, BS, ...]`` (MLA's unit head axis dropped)."""
    slots = int(layer.shape[0])
    if block_size <= 0 or slots % block_size:
        raise ValueError(
            f"SGLang {what} page_buffer_size {slots} not divisible by tokens_per_block {block_size}"
        )
    rest = layer.shape[2:] if drop_unit_head else layer.shape[1:]
    return layer.view(slots // block_size, block_size, *rest)


class SGLANG_Detector(EngineDetector):
    engine_type = EngineType.SGLANG

    def discover(
        self, kv_caches: DiscoverableKVCache, layout_hints: LayoutHints
    ) -> tuple[EngineKVFormat | None, DiscoverableKVCache]:
        depth, ndim, _first = measure_list_depth_until_tensor(kv_caches)
        list_layout = layout_hints.get("kv_list_layout")
        block_size = layout_hints.get("tokens_per_block")
        if list_layout == "unified":
            if depth == 1 and ndim == 3:
                return EngineKVFormat.NL_X_NB_BS_HS, kv_caches
            if depth == 1 and ndim == 4:
                return EngineKVFormat.NL_X_NB_BS_NH_HS, kv_caches
            return None, kv_caches
        layers: list[torch.Tensor] = list(kv_caches) if depth == 1 else []  # type: ignore[arg-type]
        if depth == 1 and ndim == 3 and block_size is not None:
            if list_layout == "k_v" and len(layers) % 2 == 0:
                half = len(layers) // 2
                split: list[DiscoverableKVCache] = [
                    _split_page_axis(t, block_size, "MHA") for t in layers
                ]
                return EngineKVFormat.TWO_X_NL_X_NB_BS_NH_HS, [split[:half], split[half:]]
            if layers[0].shape[1] == 1:
                return EngineKVFormat.NL_X_NB_BS_HS, [
                    _split_page_axis(t, block_size, "MLA", drop_unit_head=True) for t in layers
                ]
        if depth == 1:
            # MP registrations (tokens_per_block given) are already block-shaped.
            if block_size is not None:
                return EngineKVFormat.NL_X_NB_BS_HS, kv_caches
            return EngineKVFormat.NL_X_NBBS_ONE_HS, kv_caches
        if depth == 2:
            if ndim == 4:
                return EngineKVFormat.TWO_X_NL_X_NB_BS_NH_HS, kv_caches
            return EngineKVFormat.TWO_X_NL_X_NBBS_NH_HS, kv_caches
        return None, kv_caches
