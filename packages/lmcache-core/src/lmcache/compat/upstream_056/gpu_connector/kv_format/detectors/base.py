"""The per-engine detector interface of upstream 0.5.6's ``kv_format.detectors``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from lmcache.compat.upstream_056.gpu_connector.kv_format.types import (
    DiscoverableKVCache,
    LayoutHints,
)
from lmcache.utils import EngineType
from lmcache.v1.platform.kv_formats import EngineKVFormat

__all__ = ["EngineDetector", "measure_list_depth_until_tensor"]


def measure_list_depth_until_tensor(
    kv_caches: DiscoverableKVCache,
) -> tuple[int, int, torch.Tensor]:
    """``(list depth, tensor rank, first tensor)`` following first entries down.

    Raises:
        ValueError: an empty list on the way.
    """
    depth, node = 0, kv_caches
    while isinstance(node, (list, tuple)):
        if not node:
            raise ValueError("kv_caches holds an empty list")
        depth, node = depth + 1, node[0]
    return depth, node.dim(), node


class EngineDetector(ABC):
    """Reshapes one serving engine's raw cache into a format's canonical structure."""

    engine_type: ClassVar[EngineType]

    @abstractmethod
    def discover(
        self, kv_caches: DiscoverableKVCache, layout_hints: LayoutHints
    ) -> tuple[EngineKVFormat | None, DiscoverableKVCache]:
        """``(format, canonical kv_caches)``, or ``(None, kv_caches)`` when unrecognised."""
