"""Redis values: one chunk in the shared chunk format, staged for ``SET`` pipelines.

The format itself (prefix, checksums, JSON header, :func:`encode_value`,
:func:`decode_value`) is :mod:`lmcache.v1.storage_backend.chunk_format`, the one the disk
tier writes; this module holds what only puts to Redis need.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.storage_backend.chunk_format import (
    DecodedValue,
    decode_value,
    encode_parts,
    encode_value,
)

__all__ = ["DecodedValue", "EncodeBuffer", "decode_value", "encode_value", "put_batches"]


class EncodeBuffer(threading.local):
    """A per-thread staging buffer, reused so puts do not fault in fresh pages each time."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def encode(self, items: Sequence[tuple[CacheEngineKey, MemoryObj]]) -> list[memoryview]:
        """Values of ``items`` as views into the buffer (valid until the next call)."""
        parts = [encode_parts(key, obj) for key, obj in items]
        total = sum(len(head) + len(payload) for head, payload in parts)
        if len(self.buf) < total:
            self.buf = bytearray(total)  # a new one: the old may still be exported
        view = memoryview(self.buf)
        values = []
        offset = 0
        for head, payload in parts:
            end = offset + len(head) + len(payload)
            view[offset : offset + len(head)] = head
            view[offset + len(head) : end] = payload
            values.append(view[offset:end])
            offset = end
        return values


def put_batches(
    items: list[tuple[CacheEngineKey, MemoryObj]], max_bytes: int
) -> Iterator[list[tuple[CacheEngineKey, MemoryObj]]]:
    """``items`` in order, in pipelines of at most ``max_bytes`` value bytes (a larger
    item goes alone)."""
    batch: list[tuple[CacheEngineKey, MemoryObj]] = []
    size = 0
    for item in items:
        nbytes = item[1].get_size()
        if batch and size + nbytes > max_bytes:
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += nbytes
    if batch:
        yield batch
