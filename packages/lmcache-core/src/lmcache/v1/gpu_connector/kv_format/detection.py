"""Part of upstream LMCache 0.5.6's ``kv_format.detection``.

Only :func:`extract_kv_cache_shapes` is provided. Upstream's ``detect_format`` (recover a
contiguous view of a raw engine cache, then let a per-engine detector name its format) is
not: lmcache-core's cache contexts read the layouts they support from the tensors
themselves (:class:`lmcache.v1.platform.kv_layout.KVLayout`).
"""

from __future__ import annotations

import torch

from lmcache.v1.gpu_connector.kv_format.types import DiscoverableKVCache

__all__ = ["extract_kv_cache_shapes"]


def extract_kv_cache_shapes(kv_caches: DiscoverableKVCache) -> set[torch.Size]:
    """The distinct tensor shapes anywhere in ``kv_caches`` (lists and tuples nest)."""
    if isinstance(kv_caches, torch.Tensor):
        return {kv_caches.shape}
    shapes: set[torch.Size] = set()
    for entry in kv_caches:
        shapes |= extract_kv_cache_shapes(entry)
    return shapes
