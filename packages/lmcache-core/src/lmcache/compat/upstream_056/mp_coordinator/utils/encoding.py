"""Upstream's key encoding for checkpoints: an ``ObjectKey`` as a flat tuple of its fields."""

from __future__ import annotations

from typing import Any

from lmcache.compat.upstream_056.distributed.api import ObjectKey

EncodedKey = tuple[bytes, str, int, int, str]


def encode_key(key: Any) -> EncodedKey:
    """The key's fields in declaration order."""
    return (key.chunk_hash, key.model_name, key.kv_rank, key.object_group_id, key.cache_salt)


def decode_key(encoded: object) -> ObjectKey:
    """The key :func:`encode_key` flattened (any 5-item sequence; checked by ObjectKey)."""
    chunk_hash, model_name, kv_rank, object_group_id, cache_salt = encoded  # type: ignore[misc]
    return ObjectKey(
        chunk_hash=chunk_hash,
        model_name=model_name,
        kv_rank=kv_rank,
        object_group_id=object_group_id,
        cache_salt=cache_salt,
    )


__all__ = ["EncodedKey", "decode_key", "encode_key"]
