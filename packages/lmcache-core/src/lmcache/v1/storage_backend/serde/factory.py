"""Serde types by name, and the ``"serde"`` object of an ``--l2-adapter`` read into one.

::

    {"type": "disk", "path": "/data", "serde": {"type": "fp8", "fp8_dtype": "float8_e5m2"}}
    {"type": "resp", "url": "redis://...", "serde": {"type": "multi", "serdes": [
        {"type": "asym_k16_v8"},
        {"type": "aesgcm", "master_key_path": "/etc/lmcache/l2.key"}]}}

Types (upstream's names and fields; ``asym_k16_v8`` and ``multi`` are registered types
here only):

* ``fp8``: ``fp8_dtype`` (``float8_e4m3fn`` default, ``float8_e5m2``);
* ``asym_k16_v8``: ``fp8_dtype`` of the values (same choices);
* ``aesgcm``: ``key_provider`` (``hkdf``, the only one), ``aes_bits`` (256 default, 128),
  ``master_key_path`` or ``master_key_env``;
* ``multi``: ``serdes``, a list of the above applied in order (one quantizer at most,
  first).

Every type also accepts upstream's ``max_workers`` (serde threads per tier, default 1).
An unknown type or field, or a bad value, is a :class:`ValueError` naming it: the server
refuses to start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lmcache.v1.storage_backend.serde.asym_k16_v8 import AsymK16V8Stage
from lmcache.v1.storage_backend.serde.base import ByteStage, SerdeConfig, TensorStage
from lmcache.v1.storage_backend.serde.chunk_serde import ChunkSerde
from lmcache.v1.storage_backend.serde.fp8 import DEFAULT_FP8_DTYPE, Fp8Stage, fp8_dtype_named

Stage = TensorStage | ByteStage
StageFactory = Callable[[Mapping[str, Any]], list[Stage]]

COMMON_FIELDS = ("max_workers",)
MULTI = "multi"


@dataclass(frozen=True)
class SerdeType:
    """A registered serde type: how to build its stages, and the fields it accepts."""

    build: StageFactory
    fields: tuple[str, ...]


_TYPES: dict[str, SerdeType] = {}


def register_serde_type(name: str, build: StageFactory, fields: tuple[str, ...]) -> None:
    """Make ``{"type": name, ...}`` configurable; ``ValueError`` if ``name`` is taken."""
    if name in _TYPES or name == MULTI:
        raise ValueError(f"Serde type already registered: {name!r}")
    _TYPES[name] = SerdeType(build, fields)


def get_registered_serde_types() -> list[str]:
    """The configurable serde type names."""
    return [*_TYPES, MULTI]


def _fp8(kwargs: Mapping[str, Any]) -> list[Stage]:
    return [Fp8Stage(fp8_dtype_named(kwargs.get("fp8_dtype", DEFAULT_FP8_DTYPE)))]


def _asym(kwargs: Mapping[str, Any]) -> list[Stage]:
    return [AsymK16V8Stage(fp8_dtype_named(kwargs.get("fp8_dtype", DEFAULT_FP8_DTYPE)))]


def _aesgcm(kwargs: Mapping[str, Any]) -> list[Stage]:
    try:
        from lmcache.v1.storage_backend.serde.aesgcm import HKDF_INFO_PREFIX, AesGcmStage
        from lmcache.v1.storage_backend.serde.key_provider import HkdfKeyProvider, load_master_key
    except ImportError as exc:
        raise ValueError(
            "aesgcm serde needs the 'cryptography' package (pip install 'lmcache-core[encryption]')"
        ) from exc
    provider = str(kwargs.get("key_provider", "hkdf"))
    if provider != "hkdf":
        raise ValueError(f"aesgcm serde: unsupported key_provider {provider!r} (only 'hkdf')")
    bits = _int_field(kwargs, "aes_bits", 256)
    if bits not in (128, 256):
        raise ValueError(f"aesgcm serde: aes_bits must be 128 or 256, got {bits}")
    master = load_master_key(kwargs.get("master_key_path"), kwargs.get("master_key_env"))
    keys = HkdfKeyProvider(master, key_len=bits // 8, info_prefix=HKDF_INFO_PREFIX)
    return [AesGcmStage(keys, bits)]


def _int_field(kwargs: Mapping[str, Any], name: str, default: int) -> int:
    value = kwargs.get(name, default)
    # YAML may give 2.0 for 2; a fraction or text is an error, not silently truncated.
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ValueError(f"serde field {name!r} must be an integer, got {value!r}")
    return int(value)


register_serde_type("fp8", _fp8, ("fp8_dtype",))
register_serde_type("asym_k16_v8", _asym, ("fp8_dtype",))
register_serde_type(
    "aesgcm", _aesgcm, ("key_provider", "aes_bits", "master_key_path", "master_key_env")
)


def parse_serde_config(spec: object, where: str = "serde") -> SerdeConfig:
    """A ``"serde"`` JSON object as a :class:`SerdeConfig` (upstream's checks and errors)."""
    if not isinstance(spec, dict):
        raise ValueError(f"'serde' must be a dict, got {type(spec).__name__} ({where})")
    kind = spec.get("type")
    if not isinstance(kind, str):
        raise ValueError(f"'serde' dict must include a 'type' field ({where})")
    return SerdeConfig(type=kind, kwargs={k: v for k, v in spec.items() if k != "type"})


def _stages(config: SerdeConfig, nested: bool = False) -> list[Stage]:
    if config.type == MULTI:
        if nested:
            raise ValueError("serde 'multi' cannot contain another 'multi'")
        _check_fields(config, ("serdes", *COMMON_FIELDS))
        items = config.kwargs.get("serdes")
        if not isinstance(items, list) or not items:
            raise ValueError("serde 'multi' needs 'serdes': a non-empty list of serde objects")
        stages: list[Stage] = []
        for i, item in enumerate(items):
            stages += _stages(parse_serde_config(item, f"multi serdes[{i}]"), nested=True)
        return stages
    kind = _TYPES.get(config.type)
    if kind is None:
        known = ", ".join(sorted(get_registered_serde_types()))
        raise ValueError(f"Unknown serde type {config.type!r}. Registered: {known}")
    _check_fields(config, (*kind.fields, *COMMON_FIELDS))
    return kind.build(config.kwargs)


def _check_fields(config: SerdeConfig, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(config.kwargs) - set(allowed))
    if unknown:
        raise ValueError(
            f"serde {config.type!r}: unknown field(s) {', '.join(unknown)}; "
            f"accepted: {', '.join(allowed)}"
        )
    if "max_workers" in config.kwargs and _int_field(config.kwargs, "max_workers", 1) < 1:
        raise ValueError(f"serde {config.type!r}: max_workers must be >= 1")


def serde_workers(config: SerdeConfig) -> int:
    """``max_workers`` of ``config`` (default 1)."""
    return _int_field(config.kwargs, "max_workers", 1)


def build_chunk_serde(config: SerdeConfig) -> ChunkSerde:
    """The :class:`ChunkSerde` of ``config``; ``ValueError`` for an unknown type or field,
    a bad value, an unreadable key, or stages in an order that cannot work."""
    stages = _stages(config)
    tensor = [s for s in stages if isinstance(s, TensorStage)]
    if len(tensor) > 1:
        raise ValueError("serde 'multi': at most one quantizer (fp8, asym_k16_v8)")
    if tensor and not isinstance(stages[0], TensorStage):
        raise ValueError(
            "serde 'multi': the quantizer must come first (it reads KV tensors, not bytes)"
        )
    byte_stages = [s for s in stages if isinstance(s, ByteStage)]
    return ChunkSerde(tensor[0] if tensor else None, byte_stages)
