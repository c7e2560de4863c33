"""Cache keys, prefix chunk hashing and size parsing shared by every storage tier.

A :class:`CacheEngineKey` names one chunk of KV cache.  Its ``chunk_hash`` is a *rolling*
hash: the hash of chunk ``i`` folds in the hash of chunk ``i - 1``, so a key identifies the
whole token prefix up to and including its chunk, and a prefix lookup can stop at the
first miss.  Hashes come from :mod:`hashlib` (never the salted builtin ``hash()``) so every
process, worker and restart computes the same keys.
"""

from __future__ import annotations

import enum
import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

TAG_PREFIX = "lmcache.tag."

_DTYPE_TO_STR: dict[torch.dtype, str] = {
    torch.half: "half",
    torch.bfloat16: "bfloat16",
    torch.float: "float",
    torch.double: "double",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.bool: "bool",
    torch.float8_e4m3fn: "fp8_e4m3",
    torch.float8_e5m2: "fp8_e5m2",
}
_STR_TO_DTYPE: dict[str, torch.dtype] = {v: k for k, v in _DTYPE_TO_STR.items()}


class EngineType(enum.Enum):
    """The serving engine a worker runs in (upstream 0.5.6 names and values); cache
    contexts receive it from ``create_cache_context``."""

    VLLM = "vllm"
    ATOM = "atom"
    SGLANG = "sglang"
    TRTLLM = "trtllm"
    MOCK = "mock"


def dtype_to_str(dtype: torch.dtype) -> str:
    """The stable short name of ``dtype`` used in key strings and on-disk headers."""
    try:
        return _DTYPE_TO_STR[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r} for a cache key") from None


def str_to_dtype(name: str) -> torch.dtype:
    """Inverse of :func:`dtype_to_str`."""
    try:
        return _STR_TO_DTYPE[name]
    except KeyError:
        raise ValueError(
            f"unknown dtype string {name!r}; expected one of {sorted(_STR_TO_DTYPE)}"
        ) from None


def _tags_from_configs(request_configs: dict[str, Any] | None) -> tuple[tuple[str, str], ...]:
    if not request_configs:
        return ()
    tags = [
        (k[len(TAG_PREFIX) :], str(v))
        for k, v in request_configs.items()
        if k.startswith(TAG_PREFIX)
    ]
    # Sorted so two requests that list the same tags in a different order share the key.
    return tuple(sorted(tags))


def _split_tag_fields(fields: Sequence[str]) -> dict[str, Any]:
    configs: dict[str, Any] = {}
    for item in fields:
        name, sep, value = item.partition("%")
        if not sep:
            raise ValueError(f"malformed tag field {item!r} (expected name%value)")
        configs[TAG_PREFIX + name] = value
    return configs


