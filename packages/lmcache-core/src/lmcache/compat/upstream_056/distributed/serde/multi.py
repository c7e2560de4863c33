"""Upstream's multi-output serde interfaces: a fixed-length group of optional objects on
one side (``None`` = slot absent), one byte buffer on the other, and adapters that make a
one-object serde a group of one.

These are upstream's extension API for serdes that handle K and V separately; the
product's ``asym_k16_v8`` splits a chunk itself and does not use them.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from lmcache.v1.storage_backend.serde.base import Deserializer, Serializer

MemoryObjGroup = tuple[Any | None, ...]
LayoutDescGroup = tuple[Any | None, ...]


def validate_group_size(group: Sequence[object], expected: int, *, role: str) -> None:
    """``ValueError`` naming ``role`` (src, dst, layout) unless ``len(group) == expected``."""
    if len(group) != expected:
        raise ValueError(
            f"MultiSerde {role} group length {len(group)} does not match expected {expected}"
        )


class MultiSerializer(abc.ABC):
    """A group of ``group_size`` optional objects into one byte buffer."""

    @property
    @abc.abstractmethod
    def group_size(self) -> int: ...

    @abc.abstractmethod
    def serialize(self, src: MemoryObjGroup, dst: Any, key: Any) -> int: ...

    @abc.abstractmethod
    def estimate_serialized_size(self, layout_descs: LayoutDescGroup) -> int: ...


class MultiDeserializer(abc.ABC):
    """One byte buffer into a group; a ``None`` destination slot is left alone."""

    @property
    @abc.abstractmethod
    def group_size(self) -> int: ...

    @abc.abstractmethod
    def deserialize(self, src: Any, dst: MemoryObjGroup, key: Any) -> None: ...


class _SingleAsMultiSerializer(MultiSerializer):
    def __init__(self, inner: Serializer) -> None:
        self._inner = inner

    @property
    def group_size(self) -> int:
        return 1

    def _only(self, group: Sequence[Any], what: str) -> Any:
        if len(group) != 1:
            raise ValueError(f"a one-object serde expects a group of size 1, got {len(group)}")
        if group[0] is None:
            raise ValueError(f"a one-object serde does not admit a None {what} slot")
        return group[0]

    def serialize(self, src: MemoryObjGroup, dst: Any, key: Any) -> int:
        return self._inner.serialize(self._only(src, "src"), dst, key)

    def estimate_serialized_size(self, layout_descs: LayoutDescGroup) -> int:
        return self._inner.estimate_serialized_size(self._only(layout_descs, "layout"))


class _SingleAsMultiDeserializer(MultiDeserializer):
    def __init__(self, inner: Deserializer) -> None:
        self._inner = inner

    @property
    def group_size(self) -> int:
        return 1

    def deserialize(self, src: Any, dst: MemoryObjGroup, key: Any) -> None:
        if len(dst) != 1:
            raise ValueError(f"a one-object serde expects a group of size 1, got {len(dst)}")
        if dst[0] is not None:  # None: the caller does not want the output
            self._inner.deserialize(src, dst[0], key)


def single_to_multi_serializer(inner: Serializer) -> MultiSerializer:
    """``inner`` as a group of one (the same bytes as calling it directly)."""
    return _SingleAsMultiSerializer(inner)


def single_to_multi_deserializer(inner: Deserializer) -> MultiDeserializer:
    """``inner`` as a group of one; a ``None`` slot is a deliberate skip."""
    return _SingleAsMultiDeserializer(inner)


__all__ = [
    "LayoutDescGroup",
    "MemoryObjGroup",
    "MultiDeserializer",
    "MultiSerializer",
    "single_to_multi_deserializer",
    "single_to_multi_serializer",
    "validate_group_size",
]
