"""Upstream LMCache 0.5.6's ``lmcache.v1.distributed.serde`` package.

The serdes are the product's (:mod:`lmcache.v1.storage_backend.serde`): upstream's
``serde.fp8``, ``serde.aesgcm`` and ``serde.key_provider`` paths are rows of
:mod:`lmcache.compat.paths` to the product modules.  What exists only for upstream's
storage controllers -- the asynchronous ``SerdeProcessor`` face and its factory, the
multi-output group interfaces, the temporary-buffer helpers -- lives here.  Upstream's
``turboquant`` serde and its K16/V8 codec classes (``lmcache.v1.kv_codec``) are not
provided.
"""

from __future__ import annotations

from lmcache.compat.upstream_056.distributed.serde.async_processor import AsyncSerdeProcessor
from lmcache.compat.upstream_056.distributed.serde.base import (
    Deserializer,
    SerdeConfig,
    SerdeProcessor,
    SerdeTaskId,
    Serializer,
)
from lmcache.compat.upstream_056.distributed.serde.factory import (
    create_serde_processor,
    get_registered_serde_types,
    register_serde_factory,
)
from lmcache.compat.upstream_056.distributed.serde.multi import (
    LayoutDescGroup,
    MemoryObjGroup,
    MultiDeserializer,
    MultiSerializer,
    single_to_multi_deserializer,
    single_to_multi_serializer,
    validate_group_size,
)
from lmcache.compat.upstream_056.distributed.serde.utils import (
    make_temp_key,
    serialized_layout_desc,
)
from lmcache.v1.storage_backend.serde.fp8 import (
    Fp8QuantizationDeserializer,
    Fp8QuantizationSerializer,
)

__all__ = [
    "AsyncSerdeProcessor",
    "Deserializer",
    "Fp8QuantizationDeserializer",
    "Fp8QuantizationSerializer",
    "LayoutDescGroup",
    "MemoryObjGroup",
    "MultiDeserializer",
    "MultiSerializer",
    "SerdeConfig",
    "SerdeProcessor",
    "SerdeTaskId",
    "Serializer",
    "create_serde_processor",
    "get_registered_serde_types",
    "make_temp_key",
    "register_serde_factory",
    "serialized_layout_desc",
    "single_to_multi_deserializer",
    "single_to_multi_serializer",
    "validate_group_size",
]


def __getattr__(name: str) -> object:
    # The aesgcm names need the 'cryptography' package: imported when first asked for.
    if name in ("AesGcmSerializer", "AesGcmDeserializer"):
        from lmcache.v1.storage_backend.serde import aesgcm

        return getattr(aesgcm, name)
    if name in ("HkdfKeyProvider", "KeyProvider"):
        from lmcache.v1.storage_backend.serde import key_provider

        return getattr(key_provider, name)
    raise AttributeError(name)
