"""ATOM's KV-cache views (upstream 0.5.6's ``detectors.atom``): per-layer paged latent or
index caches ``[NB, BS, width]``."""

from __future__ import annotations

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

__all__ = ["AtomDetector"]


class AtomDetector(EngineDetector):
    engine_type = EngineType.ATOM

    def discover(
        self, kv_caches: DiscoverableKVCache, layout_hints: LayoutHints
    ) -> tuple[EngineKVFormat | None, DiscoverableKVCache]:
        depth, ndim, _first = measure_list_depth_until_tensor(kv_caches)
        if depth == 1 and ndim == 3:
            return EngineKVFormat.NL_X_NB_BS_HS, kv_caches
        return None, kv_caches
