"""Upstream LMCache 0.5.6's ``kv_format.specs``: the spec interface (:mod:`.base`) and the
format -> spec table (:mod:`.registry`)."""

from lmcache.compat.upstream_056.gpu_connector.kv_format.specs.base import (
    KVFormatSpec,
    concrete_shape,
    describe_shape,
)
from lmcache.compat.upstream_056.gpu_connector.kv_format.specs.registry import (
    get_spec,
    get_spec_class,
)

__all__ = ["KVFormatSpec", "concrete_shape", "describe_shape", "get_spec", "get_spec_class"]
