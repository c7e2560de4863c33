"""Upstream's key encoding for checkpoints: an ``ObjectKey`` as a flat tuple of its fields.

Upstream keeps it in ``lmcache.v1.mp_coordinator.utils.encoding`` (that path re-exports
this module); the eviction policies' ``capture``/``restore`` use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from lmcache.compat.upstream_056.distributed.api import ObjectKey

EncodedKey = tuple[bytes, str, int, int, str]


def encode_key(key: Any) -> EncodedKey:
    """The key's fields in declaration order."""
    return (key.chunk_hash, key.model_name, key.kv_rank, key.object_group_id, key.cache_salt)


def decode_key(encoded: object) -> ObjectKey:
    """The key :func:`encode_key` flattened (any 5-item sequence; checked by ObjectKey)."""
    fields = cast("EncodedKey", tuple(cast("Iterable[Any]", encoded)))
    return ObjectKey(
        chunk_hash=fields[0],
        model_name=fields[1],
        kv_rank=fields[2],
        object_group_id=fields[3],
        cache_salt=fields[4],
    )


__all__ = ["EncodedKey", "decode_key", "encode_key"]
