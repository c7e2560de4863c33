"""Upstream LMCache 0.5.6's ``lmcache.v1.gpu_connector.kv_format``: per-format geometry.

* :class:`KVFormatSpec` -- one subclass per ``EngineKVFormat`` (static layout facts as
  class attributes; geometry getters over a ``kv_caches``), generated from lmcache-core's
  format table :mod:`lmcache.v1.platform.kv_formats`;
* :func:`get_spec_class` / :func:`get_spec` -- look a format's spec up;
* :func:`describe_shape` / :func:`concrete_shape` -- a format's symbolic / numeric shape;
* :func:`detect_format` -- normalise a raw engine cache and name its format (vLLM,
  SGLang, TRT-LLM and ATOM detectors); :func:`extract_kv_cache_shapes` -- the tensor
  shapes in a ``kv_caches``.
"""

from lmcache.compat.upstream_056.gpu_connector.kv_format.detection import (
    detect_format,
    extract_kv_cache_shapes,
)
from lmcache.compat.upstream_056.gpu_connector.kv_format.specs import (
    KVFormatSpec,
    concrete_shape,
    describe_shape,
    get_spec,
    get_spec_class,
)

__all__ = [
    "KVFormatSpec",
    "concrete_shape",
    "describe_shape",
    "detect_format",
    "extract_kv_cache_shapes",
    "get_spec",
    "get_spec_class",
]
