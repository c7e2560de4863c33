"""Upstream LMCache 0.5.6's ``kv_format.detection``: name the format of a raw engine cache.

:func:`detect_format` first re-views every tensor in physical axis order
(:mod:`.contiguity`), then lets the serving engine's detector (:mod:`.detectors`) reshape
the structure into its format's canonical form and name the format. Nothing is copied:
the returned structure shares the engine's memory.
"""

from __future__ import annotations

import logging

import torch

from lmcache.compat.upstream_056.gpu_connector.kv_format.contiguity import (
    attempt_permute_to_contiguous_view,
)
from lmcache.compat.upstream_056.gpu_connector.kv_format.detectors import get_detector
from lmcache.compat.upstream_056.gpu_connector.kv_format.specs import describe_shape
from lmcache.compat.upstream_056.gpu_connector.kv_format.types import (
    DiscoverableKVCache,
    LayoutHints,
)
from lmcache.utils import EngineType
from lmcache.v1.platform.kv_formats import EngineKVFormat

__all__ = ["detect_format", "extract_kv_cache_shapes"]

logger = logging.getLogger(__name__)


def extract_kv_cache_shapes(kv_caches: DiscoverableKVCache) -> set[torch.Size]:
    """The distinct tensor shapes anywhere in ``kv_caches`` (lists and tuples nest)."""
    if isinstance(kv_caches, torch.Tensor):
        return {kv_caches.shape}
    shapes: set[torch.Size] = set()
    for entry in kv_caches:
        shapes |= extract_kv_cache_shapes(entry)
    return shapes


def detect_format(
    kv_caches: DiscoverableKVCache,
    serving_engine: EngineType,
    layout_hints: LayoutHints | None = None,
) -> tuple[EngineKVFormat, DiscoverableKVCache]:
    """``(format, normalised kv_caches)`` of a raw engine cache.

    Use the returned structure, not the input: it may be a permuted or reshaped view
    (same storage), and tuples come back as lists.

    Raises:
        ValueError: no detector for ``serving_engine``, a structure no format matches,
            or a tensor strided other than by padding between blocks.
    """
    detector = get_detector(serving_engine)
    if detector is None:
        raise ValueError(f"no KV cache detector for serving engine {serving_engine}")
    kv_caches = attempt_permute_to_contiguous_view(kv_caches)
    fmt, kv_caches = detector.discover(kv_caches, layout_hints or {})
    if fmt is None:
        shapes = sorted(tuple(s) for s in extract_kv_cache_shapes(kv_caches))
        raise ValueError(
            f"unsupported kv_caches structure for {serving_engine} (tensor shapes {shapes})"
        )
    logger.info("Engine KV Format: %s %s", fmt.name, describe_shape(fmt))
    return fmt, kv_caches
