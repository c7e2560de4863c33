"""The serving engine -> detector table (upstream 0.5.6's ``detectors.registry``)."""

from __future__ import annotations

from lmcache.compat.upstream_056.gpu_connector.kv_format.detectors.atom import AtomDetector
from lmcache.compat.upstream_056.gpu_connector.kv_format.detectors.base import EngineDetector
from lmcache.compat.upstream_056.gpu_connector.kv_format.detectors.sglang import SGLANG_Detector
from lmcache.compat.upstream_056.gpu_connector.kv_format.detectors.trtllm import TRTLLM_Detector
from lmcache.compat.upstream_056.gpu_connector.kv_format.detectors.vllm import VLLM_Detector
from lmcache.utils import EngineType

__all__ = ["DETECTORS", "get_detector"]

DETECTORS: dict[EngineType, type[EngineDetector]] = {
    cls.engine_type: cls for cls in (VLLM_Detector, SGLANG_Detector, TRTLLM_Detector, AtomDetector)
}


def get_detector(engine_type: EngineType) -> EngineDetector | None:
    """A detector for ``engine_type``, or None (e.g. ``EngineType.MOCK``)."""
    cls = DETECTORS.get(engine_type)
    return cls() if cls is not None else None