@dataclass(slots=True, frozen=True, eq=False)
class CacheEngineKey:
    """Identifies one chunk of KV cache of one worker of one model.

    Frozen and hashable; equality and hash cover model, world size, worker, chunk hash,
    dtype and the ``lmcache.tag.*`` entries of ``request_configs`` (other request configs
    ride along but do not change identity).
    """

    model_name: str
    world_size: int
    worker_id: int
    chunk_hash: int
    dtype: torch.dtype
    request_configs: dict[str, Any] | None = field(default_factory=dict)
    tags: tuple[tuple[str, str], ...] = field(init=False, repr=False)
    _dtype_str: str = field(init=False, repr=False)
    _hash: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_dtype_str", dtype_to_str(self.dtype))
        object.__setattr__(self, "tags", _tags_from_configs(self.request_configs))
        # Cached: prefix lookups hash millions of keys, and the fields never change.
        object.__setattr__(self, "_hash", hash(self._identity()))

    def _identity(self) -> tuple[Any, ...]:
        return (
            self.model_name,
            self.world_size,
            self.worker_id,
            self.chunk_hash,
            self._dtype_str,
            self.tags,
        )

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, CacheEngineKey)
        return self._hash == other._hash and self._identity() == other._identity()

    @property
    def chunk_hash_hex(self) -> str:
        return format(self.chunk_hash, "x")

    def _base_fields(self) -> list[str]:
        return [
            self.model_name,
            str(self.world_size),
            str(self.worker_id),
            self.chunk_hash_hex,
            self._dtype_str,
        ]

    def _tag_fields(self) -> list[str]:
        return [f"{name}%{value}" for name, value in self.tags]

    def to_string(self) -> str:
        """``model@world_size@worker_id@<chunk_hash hex>@<dtype>[@tag%value...]``."""
        return "@".join(self._base_fields() + self._tag_fields())

    def __str__(self) -> str:
        return self.to_string()

    def to_bytes(self) -> bytes:
        return self.to_string().encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> CacheEngineKey:
        return parse_cache_key(data.decode("utf-8"))

    @classmethod
    def from_string(cls, s: str) -> CacheEngineKey:
        fields = s.split("@")
        if len(fields) < 5:
            raise ValueError(f"malformed cache key string {s!r}")
        return CacheEngineKey(
            fields[0],
            int(fields[1]),
            int(fields[2]),
            int(fields[3], 16),
            str_to_dtype(fields[4]),
            _split_tag_fields(fields[5:]),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "__type__": type(self).__name__,
            "model_name": self.model_name,
            "world_size": self.world_size,
            "worker_id": self.worker_id,
            "chunk_hash": self.chunk_hash,
            "dtype": self._dtype_str,
            "request_configs": dict(self.request_configs or {}),
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> CacheEngineKey:
        common = (
            d["model_name"],
            int(d["world_size"]),
            int(d["worker_id"]),
            int(d["chunk_hash"]),
            str_to_dtype(d["dtype"]),
            dict(d.get("request_configs") or {}),
        )
        if d.get("__type__") == "LayerCacheEngineKey":
            return LayerCacheEngineKey(*common, layer_id=int(d["layer_id"]))
        return CacheEngineKey(*common)

    def with_new_worker_id(self, worker_id: int) -> CacheEngineKey:
        return CacheEngineKey(
            self.model_name,
            self.world_size,
            worker_id,
            self.chunk_hash,
            self.dtype,
            self.request_configs,
        )

    def split_layers(self, num_layers: int) -> list[LayerCacheEngineKey]:
        """One key per layer, for layer-wise storage."""
        return [
            LayerCacheEngineKey(
                self.model_name,
                self.world_size,
                self.worker_id,
                self.chunk_hash,
                self.dtype,
                self.request_configs,
                layer_id=layer,
            )
            for layer in range(num_layers)
        ]

    def get_first_layer(self) -> LayerCacheEngineKey:
        return self.split_layers(1)[0]


@dataclass(slots=True, frozen=True, eq=False)
class LayerCacheEngineKey(CacheEngineKey):
    """A :class:`CacheEngineKey` for one layer; ``layer_id`` is the sixth string field."""

    layer_id: int = 0

    def _identity(self) -> tuple[Any, ...]:
        return (*CacheEngineKey._identity(self), self.layer_id)

    def to_string(self) -> str:
        return "@".join([*self._base_fields(), str(self.layer_id), *self._tag_fields()])

    def __str__(self) -> str:
        return self.to_string()

    @classmethod
    def from_string(cls, s: str) -> LayerCacheEngineKey:
        fields = s.split("@")
        if len(fields) < 6:
            raise ValueError(f"malformed layer cache key string {s!r}")
        return LayerCacheEngineKey(
            fields[0],
            int(fields[1]),
            int(fields[2]),
            int(fields[3], 16),
            str_to_dtype(fields[4]),
            _split_tag_fields(fields[6:]),
            layer_id=int(fields[5]),
        )

    def to_dict(self) -> dict[str, Any]:
        d = CacheEngineKey.to_dict(self)
        d["layer_id"] = self.layer_id
        return d


def parse_cache_key(s: str) -> CacheEngineKey:
    """Parse either key form: a sixth field without ``%`` is a layer id."""
    fields = s.split("@")
    if len(fields) >= 6 and "%" not in fields[5]:
        return LayerCacheEngineKey.from_string(s)
    return CacheEngineKey.from_string(s)


# ---------------------------------------------------------------------------------------
# Rolling prefix hashes
# ---------------------------------------------------------------------------------------

NONE_HASH = 0


def _as_int64_array(token_ids: Sequence[int] | np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(token_ids, torch.Tensor):
        return token_ids.detach().to("cpu", torch.int64).contiguous().numpy()
    return np.ascontiguousarray(np.asarray(token_ids, dtype=np.int64))


def hash_chunk(prefix_hash: int, tokens: np.ndarray) -> int:
    """Hash of one chunk chained on the hash of everything before it (64-bit, unsigned)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(prefix_hash.to_bytes(8, "little", signed=False))
    h.update(tokens.astype("<i8", copy=False).tobytes())
    return int.from_bytes(h.digest(), "little")


def chunk_hashes(
    token_ids: Sequence[int] | np.ndarray | torch.Tensor,
    chunk_size: int = 256,
    save_unfull_chunk: bool = True,
    prefix_hash: int = NONE_HASH,
) -> list[int]:
    """Rolling prefix hashes, one per chunk of ``chunk_size`` tokens.

    Deterministic across processes.  A trailing partial chunk gets a hash only when
    ``save_unfull_chunk`` is true.  ``prefix_hash`` continues a chain computed earlier.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    tokens = _as_int64_array(token_ids)
    hashes: list[int] = []
    current = prefix_hash
    for start in range(0, len(tokens), chunk_size):
        chunk = tokens[start : start + chunk_size]
        if len(chunk) < chunk_size and not save_unfull_chunk:
            break
        current = hash_chunk(current, chunk)
        hashes.append(current)
    return hashes


def chunk_keys(
    token_ids: Sequence[int] | np.ndarray | torch.Tensor,
    model_name: str,
    world_size: int,
    worker_id: int,
    dtype: torch.dtype,
    chunk_size: int = 256,
    save_unfull_chunk: bool = True,
    request_configs: dict[str, Any] | None = None,
) -> list[CacheEngineKey]:
    """One :class:`CacheEngineKey` per chunk of ``token_ids`` (prefix order)."""
    return [
        CacheEngineKey(model_name, world_size, worker_id, h, dtype, request_configs or {})
        for h in chunk_hashes(token_ids, chunk_size, save_unfull_chunk)
    ]


# ---------------------------------------------------------------------------------------
# Sizes
# ---------------------------------------------------------------------------------------

# Decimal-looking suffixes are binary on purpose: upstream's plain numbers mean GiB
# (``max_local_cpu_size: 5`` is 5 * 1024**3), so "5GB" must mean the same thing.
_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1024**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1024**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: str | int | float, default_unit: str = "B") -> int:
    """Bytes in ``value``: ``"10GB"``, ``"512MiB"``, ``"1.5g"``, or a bare number.

    A bare number (or a string without a unit) is read in ``default_unit``.  All units are
    powers of 1024.  Raises :class:`ValueError` for negative or malformed sizes.
    """
    unit_scale = _SIZE_UNITS.get(default_unit.strip().lower())
    if unit_scale is None:
        raise ValueError(f"unknown default unit {default_unit!r}")
    if isinstance(value, bool):
        raise ValueError(f"invalid size {value!r}")
    if isinstance(value, int | float):
        number, scale = float(value), unit_scale
    else:
        match = _SIZE_RE.match(str(value))
        if match is None:
            raise ValueError(f"invalid size {value!r} (examples: 10GB, 512MiB, 1.5)")
        number = float(match.group(1))
        suffix = match.group(2).lower()
        if suffix not in _SIZE_UNITS:
            raise ValueError(f"invalid size unit in {value!r}; use B, KB, MB, GB, TB or KiB..TiB")
        scale = _SIZE_UNITS[suffix] if suffix else unit_scale
    if number < 0 or number != number:
        raise ValueError(f"size must be non-negative, got {value!r}")
    return int(number * scale)


def iter_chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    """Consecutive slices of ``items`` of at most ``size`` elements."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def process_is_running(pid: int) -> bool:
    """``pid`` exists and is not a zombie (exited, not yet reaped by its parent).

    A live process of another user (``PermissionError``) counts as running.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True
