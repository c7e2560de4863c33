"""Engine KV buffers of every ``EngineKVFormat`` for the bit-exactness tests: the core
conformance suite's own builders (``lmcache.testing.kv_layouts``), so the plugin's tests and
the shipped suite build the same buffers."""

from lmcache.testing.kv_layouts import (
    DTYPES,
    FUSED_FORMATS,
    MLA_FORMATS,
    SINGLE_PLANE_FORMATS,
    Geometry,
    New,
    assert_same,
    build_cache,
    clone,
    flat_tensors,
    pointers,
    random_factory,
    shape_desc,
)

__all__ = [
    "DTYPES",
    "FUSED_FORMATS",
    "MLA_FORMATS",
    "SINGLE_PLANE_FORMATS",
    "Geometry",
    "New",
    "assert_same",
    "build_cache",
    "clone",
    "flat_tensors",
    "pointers",
    "random_factory",
    "shape_desc",
]
