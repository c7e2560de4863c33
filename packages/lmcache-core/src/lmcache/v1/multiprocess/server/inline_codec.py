"""The inline sub-path's chunk codecs: chunk bytes inside the messages.

Used by engine-driven workers when the server has no shared memory.

* **Framed** (``commit_store_frames`` / ``retrieve_frames``): each chunk is its own ZMQ
  frame.  Received frames are copied once, straight into the L1 objects; replies are views
  of the L1 objects themselves, sent zero-copy and pinned until ZeroMQ has sent them.
* **msgpack** (``commit_store`` ``data`` / ``prepare_retrieve`` ``data``): an
  :class:`~lmcache.v1.multiprocess.wire.custom_types.InlineChunks` struct, kept for
  workers of earlier lmcache-core versions.  Never a pickle: pickled data (upstream
  LMCache's pickle sub-path) is refused by its first byte.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np
import torch

from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.multiprocess.wire.custom_types import InlineChunks
from lmcache.v1.multiprocess.wire.protocol import ErrorCode, ProtocolError

# Every pickle protocol >= 2 starts with the PROTO opcode.
_PICKLE_PROTO = b"\x80"


def fill_inline(objs: list[MemoryObj], indices: list[int], data: bytes, nbytes: int) -> None:
    """Copy ``commit_store``'s inline ``data`` into the prepared ``objs`` (``nbytes`` each);
    raises ``ProtocolError`` unless it holds exactly the chunks ``indices`` prepared."""
    if data[:1] == _PICKLE_PROTO:
        raise ProtocolError(
            ErrorCode.BAD_PAYLOAD,
            "pickled commit_store data is refused (lmcache-core never unpickles; upstream "
            "LMCache's pickle sub-path is unsupported): use the SHM sub-path or "
            "lmcache-core's inline format",
        )
    try:
        chunks = msgspec.msgpack.decode(data, type=InlineChunks)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(ErrorCode.BAD_PAYLOAD, f"bad inline chunk data: {exc}") from None
    if chunks.chunk_indices != indices or len(chunks.chunks) != len(objs):
        raise ProtocolError(
            ErrorCode.BAD_PAYLOAD,
            f"inline data holds chunks {chunks.chunk_indices}, prepare_store asked for {indices}",
        )
    for raw, obj in zip(chunks.chunks, objs):
        if len(raw) != nbytes:
            raise ProtocolError(
                ErrorCode.SHAPE_MISMATCH,
                f"inline chunk has {len(raw)} bytes, expected {nbytes}",
            )
        target = obj.raw_tensor
        assert target is not None
        target[:nbytes].copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))


def encode_inline(objs: list[MemoryObj], indices: list[int], nbytes: int) -> bytes:
    """``prepare_retrieve``'s inline data: the first ``nbytes`` of each object."""
    chunks = []
    for obj in objs:
        raw = obj.raw_tensor
        assert raw is not None
        chunks.append(raw[:nbytes].numpy().tobytes())
    return msgspec.msgpack.encode(InlineChunks(chunk_indices=indices, chunks=chunks))


def fill_frames(
    objs: list[MemoryObj],
    indices: list[int],
    sent_indices: list[int],
    frames: Sequence[memoryview],
    nbytes: int,
) -> None:
    """Copy ``commit_store_frames``' data frames straight into the prepared ``objs``;
    raises ``ProtocolError`` unless they are exactly the chunks ``indices`` prepared,
    ``nbytes`` each (checked before any byte is copied)."""
    if sent_indices != indices or len(frames) != len(objs):
        raise ProtocolError(
            ErrorCode.BAD_PAYLOAD,
            f"commit_store_frames sent chunks {sent_indices} in {len(frames)} frames, "
            f"prepare_store asked for {indices}",
        )
    for frame in frames:
        if frame.nbytes != nbytes:
            raise ProtocolError(
                ErrorCode.SHAPE_MISMATCH,
                f"a chunk frame has {frame.nbytes} bytes, expected {nbytes}",
            )
    for frame, obj in zip(frames, objs):
        target = obj.raw_tensor
        assert target is not None
        target[:nbytes].copy_(torch.frombuffer(frame, dtype=torch.uint8))


class _PinnedView(np.ndarray):  # type: ignore[type-arg]
    """A view of L1 memory that keeps its objects pinned while ZeroMQ holds it."""

    pin: _Pin | None = None


class _Pin:
    """Releases L1 objects once every frame viewing them is gone (sent or dropped)."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release
        self._lock = threading.Lock()

    def __del__(self) -> None:
        # Runs in whichever thread drops the last frame (pyzmq's reference-release thread
        # once the bytes are on the wire); MemoryObj.ref_count_down is thread-safe.
        with self._lock:
            release, self._release = self._release, None
        if release is not None:
            release()


def pinned_frames(objs: list[MemoryObj], nbytes: int, release: Callable[[], None]) -> list[Any]:
    """Zero-copy frames of the first ``nbytes`` of each object; ``release`` runs when the
    last of them is freed, so the objects cannot be evicted or reused while in flight."""
    return pinned_sized_frames(objs, [nbytes] * len(objs), release)


def pinned_sized_frames(
    objs: Sequence[MemoryObj], sizes: Sequence[int], release: Callable[[], None]
) -> list[Any]:
    """:func:`pinned_frames` with a byte count per object (objects of different sizes)."""
    pin = _Pin(release)
    frames = []
    for obj, nbytes in zip(objs, sizes, strict=True):
        raw = obj.raw_tensor
        assert raw is not None
        view = raw[:nbytes].numpy().view(_PinnedView)
        view.pin = pin
        frames.append(view)
    return frames
