"""TRT-LLM's KV-cache pool (upstream 0.5.6's ``detectors.trtllm``).

TRT-LLM hands over one pool ``[NB, NL, 2, NH*BS*HS]`` (possibly in a one-item list);
the hints ``num_kv_heads``, ``tokens_per_block`` and ``head_dim`` re-view it as the
cross-layer HND format ``[NB, NL, 2, NH, BS, HS]``.
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

__all__ = ["TRTLLM_Detector"]


class TRTLLM_Detector(EngineDetector):
    engine_type = EngineType.TRTLLM

    def discover(
        self, kv_caches: DiscoverableKVCache, layout_hints: LayoutHints
    ) -> tuple[EngineKVFormat | None, DiscoverableKVCache]:
        if isinstance(kv_caches, (list, tuple)) and len(kv_caches) == 1:
            kv_caches = kv_caches[0]
        if isinstance(kv_caches, torch.Tensor) and kv_caches.dim() == 4:
            nh = layout_hints.get("num_kv_heads")
            bs = layout_hints.get("tokens_per_block")
            hs = layout_hints.get("head_dim")
            if nh is None or bs is None or hs is None:
                raise ValueError(
                    "TRT-LLM discovery needs layout_hints with num_kv_heads, "
                    "tokens_per_block and head_dim"
                )
            nb, nl, kv, flat = kv_caches.shape
            if flat != nh * bs * hs:
                raise ValueError(
                    f"TRT-LLM pool row of {flat} elements is not num_kv_heads ({nh}) * "
                    f"tokens_per_block ({bs}) * head_dim ({hs})"
                )
            kv_caches = kv_caches.view(nb, nl, kv, nh, bs, hs)
        depth, ndim, _first = measure_list_depth_until_tensor(kv_caches)
        if depth == 0 and ndim == 6:
            return EngineKVFormat.NB_NL_TWO_NH_BS_HS, kv_caches
        return None, kv_caches
