"""The value types of the L2 adapter interface, with upstream LMCache 0.5.6's names.

An :class:`~lmcache.v1.storage_backend.l2_adapters.base.L2AdapterInterface` speaks in
:class:`ObjectKey` (one chunk of one KV rank of one model, per ``cache_salt``), reports a
store as an :class:`L2StoreResult`, tells :class:`L2AdapterListener` s what it stored,
served and deleted, and may list its keys in :class:`KeyListPage` s.  Upstream keeps these
in ``lmcache.v1.distributed.api`` / ``internal_api``; those paths re-export them.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch

_SALT_FORBIDDEN_CHARS = frozenset("@/\\\x00")
_SALT_MAX_LEN = 128
_INT_HASH_BYTES = 4


@dataclass(frozen=True)
class ObjectKey:
    """One stored object: a chunk (by content hash) of one KV rank of one model.

    ``model_name`` and ``cache_salt`` must not contain ``@`` (adapters join key fields with
    it); the salt must not contain a path separator or NUL either (file adapters put it in
    file names) and is at most 128 characters.  ``cache_salt`` "" is the unsalted tenant.
    """

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
        bad = _SALT_FORBIDDEN_CHARS & set(self.cache_salt)
        if bad:
            raise ValueError(f"cache_salt must not contain {bad!r} (got {self.cache_salt!r})")
        if len(self.cache_salt) > _SALT_MAX_LEN:
            raise ValueError(
                f"cache_salt exceeds max length {_SALT_MAX_LEN} (got {len(self.cache_salt)})"
            )

    def to_encoded_object_key(self) -> EncodedObjectKey:
        """The JSON-safe form (hash as hex)."""
        return EncodedObjectKey(
            chunk_hash_hex=self.chunk_hash.hex(),
            model_name=self.model_name,
            kv_rank=self.kv_rank,
            object_group_id=self.object_group_id,
            cache_salt=self.cache_salt,
        )

    @staticmethod
    def IntHash2Bytes(chunk_hash: int) -> bytes:
        """A small integer as a 4-byte big-endian hash (tests and examples build keys so)."""
        return chunk_hash.to_bytes(_INT_HASH_BYTES, byteorder="big")

    @staticmethod
    def Bytes2IntHash(chunk_hash: bytes) -> int:
        """The inverse of :meth:`IntHash2Bytes`, truncated to 64 bits."""
        return int.from_bytes(chunk_hash, byteorder="big") & ((1 << 64) - 1)

    @staticmethod
    def ComputeKVRank(
        world_size: int, global_rank: int, local_world_size: int, local_rank: int
    ) -> int:
        """The rank field of a key: the four numbers packed into one byte each (so keys of
        different parallel set-ups never collide)."""
        return (world_size << 24) | (global_rank << 16) | (local_world_size << 8) | local_rank

    @staticmethod
    def WorldSizeFromKVRank(kv_rank: int) -> int:
        """The world size :meth:`ComputeKVRank` packed into ``kv_rank``."""
        return (kv_rank >> 24) & 0xFF


@dataclass(frozen=True)
class EncodedObjectKey:
    """:class:`ObjectKey` with its hash as hex (JSON-safe)."""

    chunk_hash_hex: str
    model_name: str
    kv_rank: int
    object_group_id: int = 0
    cache_salt: str = ""

    def to_object_key(self) -> ObjectKey:
        """The key back; ``ValueError`` for bad hex or a field the key refuses."""
        return ObjectKey(
            chunk_hash=bytes.fromhex(self.chunk_hash_hex),
            model_name=self.model_name,
            kv_rank=self.kv_rank,
            object_group_id=self.object_group_id,
            cache_salt=self.cache_salt,
        )


@dataclass(frozen=True)
class KeyEntry:
    """One listed key and the size of its object."""

    key: EncodedObjectKey
    size_bytes: int


@dataclass(frozen=True)
class KeyListPage:
    """One page of ``L2AdapterInterface.list_l2_keys``; ``next_page_token`` None on the last."""

    entries: tuple[KeyEntry, ...]
    next_page_token: str | None


@dataclass(frozen=True)
class MemoryLayoutDesc:
    """The shapes and dtypes of the parts of a memory object (one dtype per shape)."""

    shapes: list[torch.Size]
    dtypes: list[torch.dtype]

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.dtypes):
            raise ValueError("MemoryLayoutDesc: shapes and dtype must have the same length")


@dataclass(frozen=True)
class L1MemoryDesc:
    """The L1 arena, for adapters that register it with an external transport (RDMA).

    ``stable_registration_size`` is the part of a lazily grown arena that is already
    pinned (None: not exposed).  This server's tiers never pass one (``None``).
    """

    ptr: int
    size: int
    align_bytes: int
    stable_registration_size: int | None = None


class L2StoreResult(int):
    """A finished store task: bytes written (``>= 0``) on success, ``-1`` on failure."""

    def __new__(cls, success: bool, bytes_transferred: int) -> L2StoreResult:
        if bytes_transferred < 0:
            raise ValueError(f"bytes_transferred must be >= 0, got {bytes_transferred}")
        return super().__new__(cls, bytes_transferred if success else -1)

    def is_successful(self) -> bool:
        return int(self) >= 0

    def bytes_transferred(self) -> int:
        """Bytes written; 0 for a failed task."""
        return max(int(self), 0)


class EventListener(abc.ABC):  # noqa: B024 - a marker base, as upstream's
    """Base of the listeners storage components notify."""


class L2AdapterListener(EventListener):
    """Told what an adapter stored, served and deleted (eviction policies, quotas, the
    bridge's key index)."""

    @abc.abstractmethod
    def on_l2_keys_stored(self, keys: list[ObjectKey], sizes: list[int]) -> None:
        """``keys`` (``sizes[i]`` bytes each) are now stored."""

    @abc.abstractmethod
    def on_l2_keys_accessed(self, keys: list[ObjectKey]) -> None:
        """``keys`` were loaded (a hit)."""

    @abc.abstractmethod
    def on_l2_keys_deleted(self, keys: list[ObjectKey]) -> None:
        """``keys`` are gone (deleted or evicted)."""
