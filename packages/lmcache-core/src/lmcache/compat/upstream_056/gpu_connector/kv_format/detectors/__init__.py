"""Per-engine KV-cache format detection (upstream 0.5.6's ``kv_format.detectors``)."""

from lmcache.compat.upstream_056.gpu_connector.kv_format.detectors.base import (
    EngineDetector,
    measure_list_depth_until_tensor,
)
from lmcache.compat.upstream_056.gpu_connector.kv_format.detectors.registry import get_detector

__all__ = ["EngineDetector", "get_detector", "measure_list_depth_until_tensor"]
