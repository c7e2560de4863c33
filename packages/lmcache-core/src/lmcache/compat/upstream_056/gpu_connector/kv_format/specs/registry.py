"""The ``EngineKVFormat`` -> ``KVFormatSpec`` class table (upstream 0.5.6's ``specs.registry``).

One subclass per record of :func:`lmcache.v1.platform.kv_formats.all_specs`, generated at
import time and named as upstream names them (``<FORMAT>_Spec``); its class attributes are
read off the record, so a format added to the table gets its spec class for free.
"""

from __future__ import annotations

from typing import Any

from lmcache.compat.upstream_056.gpu_connector.kv_format.specs.base import KVFormatSpec
from lmcache.compat.upstream_056.gpu_connector.kv_format.types import DiscoverableKVCache
from lmcache.v1.platform.kv_formats import EngineKVFormat, all_specs
from lmcache.v1.platform.kv_formats import KVFormatSpec as FormatRecord

__all__ = ["SPECS", "get_spec", "get_spec_class"]

# Upstream's class-attribute name for each boolean fact of a table record.
_FACTS = (
    "is_cross_layer",
    "is_kv_list",
    "is_layer_list",
    "is_mla",
    "is_hnd",
    "is_fused_packed",
    "is_two_major",
    "is_pbs_fused",
    "is_kv_second_tuple",
    "is_single_kv",
)


def _spec_class(rec: FormatRecord) -> type[KVFormatSpec]:
    attrs: dict[str, Any] = {fact: getattr(rec, fact) for fact in _FACTS}
    attrs.update(
        engine_kv_format=rec.engine_kv_format,
        attention_backends=rec.attention_backends,
        format_record=rec,
        __module__=__name__,
        __doc__=f"``{rec.engine_kv_format.name}``, generated from its format-table record.",
    )
    name = f"{rec.engine_kv_format.name}_Spec"
    cls = type(name, (KVFormatSpec,), attrs)
    cls.__qualname__ = name
    return cls


SPECS: dict[EngineKVFormat, type[KVFormatSpec]] = {
    rec.engine_kv_format: _spec_class(rec) for rec in all_specs()
}
# Importable under upstream's class names (e.g. ``registry.NL_X_NB_BS_HS_Spec``).
globals().update({cls.__name__: cls for cls in SPECS.values()})
__all__ += sorted(cls.__name__ for cls in SPECS.values())


def get_spec_class(fmt: int | EngineKVFormat) -> type[KVFormatSpec]:
    """The spec class of ``fmt``, carrying its static layout facts as class attributes.

    Any value equal to an ``EngineKVFormat`` member works (the enum of
    ``lmcache.lmcache_native``, of ``device_ops`` or a plain ``int``).

    Raises:
        ValueError: ``fmt`` names no format.
    """
    try:
        return SPECS[EngineKVFormat(int(fmt))]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"Unknown Engine KV Format: {fmt!r}") from None


def get_spec(kv_caches: DiscoverableKVCache, fmt: int | EngineKVFormat) -> KVFormatSpec:
    """A fresh spec of ``fmt`` over ``kv_caches`` (borrowed: use it and drop it)."""
    return get_spec_class(fmt)(kv_caches)
