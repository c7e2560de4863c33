"""Upstream's ``lmcache.v1.distributed.api``: the storage API's key type.

Only :class:`ObjectKey` is here, with the fields and helpers that upstream's eviction
policies and their tests use (the key's tenant is its ``cache_salt`` field).
"""

from __future__ import annotations

from dataclasses import dataclass

_SALT_FORBIDDEN_CHARS = frozenset("@/\\\x00")
_SALT_MAX_LEN = 128


@dataclass(frozen=True)
class ObjectKey:
    """One chunk (by content hash) of one KV rank of one model, per ``cache_salt``."""

    chunk_hash: bytes
    model_name: str
    kv_rank: int
    object_group_id: int = 0
    cache_salt: str = ""

    def __post_init__(self) -> None:
        if "@" in self.model_name:
            raise ValueError(f"model_name must not contain '@' (got {self.model_name!r})")
        if self.object_group_id < 0:
            raise ValueError(f"object_group_id must be >= 0 (got {self.object_group_id})")
        if _SALT_FORBIDDEN_CHARS & set(self.cache_salt) or len(self.cache_salt) > _SALT_MAX_LEN:
            raise ValueError(f"invalid cache_salt {self.cache_salt!r}")

    @staticmethod
    def IntHash2Bytes(chunk_hash: int) -> bytes:
        """A small integer as a 4-byte big-endian hash (how tests build keys)."""
        return chunk_hash.to_bytes(4, byteorder="big")

    @staticmethod
    def Bytes2IntHash(chunk_hash: bytes) -> int:
        """The inverse of :meth:`IntHash2Bytes` (truncated to 64 bits)."""
        return int.from_bytes(chunk_hash, byteorder="big") & ((1 << 64) - 1)


__all__ = ["ObjectKey"]
