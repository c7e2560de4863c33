"""Upstream's serde factory: names to ``SerdeProcessor`` builders.

The built-in names are the product's serde types
(:mod:`lmcache.v1.storage_backend.serde.factory`) with upstream's per-object classes:
``fp8`` and ``aesgcm`` build an :class:`AsyncSerdeProcessor` after the product checks the
fields.  ``asym_k16_v8`` and ``multi`` are tier serdes only here (use them in
``--l2-adapter``): they have no per-object processor.  Names registered through
:func:`register_serde_factory` build whatever their factory returns.
"""

from __future__ import annotations

from collections.abc import Callable

from lmcache.compat.upstream_056.distributed.serde.async_processor import AsyncSerdeProcessor
from lmcache.compat.upstream_056.distributed.serde.base import SerdeProcessor
from lmcache.v1.storage_backend.serde import build_chunk_serde, serde_workers
from lmcache.v1.storage_backend.serde import get_registered_serde_types as _product_types
from lmcache.v1.storage_backend.serde.base import SerdeConfig
from lmcache.v1.storage_backend.serde.fp8 import (
    Fp8QuantizationDeserializer,
    Fp8QuantizationSerializer,
)

ProcessorFactory = Callable[[dict[str, object]], SerdeProcessor]
_FACTORIES: dict[str, ProcessorFactory] = {}


def _fp8(kwargs: dict[str, object]) -> SerdeProcessor:
    config = SerdeConfig("fp8", dict(kwargs))
    stage = build_chunk_serde(config).tensor_stage
    dtype = getattr(stage, "fp8_dtype")  # noqa: B009 - the fp8 stage's checked dtype
    return AsyncSerdeProcessor(
        Fp8QuantizationSerializer(dtype), Fp8QuantizationDeserializer(dtype), serde_workers(config)
    )


def _aesgcm(kwargs: dict[str, object]) -> SerdeProcessor:
    from lmcache.v1.storage_backend.serde.aesgcm import (
        HKDF_INFO_PREFIX,
        AesGcmDeserializer,
        AesGcmSerializer,
    )
    from lmcache.v1.storage_backend.serde.key_provider import HkdfKeyProvider, load_master_key

    config = SerdeConfig("aesgcm", dict(kwargs))
    build_chunk_serde(config)  # every field checked as for a tier
    bits = int(kwargs.get("aes_bits", 256))  # type: ignore[call-overload]
    master = load_master_key(kwargs.get("master_key_path"), kwargs.get("master_key_env"))  # type: ignore[arg-type]
    keys = HkdfKeyProvider(master, key_len=bits // 8, info_prefix=HKDF_INFO_PREFIX)
    return AsyncSerdeProcessor(
        AesGcmSerializer(keys), AesGcmDeserializer(keys), serde_workers(config)
    )


_BUILT_IN: dict[str, ProcessorFactory] = {"fp8": _fp8, "aesgcm": _aesgcm}


def register_serde_factory(name: str, factory: ProcessorFactory) -> None:
    """Register ``factory`` under ``name``; ``ValueError`` if the name is taken."""
    if name in _FACTORIES or name in _product_types():
        raise ValueError(f"Serde type already registered: {name!r}")
    _FACTORIES[name] = factory


def get_registered_serde_types() -> list[str]:
    return [*_product_types(), *_FACTORIES]


def create_serde_processor(config: SerdeConfig) -> SerdeProcessor:
    """The processor of ``config``; ``ValueError`` for an unknown type or bad fields."""
    factory = _FACTORIES.get(config.type) or _BUILT_IN.get(config.type)
    if factory is not None:
        return factory(dict(config.kwargs))
    if config.type in _product_types():
        raise ValueError(
            f"serde type {config.type!r} is a tier serde here (use it in --l2-adapter); "
            f"upstream's processor API offers {', '.join(_BUILT_IN)}"
        )
    known = ", ".join(sorted(get_registered_serde_types()))
    raise ValueError(f"Unknown serde type {config.type!r}. Registered: {known}")


__all__ = ["create_serde_processor", "get_registered_serde_types", "register_serde_factory"]
